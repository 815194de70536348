"""The package registry side of environment building: which index pip asks, reading an index's
simple pages without pip, resolving requirements to wheels only, the wheelhouse and the lock.

Design: `RegistryConfig.index_url` None means pip's own configuration (pip.conf, PIP_* variables);
a URL (a `file://.../simple` mirror in tests and the demo) means that index alone: pip runs with
PIP_CONFIG_FILE=/dev/null and every other PIP_* variable scrubbed, so no find-links or extra index
of the machine leaks in and a build is reproducible from the mirror.

Resolving is `pip install --dry-run --ignore-installed --only-binary :all: --report`: pip's own
resolver picks the whole closure, and its report names each wheel's URL and sha256, which is then
fetched (urllib: https or file) into the flat wheelhouse `$FACTORY_HOME/wheelhouse/` and verified.
Only wheels: no sdist is ever built, so resolving runs no code of any package (an sdist's setup.py
is code). Wheel filenames on an index are immutable, so a flat directory keyed by filename is
content-addressed enough; the lock records each sha256 and install checks it (`--require-hashes`).

The lock (`lock.json`) lists the direct requirements and every wheel (name, version, filename,
sha256); its hash is the sha256 of its canonical JSON, and is the `lock_hash` of a build.
"""

from __future__ import annotations

import functools
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from factory import settings
from factory.envs.digest import file_sha256
from factory.version import canonical_json

PYPI_SIMPLE = "https://pypi.org/simple"
JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
RESOLVE_TIMEOUT_S = 600


class ResolutionError(RuntimeError):
    """pip could not resolve a set of requirements to wheels; `missing` names what it lacked."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()):
        super().__init__(message)
        self.missing = missing


class RegistryConfig(BaseModel):
    """Which package index resolving, fetching sdists and mirroring use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index_url: str | None = Field(None, description="Simple index URL (e.g. file:///m/simple); None = pip's configured index.")
    extra_index_urls: tuple[str, ...] = Field((), description="Further simple indexes consulted with index_url (URLs).")
    python: str = Field("3.11", description="Interpreter version resolved for (major.minor); must be the sandbox's.")
    uploaded_prior_to: str | None = Field(
        None, description="Resolve as of this ISO 8601 time (pip --uploaded-prior-to): an old sdist's dependencies "
        "as they were at its release. Needs an index with upload times (PyPI; not a file:// mirror).")

    def indexes(self) -> tuple[str, ...]:
        """The index URLs consulted, first one the primary."""
        return ((self.index_url or configured_index()),) + self.extra_index_urls

    def pip_env(self) -> dict[str, str]:
        """The environment pip runs with on the host (see the module docstring)."""
        env = settings.environment()
        if self.index_url is not None:
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = "/dev/null"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return env

    def pip_index_args(self) -> list[str]:
        cutoff = ["--uploaded-prior-to", self.uploaded_prior_to] if self.uploaded_prior_to else []
        if self.index_url is None:
            return cutoff
        return cutoff + ["--index-url", self.index_url] + [
            a for url in self.extra_index_urls for a in ("--extra-index-url", url)]


