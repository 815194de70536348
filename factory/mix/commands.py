"""`factory mix ...`: list, show, register and peek at mixes from the shell (no Dagster).

`register` is the same call the `mix` asset makes; `peek` streams one batch of a version through
the real loader and decodes it, so a researcher sees exactly what training will see.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table as RichTable


def _lake(args):
    from factory.cli import open_lake

    return open_lake(args)


def cmd_list(args, out: Console) -> int:
    from configs.mixes import mix_names, mix_spec
    from factory.mix import latest_version

    lake = _lake(args)
    table = RichTable("mix", "sources (weight)", "seq_len", "newest version", "registered")
    for name in mix_names():
        spec, v = mix_spec(name), latest_version(lake, name)
        table.add_row(name, ", ".join(f"{s.table} ({s.weight:g})" for s in spec.sources), str(spec.seq_len),
                      v.version_id if v else "-", v.created_at.strftime("%Y-%m-%d %H:%M") if v else "-")
    out.print(table)
    return 0


def cmd_show(args, out: Console) -> int:
    from factory.mix import MixError, mix_versions

    versions = mix_versions(_lake(args), args.name)
    if not versions:
        raise MixError(f"mix {args.name!r} has no registered version (factory mix register {args.name})")
    if args.json:
        print(json.dumps([json.loads(v.model_dump_json()) for v in versions]))
        return 0
    for v in versions:
        stages = [(s.until_tokens, s.weights) for s in v.spec.stages] + [(None, v.spec.weights)]
        table = RichTable("source", "snapshot", "training rows", "~tokens", "max epochs", "tokens/doc",
                          *[f"w<{u:,}" if u else "weight" for u, _ in stages],
                          title=f"{v.version_id}  ({v.created_at:%Y-%m-%d %H:%M}, seq_len {v.spec.seq_len}, "
                                f"{v.tokenizer_version})")
        for s in v.spec.sources:
            p = v.pins[s.table]
            table.add_row(s.table, str(p.snapshot_id), f"{p.train_rows:,}", f"{p.token_estimate:,}",
                          f"{s.max_epochs:g}" if s.max_epochs else "-",
                          f"{s.max_doc_tokens:,}" if s.max_doc_tokens else "-",
                          *[f"{w.get(s.table, 0.0):.3f}" for _, w in stages])
        out.print(table)
    return 0


def cmd_register(args, out: Console) -> int:
    from configs.mixes import mix_spec
    from factory.mix import register_mix_version

    version, created = register_mix_version(_lake(args), mix_spec(args.name), asset_key="cli/mix", log=out.print)
    out.print(f"{version.version_id}: {'registered' if created else 'unchanged (the newest version already pins this)'}")
    return 0


def cmd_peek(args, out: Console) -> int:
    from factory.mix import LoaderConfig, MixLoader

    lake = _lake(args)
    config = LoaderConfig(global_batch=args.rows, num_shards=1, seed=args.seed, num_workers=0)
    with MixLoader(lake, args.ref, config) as loader:
        batch, tokenizer = loader.next_batch(), loader.tokenizer
    for i, row in enumerate(batch.tokens.tolist()):
        out.rule(f"row {i}: {batch.sources[i]}  documents {', '.join(batch.doc_ids[i])}")
        out.print(tokenizer.decode(row, skip_special_tokens=False), markup=False, highlight=False)
    out.print(f"{batch.version_id}, stage {batch.stage}, {batch.tokens.shape[1]} tokens per row")
    return 0
