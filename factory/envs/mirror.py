"""A local package index holding everything a repository set needs: `mirror(repo_set, dest)`.

Layout (PEP 503): `dest/files/` holds the files, `dest/simple/index.html` lists the projects and
`dest/simple/<project>/index.html` links each file as `../../files/<name>#sha256=<hex>`. It holds
the set's sdists, the whole wheel closure of each repository's plan (requirements, test
requirements, build-system requires, pytest), and the default tools (test runner and build
backends, `TOOLS`) that test fixtures build with. Builds, tests and the demo then resolve against
`RegistryConfig(index_url=(dest / "simple").as_uri())` with no network.

Idempotent: a file already in `dest/files` with its index hash is not fetched again; the index
pages are rewritten from the directory's contents each time (so two mirrors into one `dest` add up).
Nothing is executed: sdists are unpacked and read statically (detect.py), and only wheels resolve.
"""

from __future__ import annotations

import html
import re
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from factory.envs.detect import detect
from factory.envs.digest import file_sha256
from factory.envs.registry import RegistryConfig, ResolutionError, fetch_file, normalize, resolve
from factory.envs.sources import SDIST, RepoSet, sdist_file, unpack

TOOLS = ("pytest", "setuptools", "wheel", "flit_core", "hatchling", "editables", "poetry-core", "pdm-backend",
         "setuptools_scm")
WHEEL = re.compile(r"^(?P<name>[^-]+)-")


class MirrorReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    dest: str
    files: int
    projects: int
    failures: dict[str, str]  # repository -> why its closure is not (wholly) in the mirror


def mirror(repo_set: RepoSet | None, dest: Path, registry: RegistryConfig | None = None,
           tools: tuple[str, ...] = TOOLS) -> MirrorReport:
    """Fill `dest` with `repo_set`'s sdists, their wheel closures and `tools` (see the module docstring)."""
    registry = registry or RegistryConfig()
    dest = Path(dest)
    files = dest / "files"
    files.mkdir(parents=True, exist_ok=True)
    failures: dict[str, str] = {}
    if tools:
        try:
            resolve(list(tools), registry, files)
        except ResolutionError as exc:
            failures["(tools)"] = str(exc)[:500]
    for source in repo_set.repos if repo_set else ():
        if source.sdist is None:
            continue  # local and git sources are not the index's to hold
        match = SDIST.match(source.sdist)
        assert match is not None
        try:
            entry = sdist_file(registry, match["name"], match["version"])
            archive = fetch_file(entry.url, files / entry.filename, entry.sha256)
            with tempfile.TemporaryDirectory(prefix="factory-mirror-") as scratch:
                unpack(archive, Path(scratch) / "src")
                plan = detect(Path(scratch) / "src")
            resolve([*plan.build_requires, *plan.requirements, *plan.test_requirements], registry, files,
                    constraints=list(plan.constraints))
        except Exception as exc:  # one repository's gap is reported, the rest still mirror
            failures[source.name] = f"{type(exc).__name__}: {str(exc)[:500]}"
    projects = write_index(dest)
    return MirrorReport(dest=str(dest), files=sum(1 for f in files.iterdir() if f.is_file()), projects=projects,
                        failures=failures)


def project_of(filename: str) -> str | None:
    """The normalized project name of a wheel or sdist filename."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    for suffix in (".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if filename.endswith(suffix):
            return normalize(filename[: -len(suffix)].rpartition("-")[0])
    return None


def write_index(dest: Path) -> int:
    """(Re)write `dest/simple` from the files in `dest/files`; returns the number of projects."""
    by_project: dict[str, list[Path]] = {}
    for path in sorted((dest / "files").iterdir()):
        name = project_of(path.name) if path.is_file() and not path.name.endswith(".part") else None
        if name:
            by_project.setdefault(name, []).append(path)
    simple = dest / "simple"
    staging = Path(tempfile.mkdtemp(prefix=".simple-", dir=dest))
    for name, paths in by_project.items():
        (staging / name).mkdir()
        links = "".join(f'<a href="../../files/{html.escape(p.name)}#sha256={file_sha256(p)}">{html.escape(p.name)}</a><br>\n'
                        for p in paths)
        (staging / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    top = "".join(f'<a href="{n}/">{n}</a><br>\n' for n in sorted(by_project))
    (staging / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{top}</body></html>\n")
    staging.chmod(0o755)
    old = dest / ".simple-old"
    shutil.rmtree(old, ignore_errors=True)
    if simple.exists():
        simple.rename(old)
    staging.rename(simple)
    shutil.rmtree(old, ignore_errors=True)
    return len(by_project)
