# Two commands on a fresh machine: `make demo` (the main job end to end) and `make test` (all tests);
# `make check` (the fast hermetic tier, ~3 minutes) after each change.
# Both run `setup` first, which is idempotent: apt only when a system tool is missing (the JDK,
# bubblewrap, PostgreSQL, Prometheus, buildah/podman for the image test, Chromium and chromedriver for
# Podium's browser test), pip only when
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

.PHONY: setup system instance demo check test ui podium mlflow doctor image clean cluster-up cluster-down

# The local package mirror repository builds resolve against in `make demo` and the tests (no network
# there): the demo repository set's sdists, their wheels, pytest and the build backends.
REGISTRY := .cache/registry

setup: system $(VENV)/.installed $(VENV)/compat/transformers4 instance $(REGISTRY)/.complete

system:
	@if ! command -v java >/dev/null || ! command -v bwrap >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	    || ! /sbin/ldconfig -p | grep -q libseccomp.so.2 || ! command -v prometheus >/dev/null \
	    || ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v runc >/dev/null \
	    || ! command -v debootstrap >/dev/null || ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  echo "== installing a JDK, bubblewrap, libseccomp, PostgreSQL, Prometheus, the image tools and Chromium with apt"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    openjdk-17-jre-headless bubblewrap libseccomp2 postgresql prometheus \
	    buildah podman runc debootstrap chromium chromium-driver >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml $(wildcard wheels/*.whl)
	@echo "== installing the project into $(VENV) (extra: $(EXTRA))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=25"
	$(BIN)/pip install -q --find-links wheels -e ".[$(EXTRA)]"
	@touch $@

# transformers 4.x beside the venv's 5.x, for the test that loads an export as 4.x users do
# (its directory first on PYTHONPATH); a separate target so an existing venv gets it too
$(VENV)/compat/transformers4: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps --upgrade --target $@ "transformers==4.57.6" "tokenizers==0.22.2" "huggingface-hub==0.36.2"
	@touch $@

$(REGISTRY)/.complete: configs/envs/corpus.py $(VENV)/.installed
	@echo "== filling the package mirror $(REGISTRY) (the demo repository set; network to the package index)"
	$(BIN)/factory envs mirror --repos demo --dest $(REGISTRY)
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

# The main job end to end as a report (factory/demo/runner.py): each phase with the factory's progress
# and its time, then a summary read from the lake; the rest (Spark, vLLM, Dagster's own events and
# warnings) goes to FACTORY_HOME/logs/demo-<time>.log. A bad profile stops it at the first phase.
# Setup (apt, pip, the Dagster instance) runs first and is timed apart from the pipeline.
demo:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit 1; \
	  $(BIN)/python -m factory.demo --setup-seconds $$(( $$(date +%s) - start ))

# The tests in tiers, one marker each (tests/conftest.py; README "Tests"): `check`, the fast hermetic
# tier, is what a developer runs after each change; `make test` runs every tier at once, in lanes
# side by side (2 cores: the server tiers mostly wait on what they start), each lane's output
# printed when it ends, and fails when any lane fails. pytest-xdist spreads a lane over workers (the
# `slow` lane over three: its tests mostly wait on the servers and subprocesses they start);
# `--dist loadgroup` keeps each test file on one worker (module fixtures are built once) and the
# tests of one shared home (tests/conftest.py ONE_PER_RUN: the demo's) on one worker; the groups go
# out longest first (tests/durations.json, measured by bench/suite_bench.py --durations), which
# --no-loadscope-reorder keeps (xdist would order them by their number of tests).
# PYTEST_ARGS: more pytest options for every lane (`make test PYTEST_ARGS="--cov ..."`, `-p randomly`).
PYTEST := $(BIN)/python -m pytest -q -ra -p no:cacheprovider $(PYTEST_ARGS)
# The check tier also runs in a network namespace of its own (tests/no_network: loopback only) where
# `unshare -n` is allowed (root): there no process, the test's children included, can reach a server
# outside it (pytest-socket guards the test's own process everywhere).
NO_NET := $(shell tests/no_network true 2>/dev/null && echo tests/no_network)
# One torch/OpenMP thread per test process: the workers already share the cores, and spinning
# OpenMP threads of oversubscribed processes only burn them (the tests that train set it themselves).
XDIST := --dist loadgroup --no-loadscope-reorder
CHECK := $(NO_NET) env OMP_NUM_THREADS=1 $(PYTEST) -m check -n 2 $(XDIST)
# The demo lane (tests/demo_lane) runs `make demo` on a fresh home from the start: the suite's
# longest chain is that demo and then the documented commands run on its home (the demo_home
# fixture waits for it through FACTORY_TEST_DEMO_RUN). One thread too: with two, its training's
# OpenMP threads waited on each other on the shared cores (120 steps in over 20 minutes).
LANES := "demo|OMP_NUM_THREADS=1 tests/demo_lane" \
  "check|$(CHECK)" \
  "slow|OMP_NUM_THREADS=1 $(PYTEST) -m slow -n 3 $(XDIST)" \
  "servers|OMP_NUM_THREADS=1 $(PYTEST) -m 'loopback or spark or rest or gpu' -n 2 $(XDIST)"

check: setup
	FACTORY_SUITE_TIER=check $(CHECK)

# Each lane is a process session of its own (setsid): where the kernel groups CPU time by session
# (sched_autogroup, the default of most distributions), every server a test starts in a session of
# its own would otherwise get as much CPU as all the lanes in make's session together (measured: no
# shorter `make test` for it; both cores are busy throughout). And the trap can stop each lane's
# whole group: Ctrl-C or SIGTERM stops every lane (background jobs of make's shell ignore SIGINT).
test: setup
	@tmp=$$(mktemp -d); pids=(); names=(); export FACTORY_TEST_DEMO_RUN=$$tmp/demo-run; \
	  trap 'for p in $${pids[@]}; do kill -TERM -- -$$p 2>/dev/null; done; rm -rf $$tmp; exit 130' INT TERM; \
	  for lane in $(LANES); do name=$${lane%%|*}; \
	    FACTORY_SUITE_TIER=$$name setsid bash -c "$${lane#*|}" > $$tmp/$$name.log 2>&1 & pids+=($$!); names+=($$name); \
	    echo "== lane $$name: $${lane#*|}"; done; \
	  failed=0; for i in $${!pids[@]}; do wait $${pids[$$i]} || failed=1; \
	    echo "== lane $${names[$$i]}"; cat $$tmp/$${names[$$i]}.log; done; rm -rf $$tmp; exit $$failed

# The web UI with its daemon (sensors, schedules, the run queue). Ctrl-C stops it and everything it
# started (code server, run workers, training and vLLM subprocesses, log tailers): factory.deploy.session.
# Beside it, factory-health metrics (FACTORY_METRICS=0 make ui: none): the exporter on METRICS_PORT
# and Prometheus on PROMETHEUS_PORT, its data in FACTORY_HOME/metrics (factory.health.local).
DAGSTER_PORT ?= 3000
METRICS_PORT ?= 9464
PROMETHEUS_PORT ?= 9090
ui: setup
	@echo "== Dagster UI at http://127.0.0.1:$(DAGSTER_PORT) (Ctrl-C stops it and everything it started)"
	@FACTORY_METRICS=$${FACTORY_METRICS-1} $(BIN)/python -m factory.deploy.session --metrics-port $(METRICS_PORT) \
	  --prometheus-port $(PROMETHEUS_PORT) -- $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(DAGSTER_PORT)

# Podium, the vibe-check web app, on the lake of the active profile: it prints a sign-in link per user of
# FACTORY_HOME/podium/tokens.json (made with one user, `local`, at first start).
PODIUM_PORT ?= 8100
podium: setup
	$(BIN)/factory podium --port $(PODIUM_PORT)

# The tracker's UI over the embedded MLflow store (loss curves, params, the card artifacts of every
# run); a profile with tracker.mlflow_tracking_uri has its own server to open instead.
MLFLOW_PORT ?= 5000
mlflow: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(FACTORY_HOME)/mlflow/mlflow.db -h 127.0.0.1 -p $(MLFLOW_PORT)

doctor: setup
	$(BIN)/factory doctor

# The container image (deploy/Dockerfile) of this machine's variant, with buildah (apt: buildah podman
# runc debootstrap); without a reachable registry its Debian base is made here with debootstrap.
image:
	deploy/image/build.sh build $(EXTRA)

clean:
	@test ! -x $(BIN)/factory || $(BIN)/factory deploy down >/dev/null
	rm -rf $(FACTORY_HOME)
