"""The exporter: /metrics on 127.0.0.1, merged from every process's files in the multiprocess dir.

    factory metrics serve --port 9464                       # trainer, sandbox, inference, lake series
    factory metrics serve --port 9464 --dagster-home DIR    # + the Dagster run queue (Dagster layer)
    python -m factory.health.exporter --port 9464           # the same, without the CLI

Design: a fresh `CollectorRegistry` with prometheus_client's `MultiProcessCollector` over
`metrics_dir()`, plus any collectors the caller brings (the run-queue collector lives in
`resources/run_queue_metrics.py`, since polling the instance needs Dagster and `factory/` never
imports it: `--dagster-home` hands the whole command to `python -m resources.run_queue_metrics`,
which builds the same server with its collector added). The server is prometheus_client's own
threaded HTTP server; it binds loopback unless told otherwise, since Prometheus runs beside it
(`make ui`) or, on Kubernetes, scrapes the pod through its annotation.

The exporter never deletes files: they belong to the processes writing them. A directory that
grows across many runs is cleaned with `rm -r FACTORY_HOME/metrics/prom` while nothing writes
(counters then restart from zero, which `rate()` handles).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from factory.health import metrics_dir

DEFAULT_PORT = 9464  # `make ui`'s METRICS_PORT; clear of Dagster (3000), MLflow (5000) and Prometheus (9090)


def build_registry(path: str | Path | None = None, collectors: Iterable = ()):
    """A registry that reads every process's series under `path` (default `metrics_dir()`)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    path = Path(path) if path is not None else metrics_dir()
    path.mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    for collector in collectors:
        registry.register(collector)
    return registry


def serve(port: int, *, host: str = "127.0.0.1", path: str | Path | None = None, collectors: Iterable = ()):
    """Start serving /metrics on host:port in a background thread; returns the HTTP server
    (`server.shutdown()` stops it). Port 0 picks a free one: `server.server_port`."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=build_registry(path, collectors))
    return server


def run_forever(args: argparse.Namespace, collectors: Iterable = ()) -> int:
    """Serve until SIGINT or SIGTERM; prints the URL once it listens (tests and `make ui` wait on it)."""
    server = serve(args.port, host=args.host, path=args.dir, collectors=collectors)
    print(f"metrics on http://{args.host}:{server.server_port}/metrics from {args.dir or metrics_dir()}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--dir", default=None, help="multiprocess directory (default: $PROMETHEUS_MULTIPROC_DIR, "
                                                    "else FACTORY_HOME/metrics/prom)")
    return parser


def cmd_serve(args: argparse.Namespace, out=None) -> int:
    """`factory metrics serve`: this exporter, or with --dagster-home the Dagster layer's one."""
    if getattr(args, "home", None) and not args.dir:
        args.dir = str(metrics_dir(args.home))
    if getattr(args, "dagster_home", None):
        argv = [sys.executable, "-m", "resources.run_queue_metrics", "--port", str(args.port), "--host", args.host,
                "--dagster-home", args.dagster_home] + (["--dir", args.dir] if args.dir else [])
        os.execv(sys.executable, argv)  # same PID: whoever started us stops it the same way
    return run_forever(args)


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m factory.health.exporter",
                                                   description=__doc__.split("\n")[0]))
    return run_forever(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
