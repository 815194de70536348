"""`factory podium` as a user starts it: a process on loopback that prints each user's sign-in link.
Several clients battle and vote at once over real HTTP; the process is stopped by PID and started
again, and the votes are all there (a second vote on one of them is still refused)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from factory.podium.store import VOTES

FACTORY = Path(sys.executable).with_name("factory")
USERS = {"tok-dora": "dora", "tok-erin": "erin", "tok-fred": "fred"}


class Browserless:
    """One signed-in user over HTTP: a cookie jar and the CSRF token of its pages."""

    def __init__(self, link: str):
        self.base = link.split("/login")[0]
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        self.models = self.opener.open(link, timeout=10).read().decode()
        battle = self.opener.open(f"{self.base}/battle", timeout=10).read().decode()
        self.csrf = re.search(r'name="csrf-token" content="([^"]+)"', battle).group(1)

    def post(self, path: str, body: dict | None = None) -> tuple[int, str]:
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body or {}).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-CSRF-Token": self.csrf})
        try:
            with self.opener.open(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def start(server, wait_up, lake, tokens: Path, port: int, log: Path, name: str) -> tuple[subprocess.Popen, dict]:
    proc = server(name, [str(FACTORY), "podium", "--home", str(lake.home), "--port", str(port),
                         "--tokens-file", str(tokens), "--backend", "local"], {**os.environ, "FACTORY_HOME": str(lake.home)})

    def up():
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=2)
        except urllib.error.HTTPError as e:
            return e.code  # 401 until signed in: it is up
        return 200

    assert wait_up(up, proc, log, 120, "factory podium", errors=OSError) == 401
    return proc, dict(re.findall(r"podium for (\w+): (\S+)", log.read_text()))


@pytest.mark.loopback
def test_factory_podium_serves_on_loopback_and_signs_in_by_link(podium_lake, server, wait_up, free_port, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(USERS))
    proc, links = start(server, wait_up, podium_lake, tokens, free_port, tmp_path / "podium.log", "podium")
    assert links == {user: f"http://127.0.0.1:{free_port}/login?token={t}" for t, user in USERS.items()}
    clients = [Browserless(links[user]) for user in USERS.values()]
    assert 'id="user">dora<' in clients[0].models and "export/evalsmoke@8" in clients[0].models

    battles = []
    for client in clients:
        status, body = client.post("/api/battle", {"prompt": "def main():", "sampling": {"max_tokens": 2}})
        assert status == 200, body
        battle = json.loads(body)["battle_id"]
        assert [client.post(f"/api/battle/{battle}/{side}")[0] for side in "AB"] == [200, 200]
        battles.append((client, battle))
    before = podium_lake.table(VOTES).scan().to_arrow().num_rows
    answers = {}
    threads = [threading.Thread(target=lambda c=c, b=b: answers.__setitem__(b, c.post(f"/api/battle/{b}/vote",
                                                                                     {"vote": "tie"})))
               for c, b in battles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [answers[b][0] for _, b in battles] == [200, 200, 200], answers

    os.kill(proc.pid, signal.SIGTERM)  # stopped by PID; the next start reads the tables afresh
    assert proc.wait(30) is not None
    _, links = start(server, wait_up, podium_lake, tokens, free_port, tmp_path / "podium2.log", "podium2")
    stored = {r["battle_id"]: r["vote"] for r in podium_lake.table(VOTES).scan().to_arrow().to_pylist()}
    assert podium_lake.table(VOTES).scan().to_arrow().num_rows == before + 3
    assert all(stored[b] == "tie" for _, b in battles)
    again = Browserless(links["dora"]).post(f"/api/battle/{battles[0][1]}/vote", {"vote": "a"})
    assert again[0] == 409 and "already voted (tie)" in again[1]


def test_a_bad_podium_setting_exits_2_naming_it(podium_lake, tmp_path):
    missing = tmp_path / "none.json"
    done = subprocess.run([str(FACTORY), "podium", "--home", str(podium_lake.home), "--tokens-file", str(missing),
                           "--backend", "local"], capture_output=True, text=True, timeout=120)
    said = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
    assert done.returncode == 2 and f"tokens_file {missing}: does not exist" in said
