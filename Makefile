# Two commands on a fresh machine: `make demo` (the main job end to end) and `make test` (all tests).
# Both run `setup` first, which is idempotent: apt only when java/bwrap are missing, pip only when
# pyproject.toml changed since the last install.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# vLLM's CPU build unless a GPU answers; the CPU extra's placeholder wheels live in wheels/.
EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

export FACTORY_HOME ?= $(CURDIR)/.factory
export DAGSTER_HOME := $(FACTORY_HOME)/dagster
export SPARK_LOCAL_IP := 127.0.0.1
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1
# The loopback profiles' throwaway credentials (the servers `make cluster-up` starts listen on
# 127.0.0.1 only); a real profile names its own variables, set by whoever deploys it.
export FACTORY_DAGSTER_PG_PASSWORD ?= factory-loopback-secret

.PHONY: setup system instance demo test ui mlflow doctor clean cluster-up cluster-down

setup: system $(VENV)/.installed instance

system:
	@if ! command -v java >/dev/null || ! command -v bwrap >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	    || ! /sbin/ldconfig -p | grep -q libseccomp.so.2; then \
	  echo "== installing a JDK, bubblewrap, libseccomp and PostgreSQL with apt"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    openjdk-17-jre-headless bubblewrap libseccomp2 postgresql >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml $(wildcard wheels/*.whl)
	@echo "== installing the project into $(VENV) (extra: $(EXTRA))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=25"
	$(BIN)/pip install -q --find-links wheels -e ".[$(EXTRA)]"
	@touch $@

# The Dagster instance of the deployment profile (FACTORY_DEPLOY, default embedded): the run queue
# of configs/dagster.yaml plus the profile's storage (sqlite, or Postgres with the password by env name).
instance: $(VENV)/.installed
	@$(BIN)/factory deploy instance --dagster-home $(DAGSTER_HOME) >/dev/null

# The loopback cluster of a profile (default `loopback`: SeaweedFS S3 + Iceberg REST, a Spark
# standalone master and two workers), PIDs under FACTORY_HOME/cluster; then FACTORY_DEPLOY=loopback make demo.
cluster-up: setup
	$(BIN)/factory deploy up --deploy $(or $(FACTORY_DEPLOY),loopback)

cluster-down:
	$(BIN)/factory deploy down

demo: setup
	@# a bad profile (unknown engine, unreachable catalog, wrong credentials, no Spark master) stops here
	$(BIN)/factory deploy check
	@# the smoke experiment's run is smoke-<hash8>: add that training_run partition (no lake needed yet;
	@# $$(shell) does not see exported variables before make 4.4, hence the explicit environment)
	$(eval SMOKE := $(shell FACTORY_HOME=$(FACTORY_HOME) DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/factory experiment register smoke))
	@test -n "$(SMOKE)" || { echo "factory experiment register smoke failed"; exit 1; }
	$(BIN)/dagster job execute -m definitions -j demo_job -c configs/demo_run.yaml
	$(BIN)/dagster asset materialize -m definitions --select mix --partition default
	$(BIN)/dagster asset materialize -m definitions --select training_run --partition $(SMOKE)
	@$(BIN)/factory tables
	@$(BIN)/factory drops
	@$(BIN)/factory mix show default
	@$(BIN)/factory sql "select checkpoint_id, step, tokens, round(loss, 3) as loss, mix_version from train.checkpoints where run = '$(SMOKE)' order by step"
	$(BIN)/dagster asset materialize -m definitions --select checkpoint_export,eval_scores --partition $(SMOKE)@120
	@$(BIN)/factory evals --run $(SMOKE)
	@$(BIN)/factory lineage eval/$(SMOKE)@120/default
	$(BIN)/dagster asset materialize -m definitions --select synthetic/porting,synthetic/rephrase
	@$(BIN)/factory sql "select source, count(*) as rows, sum(bytes) as bytes from synthetic.porting group by 1 union all select source, count(*), sum(bytes) from synthetic.rephrase group by 1"
	@$(BIN)/factory sql "select stage, count(*) as rejected, min(reason) as example from synthetic.rephrase_rejected group by 1 order by 2 desc"
	@$(BIN)/factory sql "select seed_id, agent_chain, export_id, template_hash from synthetic.rephrase limit 3"
	$(BIN)/dagster asset materialize -m definitions --select mix --partition default_synthetic
	@$(BIN)/factory mix show default_synthetic
	@$(BIN)/factory experiment list
	@$(BIN)/factory sweep list
	@echo
	@echo "Queue a sweep: $(BIN)/factory sweep launch smoke_lr   (runs under make ui; or here: $(BIN)/factory sweep run smoke_lr)"
	@echo "Browse these runs, assets, metadata and lineage in the web UI: make ui  (http://127.0.0.1:3000)"
	@echo "Query the lake: $(BIN)/factory sql \"select source, count(*) from raw.python_stdlib group by 1\""

test: setup
	$(BIN)/python -m pytest -q -ra

ui: setup
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The tracker's UI over the embedded MLflow store (loss curves, params, the card artifacts of every
# run); a profile with tracker.mlflow_tracking_uri has its own server to open instead.
MLFLOW_PORT ?= 5000
mlflow: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(FACTORY_HOME)/mlflow/mlflow.db -h 127.0.0.1 -p $(MLFLOW_PORT)

doctor: setup
	$(BIN)/factory doctor

clean:
	@test ! -x $(BIN)/factory || $(BIN)/factory deploy down >/dev/null
	rm -rf $(FACTORY_HOME)
