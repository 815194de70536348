"""`LakeResource`: the Iceberg catalog of the deployment profile, as a Dagster resource.

The catalog is configured in one place, the profile (`configs/deploy`, chosen by `FACTORY_DEPLOY`
when a run first asks for the lake, never at import): the embedded sqlite `SqlCatalog` under
`$FACTORY_HOME/lake`, or an Iceberg REST catalog on object storage whose credentials the profile
names as environment variables. `deploy` pins a profile for this resource (a name or a file, e.g.
`EnvVar("FACTORY_DEPLOY")`); `home` moves local state (artifacts, MLflow) elsewhere.
"""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from factory.deploy import DeployConfig, load_profile, open_lake
from factory.lake import Lake


class LakeResource(ConfigurableResource):
    """Opens the profile's lake once per process, on first use."""

    home: Optional[str] = None
    deploy: Optional[str] = None
    """Deployment profile (configs/deploy name or .yaml/.json file); None = the active one."""

    _lake: Optional[Lake] = PrivateAttr(default=None)
    _profile: Optional[DeployConfig] = PrivateAttr(default=None)

    def profile(self) -> DeployConfig:
        if self._profile is None:
            self._profile = load_profile(self.deploy)
        return self._profile

    def lake(self) -> Lake:
        if self._lake is None:
            self._lake = open_lake(self.profile(), home=self.home)
        return self._lake
