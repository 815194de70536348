"""`factory deploy list|show|check|instance|up|down|status|render`: profiles from the shell.

`up` starts the servers a loopback profile names — SeaweedFS for a REST catalog on 127.0.0.1, a
Spark standalone master and two workers for `spark://127.0.0.1:<port>`, PostgreSQL for a Dagster
instance on 127.0.0.1 — under `$FACTORY_HOME/cluster/<server>/`, and records each PID there;
`down` stops exactly those PIDs. A profile whose engines live elsewhere starts nothing: those are
the cluster's to run.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

from rich.console import Console
from rich.table import Table as RichTable

LOOPBACK = {"127.0.0.1", "localhost"}


def _profile(args):
    from factory.cli import profile

    return profile(args)


def _home(args) -> Path:
    from factory.home import factory_home

    return factory_home(args.home)


def _cluster_dir(args) -> Path:
    return _home(args) / "cluster"


def cmd_list(args, out: Console) -> int:
    from factory.deploy import load_profile, profile_names

    table = RichTable("profile", "catalog", "spark", "training", "dagster", "description")
    for name in profile_names():
        p = load_profile(name)
        table.add_row(name, p.catalog.kind + (f" {p.catalog.uri}" if p.catalog.uri else ""), p.spark.master,
                      p.training.launcher, p.dagster.storage, p.description)
    out.print(table)
    return 0


def cmd_show(args, out: Console) -> int:
    text = _profile(args).model_dump_json(indent=2)  # secrets appear as {"env": NAME}: never values
    if args.json:
        print(text)
    else:
        out.print(text, markup=False, highlight=False)
    return 0


def cmd_check(args, out: Console) -> int:
    from factory.deploy.check import check_profile

    profile = _profile(args)
    probes = check_profile(profile, _home(args))
    if args.json:
        print(json.dumps([p.as_dict() for p in probes], indent=2))
    else:
        table = RichTable("", "field", "engine", "detail", title=f"deploy profile {profile.name}")
        for p in probes:
            table.add_row("[green]OK[/]" if p.ok else "[bold red]FAIL[/]", p.field, p.engine, p.detail)
        out.print(table)
    failed = [p for p in probes if not p.ok]
    if failed and not args.json:
        from factory.deploy import DeployError

        raise DeployError(f"profile {profile.name}: {', '.join(p.field for p in failed)} failed (details above)")
    return 1 if failed else 0


def cmd_instance(args, out: Console) -> int:
    from factory.deploy.instance import write_instance_yaml
    from factory.home import dagster_home
    from factory import settings

    target = Path(args.dagster_home or settings.get("DAGSTER_HOME") or dagster_home(_home(args)))
    path = write_instance_yaml(_profile(args), target)
    out.print(f"{path}", markup=False)
    return 0


def cmd_render(args, out: Console) -> int:
    from factory.deploy.kube.render import write_render

    profile = _profile(args)
    paths = write_render(profile, Path(args.out))
    for path in paths:
        out.print(str(path), markup=False, highlight=False)
    out.print(f"{len(paths)} files for profile {profile.name} (Kubernetes {profile.kubernetes.cluster_version}), "
              f"every object validated", markup=False, highlight=False)
    return 0


def _loopback(url: str | None) -> bool:
    return bool(url) and urlparse(url).hostname in LOOPBACK


def cmd_up(args, out: Console) -> int:
    from factory.deploy.servers import free_port

    profile, root = _profile(args), _cluster_dir(args)
    started = []
    if profile.catalog.kind == "rest" and _loopback(profile.catalog.uri):
        from factory.deploy.seaweed import start_seaweedfs

        d = root / "seaweedfs"
        started.append(("seaweedfs", start_seaweedfs(d / "data", profile, d / "weed.log"),
                        f"Iceberg REST {profile.catalog.uri}, S3 {profile.catalog.s3.endpoint if profile.catalog.s3 else '-'}"))
    master = profile.spark.master
    if master.startswith("spark://") and urlparse(master).hostname in LOOPBACK:
        from factory.deploy.spark_cluster import start_spark_cluster

        ui = free_port()
        cluster = start_spark_cluster(root / "spark", port=urlparse(master).port, webui_port=ui, workers=2, cores=1,
                                      memory="1g")
        for i, server in enumerate([cluster.master, *cluster.workers]):
            started.append((f"spark-{'master' if i == 0 else f'worker{i}'}", server,
                            f"{master} (UI http://127.0.0.1:{ui})" if i == 0 else "1 core, 1g"))
    pg = profile.dagster.postgres
    if profile.dagster.storage == "postgres" and pg and pg.host in LOOPBACK:
        from factory.deploy.postgres import start_postgres

        d = root / "postgres"
        password = pg.password.resolve("dagster.postgres.password") if pg.password else None
        started.append(("postgres", start_postgres(d / "data", port=pg.port, user=pg.user, password=password,
                                                   db=pg.db, log_path=d / "postgres.log"),
                        f"{pg.user}@{pg.host}:{pg.port}/{pg.db}"))
    if not started:
        out.print(f"profile {profile.name} names no loopback server: nothing to start")
        return 0
    table = RichTable("server", "pid", "where", "log")
    for name, server, where in started:
        (root / f"{name}.pid").write_text(json.dumps({"pid": server.pid, "log": str(server.log_path)}))
        table.add_row(name, str(server.pid), where, str(server.log_path))
    out.print(table)
    out.print(f"stop them with: factory deploy down --deploy {profile.name}", markup=False)
    return 0


def _recorded(args) -> list[tuple[str, dict]]:
    root = _cluster_dir(args)
    return [(p.stem, json.loads(p.read_text())) for p in sorted(root.glob("*.pid"))] if root.is_dir() else []


def cmd_down(args, out: Console) -> int:
    from factory.deploy.servers import stop_pid

    recorded = _recorded(args)
    # workers before their master, everything before the catalog's store
    order = sorted(recorded, key=lambda r: ("worker" not in r[0], r[0] == "seaweedfs"))
    for name, info in order:
        was = stop_pid(info["pid"])
        out.print(f"{name}: pid {info['pid']} {'stopped' if was else 'was not running'}", markup=False)
        (_cluster_dir(args) / f"{name}.pid").unlink()
    if not recorded:
        out.print("no servers recorded under FACTORY_HOME/cluster")
    return 0


def cmd_status(args, out: Console) -> int:
    from factory.deploy.servers import pid_alive

    rows = [{"server": n, "pid": i["pid"], "running": pid_alive(i["pid"]), "log": i["log"]} for n, i in _recorded(args)]
    if args.json:
        print(json.dumps(rows))
        return 0
    table = RichTable("server", "pid", "running", "log")
    for r in rows:
        table.add_row(r["server"], str(r["pid"]), "yes" if r["running"] else "[red]no[/]", r["log"])
    out.print(table)
    return 0 if all(r["running"] for r in rows) else 1
