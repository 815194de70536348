"""Repository sources: where a repository comes from (`RepoSource`), named sets of them
(`RepoSet`), and `fetch_source`, which puts one on disk without running any of its code.

A source is exactly one of: a local directory (`path`), a git URL at a revision (`git` + `rev`), or
a PyPI sdist (`sdist="name==version"`). Its revision is what makes a build reproducible: the sdist's
version, the git commit sha, or `local-<tree digest>` for a directory.

Why sdists are fetched by hand: `pip download` of an sdist prepares its metadata, which runs its
setup.py — untrusted code on the host, before any sandbox. Instead the index's simple page (PEP 691
JSON or PEP 503 HTML) is read with urllib, the file is checked against the index's sha256, and the
archive is unpacked with tarfile's `data` filter after refusing absolute paths, `..` members and
links that leave the tree.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, model_validator

from factory.envs.digest import SKIPPED, tree_digest
from factory.envs.registry import RegistryConfig, fetch_file, normalize, project_files

SDIST = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)$")
SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")


class SourceError(RuntimeError):
    """A repository could not be fetched (names the source and the problem)."""


class RepoSource(BaseModel):
    """One repository: a local path, a git URL at a revision, or a PyPI sdist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Repository name (unique in its set).")
    path: str | None = Field(None, description="Local directory holding the repository (absolute or relative path).")
    git: str | None = Field(None, description="Git URL to clone (needs `rev`).")
    rev: str | None = Field(None, description="Git revision to check out: a commit sha, tag or branch.")
    sdist: str | None = Field(None, description="A PyPI sdist as 'name==version'.")

    @model_validator(mode="after")
    def _one_kind(self) -> "RepoSource":
        given = [k for k in ("path", "git", "sdist") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"repository {self.name!r}: give exactly one of path, git, sdist (got {given or 'none'})")
        if (self.git is None) != (self.rev is None):
            raise ValueError(f"repository {self.name!r}: `rev` goes with `git`, and `git` needs one")
        if self.sdist is not None and not SDIST.match(self.sdist):
            raise ValueError(f"repository {self.name!r}: sdist {self.sdist!r} is not 'name==version'")
        return self

    @property
    def kind(self) -> str:
        return "path" if self.path is not None else "git" if self.git is not None else "sdist"


class RepoSet(BaseModel):
    """A named set of repositories, built together (`factory envs build --repos NAME`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", description="Set name (a Dagster partition key).")
    repos: tuple[RepoSource, ...] = Field(description="The repositories, in build order.")

    @model_validator(mode="after")
    def _unique(self) -> "RepoSet":
        names = [r.name for r in self.repos]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"repository set {self.name!r}: names repeat: {duplicates}")
        return self


class FetchedSource(BaseModel):
    """A repository on disk, and what it was."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: RepoSource
    src_dir: str = Field(description="Host directory of the repository's tree.")
    revision: str = Field(description="Sdist version, git commit sha, or 'local-<tree digest>'.")
    origin: str = Field(description="Lineage id of the source version, e.g. 'source/sdist/six==1.16.0'.")


def fetch_source(source: RepoSource, dest: Path, registry: RegistryConfig | None = None) -> FetchedSource:
    """Put `source`'s tree at `dest` (which must not exist) and say which revision it is."""
    dest = Path(dest)
    if dest.exists():
        raise SourceError(f"repository {source.name}: destination {dest} exists already")
    if source.path is not None:
        root = Path(source.path).expanduser().resolve()
        if not root.is_dir():
            raise SourceError(f"repository {source.name}: path {root} is not a directory")
        shutil.copytree(root, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIPPED, "*.pyc"))
        revision = f"local-{tree_digest(dest)[:16]}"
        return FetchedSource(source=source, src_dir=str(dest), revision=revision, origin=f"source/path/{root}@{revision}")
    if source.git is not None:
        return _fetch_git(source, dest)
    return _fetch_sdist(source, dest, registry or RegistryConfig())


def _fetch_git(source: RepoSource, dest: Path) -> FetchedSource:
    def git(*args: str, cwd: Path | None = None) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                              env={"PATH": "/usr/bin:/bin", "GIT_TERMINAL_PROMPT": "0"})
        if done.returncode != 0:
            verb = next(a for a in args if not a.startswith("-") and "=" not in a)
            raise SourceError(f"repository {source.name}: git {verb} failed: {done.stderr.strip()[-500:]}")
        return done.stdout.strip()

    git("clone", "--quiet", "--no-checkout", str(source.git), str(dest))
    git("-c", "advice.detachedHead=false", "checkout", "--quiet", str(source.rev), cwd=dest)
    sha = git("rev-parse", "HEAD", cwd=dest)
    shutil.rmtree(dest / ".git")  # the tree is the build input; history is not (and is not reproducible)
    return FetchedSource(source=source, src_dir=str(dest), revision=sha, origin=f"{source.git}@{sha}")


def sdist_file(registry: RegistryConfig, name: str, version: str):
    """The index entry of `name==version`'s sdist (first index that has one), or SourceError."""
    for index in registry.indexes():
        for f in project_files(index, name):
            if not f.filename.endswith(SDIST_SUFFIXES):
                continue
            stem = next(f.filename[: -len(s)] for s in SDIST_SUFFIXES if f.filename.endswith(s))
            file_name, _, file_version = stem.rpartition("-")
            if normalize(file_name) == normalize(name) and file_version == version:
                return f
    raise SourceError(f"sdist {name}=={version}: no sdist file on {', '.join(registry.indexes())}")


def _fetch_sdist(source: RepoSource, dest: Path, registry: RegistryConfig) -> FetchedSource:
    match = SDIST.match(source.sdist or "")
    assert match is not None  # validated
    name, version = match["name"], match["version"]
    entry = sdist_file(registry, name, version)
    archive = fetch_file(entry.url, dest.parent / f".{dest.name}.{entry.filename}", entry.sha256)
    try:
        unpack(archive, dest)
    finally:
        archive.unlink(missing_ok=True)
    return FetchedSource(source=source, src_dir=str(dest), revision=version, origin=f"source/sdist/{name}=={version}")


def unpack(archive: Path, dest: Path) -> None:
    """Unpack an sdist archive's single top directory as `dest`, refusing unsafe members."""
    staging = dest.with_name(dest.name + ".unpack")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    _check_member(archive, member)
                z.extractall(staging)
        else:
            with tarfile.open(archive) as t:
                for member in t.getmembers():
                    _check_member(archive, member.name)
                    if member.islnk() or member.issym():
                        _check_member(archive, str(PurePosixPath(member.name).parent / member.linkname))
                t.extractall(staging, filter="data")
        tops = list(staging.iterdir())
        (tops[0] if len(tops) == 1 and tops[0].is_dir() else staging).rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_member(archive: Path, name: str) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or name.startswith("\\"):
        raise SourceError(f"{archive.name}: member {name!r} would land outside the unpacked tree; refused")
