"""Deployment profiles: every engine the factory runs on, chosen by one name.

A profile is a function annotated `-> DeployConfig`; a variant calls its base and replaces a few
sections (`base().derive(...)`). Pick one with `FACTORY_DEPLOY=<name>` (or `--deploy` on the CLI);
`factory deploy check` validates it and asks every engine it names whether it answers.

- `embedded`: everything in this process or under `$FACTORY_HOME` — the sqlite catalog, Spark
  `local[*]`, torchrun on this node, vLLM in-process, MLflow on sqlite, Dagster on sqlite. What
  `make demo` and the tests use.
- `loopback`: the cluster engines, started on 127.0.0.1 by `make cluster-up` — an Iceberg REST
  catalog with its warehouse on S3 (SeaweedFS), a Spark standalone master with two workers.
- `loopback_postgres`: the embedded engines with the Dagster instance on loopback PostgreSQL.
- `kubernetes`: Dagster's chart on a cluster, runs placed on node pools by asset kind
  (`factory deploy render --deploy kubernetes`; deploy/README.md); `kubernetes_served` sends evals
  and synthetic generation to the vLLM Service instead.
"""

from configs.deploy.embedded import embedded
from configs.deploy.kubernetes import kubernetes, kubernetes_served
from configs.deploy.loopback import loopback, loopback_postgres
from factory.deploy import DeployConfig

__all__ = ["DeployConfig", "embedded", "kubernetes", "kubernetes_served", "loopback", "loopback_postgres"]
