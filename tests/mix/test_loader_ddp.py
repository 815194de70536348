"""Two real data-parallel ranks (torch.distributed with gloo, two processes) following a mix
live: a version registered mid-run is picked up by both ranks at the same step, because rank 0
resolves and broadcasts (`agreed_resolver`). Runs on CPU in ~20 s."""

from __future__ import annotations

import json
import os

import torch.distributed as dist
import torch.multiprocessing as mp

from factory.lake import Lake
from factory.mix import (
    LoaderConfig,
    MixLoader,
    MixSpec,
    accounting,
    agreed_resolver,
    merge_states,
    register_mix_version,
)
import pytest

pytestmark = pytest.mark.slow

TABLES = ("refined.alpha", "refined.beta", "refined.gamma")


def weights(**w: float) -> MixSpec:
    return MixSpec(name="ddp_live", seq_len=32, sources=[{"table": t, "weight": w.get(t.split(".")[1], 0.0)}
                                                          for t in TABLES])


def _rank(rank: int, world: int, home: str, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    lake = Lake.open(home=home)
    config = LoaderConfig(global_batch=8, num_shards=4, num_workers=1, follow=True, poll_every=1)
    loader = MixLoader(lake, "ddp_live", config, rank=rank, world_size=world,
                       resolve=agreed_resolver(lake, "ddp_live"), run_id="ddp-run")
    seen = []
    for step in range(6):
        if step == 3 and rank == 0:
            register_mix_version(lake, weights(beta=1.0))
        batch = loader.next_batch()
        seen.append([batch.version_id, sorted(set(batch.sources))])
    states = [None] * world
    dist.all_gather_object(states, loader.state_dict())
    loader.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"seen": seen, "state": merge_states(states)}, f)
    dist.destroy_process_group()


def test_ranks_switch_versions_at_the_same_step(mix_lake, tmp_path):
    register_mix_version(mix_lake, weights(alpha=1.0))
    mp.spawn(_rank, args=(2, str(mix_lake.home), str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    v1, v2 = ["mix/ddp_live@v1", ["refined.alpha"]], ["mix/ddp_live@v2", ["refined.beta"]]
    for r in results:
        assert r["seen"] == [v1, v1, v1, v2, v2, v2]
    state = results[0]["state"]
    assert state["history"] == [{"step": 3, "from": "mix/ddp_live@v1", "to": "mix/ddp_live@v2"}]
    assert accounting(state)["versions"] == {
        "mix/ddp_live@v1": {"refined.alpha": {"sequences": 24, "tokens": 24 * 33}},
        "mix/ddp_live@v2": {"refined.beta": {"sequences": 24, "tokens": 24 * 33}},
    }
    switches = [r for r in mix_lake.lineage.records() if r.kind == "mix_switch" and r.name == "run/ddp-run"]
    assert len(switches) == 1  # rank 0 records it once
