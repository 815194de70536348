"""Add keys to a dynamic partitions definition of the Dagster instance in $DAGSTER_HOME, without
loading the code location: `python jobs/add_partitions.py training_runs smoke-6adb0d12 ...`.

Why: `factory experiment register` (what `make demo` runs first) only adds `training_run`
partitions. Through `dagster-graphql -w workspace.yaml` that loads definitions.py — every asset
module, torch, Spark, vLLM — for one write to the instance's storage (~30 s on a busy machine);
this imports dagster alone. Run by path, not `-m jobs....`, so `jobs/__init__` (the asset jobs)
is not imported either. Keys already there are left alone; prints the keys it added, as JSON.
"""

import json
import sys

from dagster import DagsterInstance


def main(argv: list[str]) -> int:
    name, keys = argv[0], list(dict.fromkeys(argv[1:]))
    with DagsterInstance.get() as instance:
        new = [k for k in keys if not instance.has_dynamic_partition(name, k)]
        if new:
            instance.add_dynamic_partitions(name, new)
    print(json.dumps({"added": new}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
