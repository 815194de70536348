"""An OCI image per built environment: a base per Python version, then one layer per
repository@revision holding the environment exactly as it was built (`build_env_image`).

Design: an environment's venv points at the interpreter it was made with (`/env/bin/python` is a
link to it, `pyvenv.cfg` names its directory), so the base of every environment of one Python is
that interpreter at the same path on a minimal Debian (deploy/image/build.sh's base: pulled where a
registry answers, debootstrapped here otherwise), its standard library without site-packages or the
test suite, plus the Debian packages of the shared libraries its extension modules link (libssl3,
libsqlite3-0, ... read off the host with ldd and dpkg; `localhost/factory-env-base:py<version>`,
built once per storage root). The layer
above copies the content-addressed environment (venv at /env, sources at /repo) unchanged and
labels it with the digest, lock hash, repository, revision and base image id, so an image names the
exact environment `envs.builds` recorded and is rebuilt only when that digest or the base changes. Tests then run in
a container with no network (`podman run --network none`), as they ran in the sandbox.

Everything goes through build.sh (`buildah`, `podman`, `base` subcommands), so the image storage,
the isolation flags and the base are the same as the factory image's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from factory.envs.environment import REPO_PATH, VENV_PATH, Environment
from factory.home import CHECKOUT

BUILD_SH = CHECKOUT / "deploy" / "image" / "build.sh"
# Not copied into the base: other packages (the venv has its own), the interpreter's own test
# suite and bytecode caches (the sandbox never writes .pyc either), GUI toolkits.
SKIPPED = {"site-packages", "test", "__pycache__", "idlelib", "tkinter", "turtledemo", "ensurepip"}
# What the standard library's extension modules link on Debian bookworm, where ldd/dpkg cannot say.
RUNTIME_PACKAGES = ("libssl3", "libsqlite3-0", "libffi8", "libreadline8", "libncursesw6", "libbz2-1.0", "liblzma5",
                    "libexpat1", "libuuid1", "zlib1g", "libcrypt1", "libnsl2", "libtirpc3")


class ImageError(RuntimeError):
    """buildah or podman failed (the message holds the command's last lines)."""


class EnvImage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ref: str  # localhost/factory-env/<repo>:<revision>-<digest12>
    image_id: str
    base: str
    built: bool  # False when an image of this digest already existed


def image_ref(env: Environment) -> str:
    revision = "".join(c if c.isalnum() or c in "._-" else "-" for c in env.revision)[:80]
    return f"localhost/factory-env/{env.repo.lower()}:{revision}-{env.digest[:12]}"


def build_env_image(env: Environment) -> EnvImage:
    """The image of `env` (built unless one with its digest label exists), over its Python's base."""
    ref = image_ref(env)
    base = ensure_base()
    base_id = _inspect(base, "{{.Id}}")
    existing = _inspect(ref, '{{.Id}} {{index .Labels "factory.env.digest"}} {{index .Labels "factory.env.base"}}').split()
    if existing[1:] == [env.digest, base_id]:  # the same environment over the same base: nothing to build
        return EnvImage(ref=ref, image_id=existing[0], base=base, built=False)
    labels = {"factory.env.digest": env.digest, "factory.env.lock": env.lock_hash, "factory.env.repo": env.repo,
              "factory.env.revision": env.revision, "factory.env.rule": env.rule, "factory.env.base": base_id}
    containerfile = "\n".join([f"FROM {base}", f"COPY venv/ {VENV_PATH}/", f"COPY src/ {REPO_PATH}/",
                               *(f'LABEL {k}="{v}"' for k, v in labels.items()), f"WORKDIR {REPO_PATH}", ""])
    with tempfile.TemporaryDirectory(prefix="factory-env-image-") as scratch:
        file = Path(scratch) / "Containerfile"
        file.write_text(containerfile)
        # the environment directory itself is the build context (venv/, src/ and the lock beside them)
        _sh("buildah", "bud", "--isolation", "chroot", "--layers", "-f", str(file), "-t", ref,
            env.root)
    return EnvImage(ref=ref, image_id=_inspect(ref, "{{.Id}}"), base=base, built=True)


def ensure_base() -> str:
    """`localhost/factory-env-base:py<X.Y.Z>`: this interpreter on the Debian base, built once."""
    version = ".".join(map(str, sys.version_info[:3]))
    ref = f"localhost/factory-env-base:py{version}"
    if _inspect(ref, "{{.Id}}"):
        return ref
    debian = _sh("base").strip().splitlines()[-1]
    prefix = Path(sys.base_prefix).resolve()
    with tempfile.TemporaryDirectory(prefix="factory-env-base-") as scratch:
        context = Path(scratch)
        _copy_interpreter(prefix, context / "python")
        packages = " ".join(runtime_packages(prefix))
        (context / "Containerfile").write_text(
            f"FROM {debian}\n"
            f"RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            f"{packages} && rm -rf /var/lib/apt/lists/*\n"
            f"COPY python/ {prefix}/\n"
            f'LABEL factory.python="{version}" factory.python.prefix="{prefix}"\n')
        _sh("buildah", "bud", "--isolation", "chroot", "--layers", "-f",
            str(context / "Containerfile"), "-t", ref, str(context))
    return ref


def run_in_image(ref: str, *command: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`command` in a throwaway container of `ref` with no network."""
    argv = [str(BUILD_SH), "run", ref, "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=CHECKOUT,
                          env=_env() | {"FACTORY_IMAGE_NETWORK": "none"})


def runtime_packages(prefix: Path) -> tuple[str, ...]:
    """Debian packages of the libraries the interpreter and its extension modules link (ldd + dpkg -S),
    Tk's left out like tkinter itself; RUNTIME_PACKAGES where those tools are missing."""
    binaries = [*prefix.glob("lib/libpython*.so*"), *prefix.glob("lib/python*/lib-dynload/*.so")]
    binaries = [b for b in binaries if not b.name.startswith("_tkinter")]
    if not binaries or not shutil.which("ldd") or not shutil.which("dpkg"):
        return RUNTIME_PACKAGES
    libraries: set[str] = set()
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30)
        libraries |= {line.split("=>")[1].split()[0] for line in done.stdout.splitlines()
                      if "=> /" in line}
    owners: set[str] = set()
    for library in sorted(libraries):
        for path in (str(Path(library).resolve()), library):
            done = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=30)
            if done.returncode == 0:
                owners.add(done.stdout.split(":")[0].strip())
                break
    owners.discard("libc6")
    return tuple(sorted(owners)) or RUNTIME_PACKAGES


def _copy_interpreter(prefix: Path, dest: Path) -> None:
    """The interpreter's bin/ and lib/ (standard library only) under `dest`."""
    library = Path(sysconfig.get_paths(scheme="posix_prefix", vars={"base": str(prefix)})["stdlib"])
    for part in ("bin", "lib", "include"):
        source = prefix / part
        if not source.is_dir():
            continue
        shutil.copytree(source, dest / part, symlinks=True,
                        ignore=lambda d, names: [n for n in names if n in SKIPPED and Path(d) == library
                                                 or n == "__pycache__"])


def _inspect(ref: str, fmt: str) -> str:
    done = subprocess.run([str(BUILD_SH), "podman", "image", "inspect", "--format", fmt, ref], capture_output=True,
                          text=True, timeout=120, cwd=CHECKOUT, env=_env())
    return done.stdout.strip() if done.returncode == 0 else ""


def _sh(*args: str) -> str:
    done = subprocess.run([str(BUILD_SH), *args], capture_output=True, text=True, timeout=1800, cwd=CHECKOUT,
                          env=_env())
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ImageError(f"build.sh {' '.join(args[:2])} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _env() -> dict[str, str]:
    from factory import settings

    return settings.environment()
