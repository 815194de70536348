"""`synthetic_mix_sensor` over a real lake: a new `synthetic.*` snapshot requests a new version of
each mix that lists the table, unless the mix's newest version already pins that snapshot — the
state `make demo` leaves (it registers `default_synthetic` itself), met by a first tick with no
cursor when the UI opens; a later snapshot is requested again. CPU, no servers; the synthetic
rows are stdlib docstrings committed directly (the mix reads only doc_id, bytes and text)."""

import json

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from configs.mixes import mix_spec
from factory.mix import register_mix_version
from resources.lake import LakeResource
from sensors.synth import synthetic_mix_sensor

TABLE, MIX = "synthetic.porting", "default_synthetic"


def tick(home, cursor):
    context = build_sensor_context(instance=DagsterInstance.ephemeral(), cursor=cursor,
                                   resources={"lake": LakeResource(home=str(home))})
    return synthetic_mix_sensor(context), context


@pytest.mark.slow
def test_a_mix_already_pinning_the_snapshot_is_not_requested_again(tmp_path, build_training_lake, corpus, capfd):
    lake = build_training_lake(tmp_path / "home")
    first = corpus.write(lake, TABLE, corpus.docstrings(TABLE, count=20))

    result, _ = tick(lake.home, None)  # no version of the mix pins it yet: due
    assert isinstance(result, SensorResult)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [(MIX, f"{MIX}:{TABLE}@{first}")]

    version, created = register_mix_version(lake, mix_spec(MIX))  # what `make demo` does
    assert created and version.pins[TABLE].snapshot_id == first

    skip, context = tick(lake.home, None)  # the UI opens after the demo: a first tick, no cursor
    assert isinstance(skip, SkipReason)
    assert skip.skip_message == f"no new synthetic snapshots in any mix; already current: {MIX} <- {TABLE}@{first}"
    assert json.loads(context.cursor) == {TABLE: first}
    assert f"skipped 1 already done (the newest version pins the snapshot): {MIX} <- {TABLE}@{first}" \
        in capfd.readouterr().err

    second = corpus.write(lake, TABLE, corpus.docstrings(TABLE, skip=20, count=20))
    again, _ = tick(lake.home, context.cursor)
    assert [r.run_key for r in again.run_requests] == [f"{MIX}:{TABLE}@{second}"]
    assert "requesting 1 mix versions: " + f"{MIX} <- {TABLE}@{second}" in capfd.readouterr().err
