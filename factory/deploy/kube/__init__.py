"""The factory on Kubernetes: manifests and Helm values rendered from a deploy profile's
`kubernetes` section, validated offline against the cluster version's strict schemas
(`validate.py`), and written by `factory deploy render` (`render.py`). Modules here build plain
dicts; nothing imports a Kubernetes client at import time."""
