"""Podium's overhead: chat through the app against the same backend called directly, and the
dataset browser's page loads on the largest table.

Chat: the app runs under uvicorn on a loopback port; `POST /api/chat` is read as a stream by an
HTTP client (time to the first byte of text, and tokens/s over the whole answer, tokens counted by
the row the app stored) and, alternating with it, the app's backend (`LocalBackend`, in-process
transformers) streams the same prompt directly. Greedy, so both generate the same tokens. Prints
the medians and the app/direct ratios.

Datasets: `GET /datasets/<table>?page_no=N` for the first, the middle and the last page, and a filtered
page, on `--table` (default refined.site_packages, the demo's largest), each timed end to end
(request to the last byte of HTML).

Writes podium.conversations rows into the home (the chats it times). Not part of the tests.

    FACTORY_HOME=.factory .venv/bin/python bench/podium_bench.py [--export export/<run>@<step>] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from factory.infer.export import find_export, latest_export
from factory.lake import Lake
from factory.podium.app import create_app
from factory.podium.config import PodiumConfig
from factory.podium.inference import Generation, LocalBackend, Sampling
from factory.podium.store import CONVERSATIONS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export", help="export id (default: the newest)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--table", default="refined.site_packages")
    args = parser.parse_args()

    lake = Lake.open()
    export = find_export(lake, args.export) if args.export else latest_export(lake)
    scratch = Path(tempfile.mkdtemp())
    (scratch / "tokens.json").write_text(json.dumps({"bench": "bench"}))
    config = PodiumConfig(tokens_file=scratch / "tokens.json", secret_file=scratch / "secret", backend="local",
                          generations_per_minute=1000)
    backend = LocalBackend()
    app = create_app(config, lake, backend)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    client.get("/login?token=bench")
    csrf = client.get("/chat").text.split('name="csrf-token" content="')[1].split('"')[0]
    messages = [{"role": "user", "content": "def parse_args(argv):\n    "}]
    sampling = Sampling(temperature=0.0, max_tokens=args.max_tokens)
    list(backend.stream(export, messages, sampling))  # load the model once, outside the timings

    app_ttft, app_rate, direct_ttft, direct_rate = [], [], [], []
    for i in range(args.repeat):
        started = time.perf_counter()
        first = None
        with client.stream("POST", "/api/chat", json={"export": export.export_id, "messages": messages,
                                                       "sampling": sampling.as_dict(), "conversation_id": f"bench-{i}"},
                           headers={"X-CSRF-Token": csrf}) as response:
            response.raise_for_status()
            for chunk in response.iter_text():
                if chunk and first is None:
                    first = time.perf_counter() - started
        total = time.perf_counter() - started
        row = lake.table(CONVERSATIONS).scan(row_filter=f"conversation_id == 'bench-{i}'").to_arrow().to_pylist()[-1]
        app_ttft.append(first)
        app_rate.append(row["tokens"] / total)

        gen = Generation("", 0)
        started = time.perf_counter()
        for _ in backend.stream(export, messages, sampling, gen):
            pass
        total = time.perf_counter() - started
        direct_ttft.append(gen.first_token_s)
        direct_rate.append(gen.tokens / total)

    med = statistics.median
    print(f"chat, {export.export_id}, greedy, {args.max_tokens} new tokens, median of {args.repeat}:")
    print(f"  time to first token: app {med(app_ttft) * 1000:.1f} ms, direct {med(direct_ttft) * 1000:.1f} ms "
          f"(app/direct {med(app_ttft) / med(direct_ttft):.2f}x)")
    print(f"  tokens/s:            app {med(app_rate):.1f}, direct {med(direct_rate):.1f} "
          f"(app/direct {med(app_rate) / med(direct_rate):.2f}x)")

    if lake.has_table(args.table):
        table = lake.table(args.table)
        count = len(table.scan(selected_fields=(next(iter(table.schema().fields)).name,)).to_arrow())
        last = max(1, -(-count // config.page_size))
        print(f"dataset browser, {args.table} ({count} rows, {last} pages of {config.page_size}):")
        first_column = next(iter(table.schema().fields)).name
        sample = table.scan(selected_fields=(first_column,), limit=1).to_arrow().column(0)[0].as_py()
        for label, query in (("page 1", "page_no=1"), (f"page {last // 2}", f"page_no={last // 2}"),
                             (f"page {last} (last)", f"page_no={last}"),
                             (f"filter {first_column}", f"column={first_column}&value={sample}")):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                page = client.get(f"/datasets/{args.table}?{query}")
                page.raise_for_status()
                times.append(time.perf_counter() - started)
            print(f"  {label:<22} {min(times) * 1000:7.0f} ms ({len(page.content) / 1e3:.0f} kB)")
    server.should_exit = True


if __name__ == "__main__":
    main()
