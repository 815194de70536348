"""The demo lane's side in the tests: `make test` runs one `make demo` as a lane of its own
(tests/demo_lane) and the `demo_home` fixture (tests/integration/conftest.py) waits for it here."""

import time
from pathlib import Path


def wait_for_demo_lane(run: Path, timeout_s: float = 3600) -> Path:
    """The home of tests/demo_lane's `make demo` in `run`, once it has exited 0."""
    log = run / "demo.log"
    started = time.monotonic()
    deadline = started + timeout_s
    while not (run / "exit").exists():
        pid = int((run / "pid").read_text()) if (run / "pid").exists() else None
        # a lane gets 60 s to write its PID (the lanes start together)
        alive = Path(f"/proc/{pid}").exists() if pid is not None else time.monotonic() - started < 60
        assert alive or (run / "exit").exists(), \
            f"the demo lane (tests/demo_lane, PID {pid}) ended without an exit status; its log {log}:\n" \
            + (log.read_text()[-4000:] if log.exists() else "(none)")
        assert time.monotonic() < deadline, f"the demo lane's make demo still runs after {timeout_s:.0f} s; log {log}"
        time.sleep(2)
    code = (run / "exit").read_text().strip()
    assert code == "0", f"make demo (the demo lane) exited {code}; its log {log}:\n{log.read_text()[-4000:]}"
    return run / "factory"
