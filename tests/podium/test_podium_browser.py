"""Podium in a real browser: Debian's Chromium, driven by Selenium through chromedriver.

The app runs under uvicorn on a loopback port, generating with the session's two real exports
in-process. One of them is wrapped so that its output starts with script and HTML: the page must
show it as text. Screenshots of every page land in test-artifacts/podium/ at the repository root.
"""

import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
import uvicorn

from factory.podium.app import create_app
from factory.podium.inference import LocalBackend
from factory.podium.models import list_models
from factory.podium.store import CONVERSATIONS

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "podium"
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\"><b id=bold>bold</b> "
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


class HostileBackend(LocalBackend):
    """The real in-process backend; export evalsmoke@4's text starts with markup and a script, sent
    half a second before the model's own text (so the page has visibly streamed)."""

    def stream(self, export, messages, sampling, out=None):
        pieces = super().stream(export, messages, sampling, out)
        if export.export_id == "export/evalsmoke@4":
            if out is not None:
                out.text += HOSTILE
            yield HOSTILE
            time.sleep(0.5)  # the page must show this before the model's text arrives, however busy the host
        yield from pieces


class Served:
    def __init__(self, app, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("chromium and chromedriver are needed (apt: chromium chromium-driver; `make setup` installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(driver, condition, timeout=60, what=""):
    """`condition(driver)` once truthy; an element that a page load replaced while it was read (stale,
    or not there yet) is read again at the next poll."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)) \
        .until(lambda d: condition(d), message=what)


def shot(driver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def test_chat_battle_vote_leaderboard_and_datasets_in_chromium(podium_lake, podium_config, browser, free_port):
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()  # the screenshots below are this run's
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    config = podium_config()
    served = Served(create_app(config, podium_lake, HostileBackend()), free_port)
    try:
        b = browser
        b.get(f"{served.url}/models")
        assert "not signed in" in b.find_element(By.ID, "error").text
        b.get(f"{served.url}/login?token=tok-alice")
        assert b.find_element(By.ID, "user").text == "alice"
        listed = {e.get_attribute("data-export") for e in b.find_elements(By.CSS_SELECTOR, "#models tbody tr")}
        assert {"export/evalsmoke@4", "export/evalsmoke@8"} <= listed
        shot(b, "models")

        # chat with the hostile-wrapped export: text streams in, markup stays text
        b.get(f"{served.url}/chat?export=export/evalsmoke@4")
        b.find_element(By.ID, "max_tokens").clear()
        b.find_element(By.ID, "max_tokens").send_keys("24")
        b.find_element(By.ID, "prompt").send_keys("def fibonacci(n):")
        b.find_element(By.ID, "send").click()
        answer = wait_for(b, lambda d: d.find_elements(By.CSS_SELECTOR, ".turn.assistant[data-done]"), what="chat")[0]
        assert int(answer.get_attribute("data-chunks")) > 1  # it arrived piece by piece
        assert answer.text.startswith("<script>document.title='pwned'</script>") and len(answer.text) > len(HOSTILE)
        assert b.title != "pwned" and b.find_elements(By.ID, "bold") == [] and b.find_elements(By.CSS_SELECTOR,
                                                                                              ".turn img") == []
        shot(b, "chat")

        # a battle: two anonymous answers, a vote, the names revealed, the leaderboard moves
        b.get(f"{served.url}/leaderboard")
        before = {r.get_attribute("data-export"): int(r.find_element(By.CSS_SELECTOR, ".votes").text)
                  for r in b.find_elements(By.CSS_SELECTOR, "#leaderboard tbody tr")}
        b.get(f"{served.url}/battle")
        b.find_element(By.ID, "battle-prompt").send_keys("import os\n")
        b.find_element(By.ID, "max_tokens").clear()
        b.find_element(By.ID, "max_tokens").send_keys("16")
        b.find_element(By.ID, "fight").click()
        wait_for(b, lambda d: d.find_element(By.ID, "votes").is_displayed(), what="battle")
        sides = [b.find_element(By.ID, f"side-{s}").text for s in "AB"]
        assert all(sides) and b.find_element(By.ID, "name-A").text == ""  # anonymous until the vote
        shot(b, "battle")
        b.find_element(By.ID, "vote-a").click()
        wait_for(b, lambda d: d.find_element(By.ID, "name-A").text, what="reveal")
        names = {b.find_element(By.ID, f"name-{s}").text for s in "AB"}
        # two of the lake's exports: the session's lake holds evalsmoke@4 and @8, and more when a test
        # before this one on the same worker exported into it (test_sft_serve's sft-chat@30)
        listed = {m.export_id for m in list_models(podium_lake)}
        assert len(names) == 2 and names <= listed and {"export/evalsmoke@4", "export/evalsmoke@8"} <= listed, names
        assert b.title != "pwned"
        shot(b, "battle-revealed")
        b.get(f"{served.url}/leaderboard")
        after = {r.get_attribute("data-export"): int(r.find_element(By.CSS_SELECTOR, ".votes").text)
                 for r in b.find_elements(By.CSS_SELECTOR, "#leaderboard tbody tr")}
        assert {e: after[e] - before.get(e, 0) for e in names} == {e: 1 for e in names}
        assert b.find_elements(By.CSS_SELECTOR, "#winrate tbody tr")
        shot(b, "leaderboard")

        # the dataset browser: podium's own conversations, filtered to battles; the hostile text is text
        b.get(f"{served.url}/datasets")
        b.find_element(By.LINK_TEXT, CONVERSATIONS).click()
        Select(b.find_element(By.CSS_SELECTOR, ".column")).select_by_visible_text("kind")
        b.find_element(By.CSS_SELECTOR, ".value").send_keys("battle")
        b.find_element(By.ID, "apply").click()
        wait_for(b, lambda d: "where kind = battle" in d.find_element(By.ID, "page-info").text, what="filter")
        table_rows = b.find_elements(By.CSS_SELECTOR, "#rows tbody tr")
        kind_col = [h.text for h in b.find_elements(By.CSS_SELECTOR, "#rows thead th")].index("kind")
        assert table_rows and {r.find_elements(By.TAG_NAME, "td")[kind_col].text for r in table_rows} == {"battle"}
        # this test's battle rows (the session's lake also holds other Podium tests' battles, first
        # when they ran before this one): filtered by its prompt too, the hostile answer shows as text
        b.get(f"{served.url}/datasets/{CONVERSATIONS}?" + urlencode([("column", "kind"), ("value", "battle"),
                                                                      ("column", "prompt"), ("value", "import os\n")]))
        assert "<script>document.title='pwned'</script>" in b.find_element(By.ID, "rows").text
        assert b.title != "pwned" and b.find_elements(By.ID, "bold") == []
        shot(b, "datasets-filtered")
    finally:
        served.stop()
    # the stored response is the exact text, markup and all
    stored = [r for r in podium_lake.table(CONVERSATIONS).scan().to_arrow().to_pylist()
              if r["user"] == "alice" and r["export_id"] == "export/evalsmoke@4" and r["kind"] == "chat"]
    assert any(r["response"].startswith(HOSTILE) for r in stored)
    assert {p.name for p in ARTIFACTS.glob("*.png")} >= {"models.png", "chat.png", "battle.png", "battle-revealed.png",
                                                        "leaderboard.png", "datasets-filtered.png"}
