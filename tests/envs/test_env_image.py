"""factory.envs.image: a built environment becomes an OCI image layer over its Python's base, and its
tests pass in a container with no network. Runs on CPU with buildah and podman (apt: `make system`),
on deploy/image/build.sh's storage and base (made by tests/deploy/test_image.py or here, once per
machine: about 2 minutes cold, seconds after)."""

from __future__ import annotations

import pytest

from factory.envs.build import build_repos
from factory.envs.environment import Environment
from factory.envs.image import build_env_image, ensure_base, image_ref, run_in_image
from factory.envs.sources import RepoSet, RepoSource

from envs_fixtures import pyproject, write_repo

REPO = {
    "pyproject.toml": pyproject("boxed"),
    "src/boxed/__init__.py": "def area(w, h):\n    return w * h\n",
    "tests/test_boxed.py": """
        import socket
        from boxed import area

        def test_area():
            assert area(2, 3) == 6

        def test_no_network_in_the_container():
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex(("10.255.255.1", 80)) != 0
    """,
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory, registry) -> Environment:
    root = tmp_path_factory.mktemp("image")
    write_repo(root / "boxed", REPO)
    [record] = build_repos(RepoSet(name="image", repos=(RepoSource(name="boxed", path=str(root / "boxed")),)),
                           home=root / "home", registry=registry)
    assert record.failure_class.value == "passed", record.failure_detail
    return Environment.load(record.env_uri.removeprefix("file://"))


def test_environment_image_runs_its_tests_offline(env):
    image = build_env_image(env)
    assert image.ref == image_ref(env) and image.base == ensure_base()
    labels = run_in_image(image.ref, "/env/bin/python", "-c", "import ssl, sqlite3, ctypes, lzma; print('ok')")
    assert labels.returncode == 0 and labels.stdout.strip() == "ok", labels.stderr
    done = run_in_image(image.ref, "/env/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
    again = build_env_image(env)  # same digest: the existing image, not a rebuild
    assert not again.built and again.image_id == image.image_id
