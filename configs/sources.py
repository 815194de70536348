"""The three embedded sources: real code and text that ship with the machine.

- `python_stdlib`: the running interpreter's standard-library `.py` files (~1,800, ~34 MB);
- `site_packages`: the `.py` files of the installed stack (~23,000, ~410 MB) — real duplicates
  included, through vendored copies;
- `package_docs`: the long descriptions in installed distributions' `METADATA` files.

Demo defaults cap `site_packages` with a deterministic sample so the whole `make demo` stays
within minutes on 2 cores; `full=True` lifts the caps (the full corpus is one argument away).
Files that are not UTF-8 (the stdlib ships a few on purpose, as encoding tests) are skipped and
counted rather than failing the embedded sources.
"""

from __future__ import annotations

from factory.data.sources import DirectorySource, PackageDocsSource, SourceConfig

SKIP_DIRS = ["**/__pycache__/**"]


def python_stdlib(full: bool = False) -> DirectorySource:
    """The running interpreter's standard-library `.py` files."""
    return DirectorySource(
        name="python_stdlib",
        root="{stdlib}",
        include=["**/*.py"],
        exclude=["site-packages/**", "dist-packages/**", *SKIP_DIRS],
        license="PSF-2.0",
        max_file_bytes=None if full else 1_000_000,
        on_invalid="skip",
    )


def site_packages(full: bool = False) -> DirectorySource:
    """`.py` files of the installed packages (deterministic 4,000-file sample by default)."""
    return DirectorySource(
        name="site_packages",
        root="{purelib}",
        include=["**/*.py"],
        exclude=SKIP_DIRS,
        license_from_dist_info=True,
        max_documents=None if full else 4_000,
        max_file_bytes=None if full else 200_000,
        on_invalid="skip",
    )


def package_docs(full: bool = False) -> PackageDocsSource:
    """Long descriptions from installed distributions' METADATA files."""
    return PackageDocsSource(name="package_docs", root="{purelib}", min_chars=200, on_invalid="skip")


EMBEDDED = {"python_stdlib": python_stdlib, "site_packages": site_packages, "package_docs": package_docs}


def embedded_source(name: str, full: bool = False) -> SourceConfig:
    """The embedded source called `name`, by its config function."""
    if name not in EMBEDDED:
        raise KeyError(f"unknown source {name!r}; embedded sources: {', '.join(EMBEDDED)}")
    return EMBEDDED[name](full=full)
