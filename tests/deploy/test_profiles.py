"""Deployment profiles: one validated `DeployConfig` picks every engine; a bad profile fails before
any work starts, naming the field (unknown engine, unreachable catalog, missing or wrong
credentials, a Spark master that does not answer); the profile reaches child processes as JSON
without a secret in it; and no module but `factory.settings` reads the environment. CPU; the only
servers are a throwaway HTTP listener on loopback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from factory.deploy import DeployConfig, DeployError, load_profile, open_lake, profile_env, profile_names
from factory.deploy.check import check_profile, require_profile
from factory.deploy.config import CatalogProfile, S3Config, Secret, SparkProfile
from factory.deploy.servers import Server, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_profile_in_environment(monkeypatch):
    for name in ("FACTORY_DEPLOY", "FACTORY_DEPLOY_JSON"):
        monkeypatch.delenv(name, raising=False)


def test_shipped_profiles_validate_and_embedded_is_the_default():
    assert {"embedded", "loopback"} <= set(profile_names())
    embedded = load_profile()
    assert embedded.name == "embedded" and embedded.catalog.kind == "sql" and embedded.spark.master == "local[*]"
    loopback = load_profile("loopback")
    assert loopback.catalog.kind == "rest" and loopback.catalog.warehouse.startswith("s3://")
    assert loopback.spark.master.startswith("spark://127.0.0.1:") and loopback.spark.loopback


@pytest.mark.parametrize("text, field", [
    ("catalog: {kind: hive}", "catalog.kind"),
    ("spark: {master: 'mesos://x:5050'}", "spark.master"),
    ("training: {launcher: slurm}", "training.launcher"),
    ("training: {launcher: multinode}", "training"),
    ("catalog: {kind: rest}", "catalog"),
    ("catalog: {kind: sql, token: {env: T}}", "catalog"),
    ("dagster: {storage: postgres}", "dagster"),
    ("inference: {kind: tgi}", "inference.kind"),
    ("inference: {kind: openai}", "inference"),
    ("inference: {kind: openai, endpoint: 'ftp://vllm:8000/v1'}", "inference"),
    ("catalogue: {kind: sql}", "catalogue"),
])
def test_a_bad_profile_file_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    with pytest.raises(DeployError, match=rf"deploy profile {re.escape(str(path))}: {re.escape(field)}\b"):
        load_profile(str(path))


def test_unknown_profile_and_unreadable_file(tmp_path):
    with pytest.raises(DeployError, match="unknown deploy profile 'nope': configs/deploy has .*embedded"):
        load_profile("nope")
    with pytest.raises(DeployError, match="cannot read the file"):
        load_profile(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(DeployError, match="expected a mapping"):
        load_profile(str(tmp_path / "list.yaml"))


def test_the_profile_handed_down_wins_and_carries_no_secret(monkeypatch):
    base = load_profile("loopback")
    s3 = base.catalog.s3.model_copy(update={"secret_access_key": Secret(env="TEST_SECRET_KEY")})
    profile = base.derive(description="handed down", catalog=base.catalog.model_copy(update={"s3": s3}))
    monkeypatch.setenv("TEST_SECRET_KEY", "sup3r-s3cret")
    assert profile.catalog.properties_resolved()["s3.secret-access-key"] == "sup3r-s3cret"
    env = profile_env(profile)
    assert "sup3r-s3cret" not in env["FACTORY_DEPLOY_JSON"]  # the variable's name travels, not its value
    assert json.loads(env["FACTORY_DEPLOY_JSON"])["catalog"]["s3"]["secret_access_key"]["env"] == "TEST_SECRET_KEY"
    monkeypatch.setenv("FACTORY_DEPLOY", "embedded")
    monkeypatch.setenv("FACTORY_DEPLOY_JSON", env["FACTORY_DEPLOY_JSON"])
    assert load_profile() == profile  # a child never re-resolves the name into another catalog
    assert load_profile("embedded").name == "embedded"  # an explicit name still wins


def test_secrets_resolve_from_the_named_variable_at_use(monkeypatch):
    s3 = S3Config(endpoint="http://127.0.0.1:1", access_key_id=Secret(env="TEST_KEY"),
                  secret_access_key=Secret(env="TEST_SECRET"))
    monkeypatch.delenv("TEST_KEY", raising=False)
    with pytest.raises(DeployError, match="catalog.s3.access_key_id: environment variable TEST_KEY is not set"):
        s3.pyiceberg_properties()
    monkeypatch.setenv("TEST_KEY", "k")
    monkeypatch.setenv("TEST_SECRET", "s")
    assert s3.pyiceberg_properties()["s3.access-key-id"] == "k"
    conf = s3.hadoop_s3a_conf()
    assert conf["spark.hadoop.fs.s3a.access.key"] == "k" and conf["spark.hadoop.fs.s3a.path.style.access"] == "true"


def test_embedded_lake_opens_under_home(tmp_path):
    lake = open_lake(load_profile("embedded"), home=tmp_path)
    assert lake.home == tmp_path.resolve() and lake.tables() == []


def _rest_profile(uri: str, **catalog) -> DeployConfig:
    s3 = S3Config(endpoint=f"http://127.0.0.1:{free_port()}", access_key_id=Secret(env="TEST_K", default="k"),
                  secret_access_key=Secret(env="TEST_S", default="s"))
    return DeployConfig(name="probe", catalog=CatalogProfile(kind="rest", uri=uri, warehouse="s3://warehouse", s3=s3,
                                                             **catalog),
                        spark=SparkProfile(master=f"spark://127.0.0.1:{free_port()}"))


@pytest.mark.loopback
def test_check_names_every_engine_that_does_not_answer(tmp_path):
    profile = _rest_profile(f"http://127.0.0.1:{free_port()}")
    probes = {p.field: p for p in check_profile(profile, tmp_path)}
    assert not probes["spark.master"].ok and "does not answer" in probes["spark.master"].detail
    assert not probes["catalog.uri"].ok and "does not answer" in probes["catalog.uri"].detail
    assert not probes["catalog.s3.endpoint"].ok
    with pytest.raises(DeployError, match=r"deploy profile probe: spark\.master: .*catalog\.uri: "):
        require_profile(profile, tmp_path)
    assert require_profile(load_profile("embedded"), tmp_path)  # the embedded engines always answer


@pytest.mark.loopback
def test_check_reports_rejected_credentials(tmp_path):
    """A REST endpoint that answers 401 (a throwaway HTTP server on loopback) is a credential problem."""
    port = free_port()
    script = ("import http.server as h\n"
              "class H(h.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        self.send_response(401); self.send_header('Content-Type', 'application/json'); self.end_headers()\n"
              "        self.wfile.write(b'{\"error\": {\"message\": \"Bearer token is invalid\", \"type\": \"NotAuthorizedException\", \"code\": 401}}')\n"
              "    do_POST = do_GET\n"
              f"h.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    server = Server("fake-rest", [sys.executable, "-c", script], tmp_path / "rest.log").start()
    try:
        server.wait_port("127.0.0.1", port, 30)
        profile = _rest_profile(f"http://127.0.0.1:{port}", credential=Secret(env="TEST_CRED", default="a:b"))
        catalog = next(p for p in check_profile(profile, tmp_path) if p.engine == "catalog")
        assert not catalog.ok and catalog.field == "catalog.credential" and "rejected" in catalog.detail
    finally:
        server.stop()
    assert not server.alive()


@pytest.mark.loopback
def test_a_rest_catalog_that_does_not_answer_is_one_line_naming_the_field(tmp_path):
    from factory.lake import LakeError

    profile = _rest_profile(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(LakeError, match=r"^catalog\.uri: the REST catalog at http://127\.0\.0\.1:\d+ does not answer"):
        open_lake(profile, home=tmp_path)
    path = tmp_path / "down.json"
    path.write_text(profile.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "factory.cli", "--home", str(tmp_path), "--deploy", str(path), "tables"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("factory tables: error: catalog.uri: the REST catalog at"), done.stderr


@pytest.mark.loopback
def test_spark_resource_fails_fast_on_a_master_that_does_not_answer(monkeypatch):
    from resources import SparkResource

    master = f"spark://127.0.0.1:{free_port()}"
    with pytest.raises(DeployError, match=rf"deploy profile embedded: spark\.master: Spark master {master}: .*does not answer"):
        SparkResource(master=master).session()


@pytest.mark.loopback
def test_cli_deploy_check_fails_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"spark: {{master: 'spark://127.0.0.1:{free_port()}'}}\n")
    done = subprocess.run([sys.executable, "-m", "factory.cli", "--home", str(tmp_path), "deploy", "check",
                           "--deploy", str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "spark.master" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "factory.cli", "--home", str(tmp_path), "--deploy", "hive", "tables"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "unknown deploy profile 'hive'" in done.stderr


ENV_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)|environ\.get\(")


def test_only_the_settings_module_reads_the_environment():
    offenders = []
    for folder in ("factory", "resources", "assets", "sensors", "jobs", "configs"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "settings.py" and path.parent.name == "factory":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if ENV_READ.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