@functools.cache
def configured_index() -> str:
    """The index pip is configured with here (pip.conf / PIP_INDEX_URL), else PyPI's."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    urls = [line.split("=", 1)[1].strip("'\"") for line in done.stdout.splitlines()
            if line.split("=", 1)[0].endswith(".index-url") and "=" in line]
    return (urls[-1] if urls else PYPI_SIMPLE).rstrip("/")  # the last listed (:env:) wins, as in pip


class IndexFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    filename: str
    url: str
    sha256: str | None


def normalize(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_files(index: str, project: str) -> list[IndexFile]:
    """Every file an index lists for `project` (PEP 691 JSON, else PEP 503 HTML); [] when unknown."""
    url = f"{index.rstrip('/')}/{normalize(project)}/"
    try:
        if url.startswith("file://"):
            page = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)) / "index.html"
            body, kind = (page.read_bytes() if page.exists() else b""), "text/html"
        else:
            request = urllib.request.Request(url, headers={"Accept": JSON_ACCEPT})
            with urllib.request.urlopen(request, timeout=60) as response:
                body, kind = response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise
    if "json" in kind:
        return [IndexFile(filename=f["filename"], url=urllib.parse.urljoin(url, f["url"]),
                          sha256=(f.get("hashes") or {}).get("sha256")) for f in json.loads(body)["files"]]
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    files = []
    for href in parser.hrefs:
        full = urllib.parse.urljoin(url, href)
        path, _, fragment = full.partition("#")
        sha = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        files.append(IndexFile(filename=urllib.parse.unquote(path.rsplit("/", 1)[-1]), url=path, sha256=sha))
    return files


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def fetch_file(url: str, dest: Path, sha256: str | None) -> Path:
    """Download `url` to `dest` (skipped when it is there with the right hash), verifying sha256."""
    if dest.exists() and (sha256 is None or file_sha256(dest) == sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.part")  # concurrent builders
    with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
        shutil.copyfileobj(response, out)
    got = file_sha256(partial)
    if sha256 is not None and got != sha256:
        partial.unlink()
        raise ResolutionError(f"{url}: sha256 {got} does not match the index's {sha256}")
    partial.replace(dest)
    return dest


class LockedWheel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Distribution name, normalized.")
    version: str
    filename: str = Field(description="Wheel filename in the wheelhouse.")
    sha256: str


class Lock(BaseModel):
    """Everything an environment installs, pinned by hash (lock.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str = Field(description="Interpreter version resolved for (major.minor).")
    requirements: tuple[str, ...] = Field(description="The direct requirements, as given to the resolver.")
    wheels: tuple[LockedWheel, ...] = Field(description="The resolved closure, sorted by name.")

    def to_bytes(self) -> bytes:
        return canonical_json(self).encode()

    @property
    def hash(self) -> str:
        import hashlib

        return hashlib.sha256(self.to_bytes()).hexdigest()

    def requirements_text(self, wheels_dir: str = "/wheels") -> str:
        """A pip requirements file installing exactly these wheels from `wheels_dir` (hash-checked)."""
        return "".join(f"{wheels_dir}/{w.filename} --hash=sha256:{w.sha256}\n" for w in self.wheels)


def resolve(requirements: list[str], registry: RegistryConfig, wheelhouse: Path, *,
            constraints: list[str] | None = None) -> Lock:
    """Resolve `requirements` (pinned by `constraints`, 'name==version' lines) to wheels only,
    fetch them into `wheelhouse`, and lock them."""
    reqs = sorted(dict.fromkeys(r.strip() for r in requirements if r.strip()))
    with tempfile.TemporaryDirectory(prefix="factory-resolve-") as scratch:
        req_file, report = Path(scratch) / "requirements.txt", Path(scratch) / "report.json"
        req_file.write_text("".join(r + "\n" for r in reqs))
        pins = Path(scratch) / "constraints.txt"
        pins.write_text("".join(c + "\n" for c in constraints or ()))
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary", ":all:",
                "--python-version", registry.python, "--no-cache-dir", "--quiet", "--report", str(report),
                *registry.pip_index_args(), "-r", str(req_file), "-c", str(pins)]
        done = subprocess.run(argv, capture_output=True, text=True, env=registry.pip_env(), timeout=RESOLVE_TIMEOUT_S,
                              cwd=scratch)
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip()
            missing = tuple(dict.fromkeys(re.findall(r"No matching distribution found for ([^\s;]+)", text)))
            raise ResolutionError(f"pip could not resolve {reqs} to wheels: {text[-1500:]}", missing)
        installs = json.loads(report.read_text())["install"]
    wheels = []
    for item in installs:
        info = item["download_info"]
        url = info["url"]
        sha = (info.get("archive_info") or {}).get("hashes", {}).get("sha256")
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not filename.endswith(".whl"):
            raise ResolutionError(f"pip resolved {item['metadata']['name']} to {filename}, which is not a wheel")
        path = fetch_file(url, wheelhouse / filename, sha)
        wheels.append(LockedWheel(name=normalize(item["metadata"]["name"]), version=item["metadata"]["version"],
                                  filename=filename, sha256=sha or file_sha256(path)))
    return Lock(python=registry.python, requirements=tuple(reqs), wheels=tuple(sorted(wheels, key=lambda w: w.name)))


def has_only_sdists(registry: RegistryConfig, requirement: str) -> bool:
    """Whether an index lists files for `requirement`'s project but no wheel at all (→ no_wheel)."""
    project = re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0]
    files = [f for index in registry.indexes() for f in project_files(index, project)]
    return bool(files) and not any(f.filename.endswith(".whl") for f in files)
