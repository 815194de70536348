"""`factory podium` as a user starts it: a process on loopback that prints each user's sign-in link."""

import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

FACTORY = Path(sys.executable).with_name("factory")


def test_factory_podium_serves_on_loopback_and_signs_in_by_link(podium_lake, server, wait_up, free_port, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tok-dora": "dora"}))
    log = tmp_path / "podium.log"
    proc = server("podium", [str(FACTORY), "podium", "--home", str(podium_lake.home), "--port", str(free_port),
                             "--tokens-file", str(tokens), "--backend", "local"],
                  {**os.environ, "FACTORY_HOME": str(podium_lake.home)})
    url = f"http://127.0.0.1:{free_port}"

    def up():
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2)
        except urllib.error.HTTPError as e:
            return e.code  # 401 until signed in: it is up
        return 200

    assert wait_up(up, proc, log, 120, "factory podium", errors=OSError) == 401
    link = re.search(r"podium for dora: (\S+)", log.read_text()).group(1)
    assert link == f"{url}/login?token=tok-dora"
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    page = opener.open(link, timeout=10).read().decode()
    assert 'id="user">dora<' in page and "export/evalsmoke@8" in page


def test_a_bad_podium_setting_exits_2_naming_it(podium_lake, tmp_path):
    import subprocess

    missing = tmp_path / "none.json"
    done = subprocess.run([str(FACTORY), "podium", "--home", str(podium_lake.home), "--tokens-file", str(missing),
                           "--backend", "local"], capture_output=True, text=True, timeout=120)
    said = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
    assert done.returncode == 2 and f"tokens_file {missing}: does not exist" in said
