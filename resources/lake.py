"""`LakeResource`: the Iceberg catalog as a Dagster resource.

Embedded default: the sqlite `SqlCatalog` under `$FACTORY_HOME/lake` (FACTORY_HOME resolved when
a run first asks for the lake, never at import). At scale: `catalog_kind="rest"` with the REST
endpoint and object-store settings; secrets come in as `EnvVar`s, e.g.

    LakeResource(catalog_kind="rest", catalog_uri=EnvVar("ICEBERG_REST_URI"),
                 warehouse="s3://lake/warehouse", s3_endpoint="http://minio:9000",
                 s3_access_key_id=EnvVar("AWS_ACCESS_KEY_ID"),
                 s3_secret_access_key=EnvVar("AWS_SECRET_ACCESS_KEY"))
"""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from factory.lake import CatalogConfig, Lake


class LakeResource(ConfigurableResource):
    """Opens the factory's lake once per process, on first use."""

    home: Optional[str] = None
    catalog_kind: str = "sql"
    catalog_uri: Optional[str] = None
    warehouse: Optional[str] = None
    s3_endpoint: Optional[str] = None
    s3_access_key_id: Optional[str] = None
    s3_secret_access_key: Optional[str] = None
    token: Optional[str] = None

    _lake: Optional[Lake] = PrivateAttr(default=None)

    def catalog_config(self) -> CatalogConfig:
        props = {
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.s3_access_key_id,
            "s3.secret-access-key": self.s3_secret_access_key,
            "token": self.token,
        }
        return CatalogConfig(
            kind=self.catalog_kind,
            uri=self.catalog_uri,
            warehouse=self.warehouse,
            properties={k: v for k, v in props.items() if v},
        )

    def lake(self) -> Lake:
        if self._lake is None:
            self._lake = Lake.open(self.catalog_config(), home=self.home)
        return self._lake
