"""PostgreSQL on loopback for the Dagster instance: Debian's server in a data directory of its own.

`start_postgres(data_dir, port=..., password=...)` runs `initdb` when the directory is new, starts
`postgres` listening only on 127.0.0.1 (its Unix socket inside the data directory, so it never
meets a system cluster's /var/run/postgresql), waits until it takes a connection, and makes the
login role and database Dagster uses. It returns the `Server`, stopped by PID like every other
loopback server (`Server.stop()`, or `stop_pid` from `make cluster-down`): SIGTERM to the process
group ends the backends and the postmaster's smart shutdown then finishes at once.

PostgreSQL refuses to run as root. Run as root, both programs are started as the `postgres`
system user (the one Debian's package creates) with `setpriv`, which execs in place, so the PID
recorded is the postmaster's own; the data directory is handed to that user, and every directory
above it must let that user through (pytest's 0700 `tmp_path` does not: use a directory under
/tmp). The superuser `postgres` may connect only through the socket (trust: only processes on
this machine that can reach the data directory); the Dagster role logs in over TCP with a
password (scram-sha-256).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
from pathlib import Path

from factory.deploy.servers import Server, ServerError

SYSTEM_USER = "postgres"
SUPERUSER = "postgres"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")


def postgres_bindir() -> Path:
    """The newest Debian PostgreSQL's bin directory (/usr/lib/postgresql/<ver>/bin), else PATH's."""
    versions = sorted((p for p in DEBIAN_BINARIES.glob("*/bin") if (p / "initdb").exists()),
                      key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    if versions:
        return versions[-1]
    if found := shutil.which("initdb"):
        return Path(found).parent
    raise ServerError(f"PostgreSQL is not installed: no {DEBIAN_BINARIES}/<version>/bin/initdb and no initdb on "
                      "PATH (`make system` installs the Debian package postgresql)")


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that drops root to the postgres system user (none when not root)."""
    if os.geteuid() != 0:
        return [], None
    try:
        user = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ServerError(f"running as root, PostgreSQL needs the system user {SYSTEM_USER!r} (created by the Debian "
                          "package postgresql), which does not exist") from None
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"], user


def _check_reachable(data_dir: Path, user: pwd.struct_passwd) -> None:
    """Fail early, naming the directory, when the postgres user cannot walk down to `data_dir`."""
    groups = {g for g in os.getgrouplist(user.pw_name, user.pw_gid)}
    for parent in reversed(data_dir.parents):
        st = parent.stat()
        ok = (st.st_uid == user.pw_uid and st.st_mode & stat.S_IXUSR) or \
             (st.st_gid in groups and st.st_mode & stat.S_IXGRP) or st.st_mode & stat.S_IXOTH
        if not ok:
            raise ServerError(f"data directory {data_dir}: the {user.pw_name} user PostgreSQL runs as cannot enter "
                              f"{parent} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); put the "
                              "data directory under a directory it may traverse, e.g. /tmp")


def _initdb(bindir: Path, data_dir: Path, prefix: list[str], log_path: Path) -> None:
    done = subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data_dir), "-U", SUPERUSER, "-E", "UTF8",
                           "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    with open(log_path, "a") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode:
        raise ServerError(f"initdb {data_dir} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-2000:]}")


def _superuser(data_dir: Path, port: int):
    import psycopg2  # brought by dagster-postgres

    return psycopg2.connect(host=str(data_dir), port=port, user=SUPERUSER, dbname="postgres", connect_timeout=3)


def _answers(data_dir: Path, port: int) -> bool:
    _superuser(data_dir, port).close()
    return True


def _ensure_role_and_db(data_dir: Path, port: int, user: str, password: str, db: str) -> None:
    """The login role `user` (its password set to `password` every start) owning database `db`."""
    from psycopg2 import sql

    conn = _superuser(data_dir, port)
    conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
            verb = "ALTER" if cur.fetchone() else "CREATE"
            cur.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(user)), (password,))
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if not cur.fetchone():
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(user)))
    finally:
        conn.close()


def start_postgres(data_dir: Path | str, *, port: int, password: str, user: str = "dagster", db: str = "dagster",
                   log_path: Path | str, timeout: float = 90) -> Server:
    """PostgreSQL on 127.0.0.1:`port` over `data_dir` (initialised when new), with role `user` /
    `password` owning database `db`; the running `Server` (see the module docstring)."""
    if not password:
        raise ServerError(f"postgres on port {port}: role {user!r} needs a password (it logs in over TCP with "
                          "scram-sha-256): set dagster.postgres.password in the profile")
    data_dir, log_path = Path(data_dir).resolve(), Path(log_path)
    bindir = postgres_bindir()
    prefix, system_user = _run_as()
    data_dir.parent.mkdir(parents=True, exist_ok=True)  # a fresh FACTORY_HOME/cluster has none of it yet
    if system_user is not None:
        _check_reachable(data_dir, system_user)
    new = not (data_dir / "PG_VERSION").exists()
    data_dir.mkdir(parents=True, exist_ok=True)
    if system_user is not None:
        os.chown(data_dir, system_user.pw_uid, system_user.pw_gid)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if new:
        _initdb(bindir, data_dir, prefix, log_path)
    server = Server("postgres", [*prefix, str(bindir / "postgres"), "-D", str(data_dir), "-p", str(port),
                                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={data_dir}",
                                 "-c", "shared_buffers=32MB"], log_path).start()
    try:
        server.wait_ready(lambda: _answers(data_dir, port), timeout, f"no connection on 127.0.0.1:{port}")
        _ensure_role_and_db(data_dir, port, user, password, db)
    except Exception:
        server.stop()
        raise
    return server
