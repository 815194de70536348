"""Validate rendered Kubernetes objects before anything is written or applied.

Every object `factory deploy render` produces (cluster manifests, the per-kind example Jobs and
pods) passes through `validate(objects, version)`:

1. The schema of its kind at the profile's `cluster_version`, from `kubernetes-validate`'s
   strict schemas (the OpenAPI of Kubernetes 1.25-1.37 as JSON Schema, with
   `additionalProperties: false`): a misspelt field (`nodeSelecter`), a wrong type or a missing
   required field is an error, offline, not a `kubectl apply` that half-succeeds.
2. Every resource quantity (container and PVC requests/limits, HPA targets, emptyDir size
   limits, Kueue quotas) through `kubernetes.utils.parse_quantity`, the client's own parser:
   the schemas type a quantity as "string or number", so `cpu: "8 cores"` passes them and only
   fails when the API server parses it.
3. `metadata.name` as a DNS-1123 name, which the schemas do not check either.

Custom resources the factory renders (Kueue's LocalQueue, ClusterQueue, ResourceFlavor; the
Prometheus Operator's PrometheusRule and PodMonitor) have no schema in the package: they are
checked against the small schemas below (the fields we write and a few close ones from the CRDs,
nothing else), so a typo in them is caught the same way.

Errors raise `DeployError` naming the object (`Kind/name`), the field path and the problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import jsonschema

from factory.deploy.config import DeployError

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# keys whose every value is a quantity (resources.requests/limits, ResourceQuota.hard, Kueue)
QUANTITY_MAPS = {"requests", "limits", "hard", "capacity"}
# keys whose single value is a quantity
QUANTITY_KEYS = {"sizeLimit", "averageValue", "nominalQuota", "borrowingLimit", "lendingLimit"}

_NAME = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}


def _crd(spec: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": _NAME,
                           "spec": {"type": "object", "additionalProperties": False, "properties": spec,
                                    "required": list(required)}}}


_QUOTA = {"type": "object", "required": ["name", "nominalQuota"], "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "nominalQuota": {"type": ["string", "integer"]},
                         "borrowingLimit": {"type": ["string", "integer"]}}}
_FLAVOR = {"type": "object", "required": ["name", "resources"], "additionalProperties": False,
           "properties": {"name": {"type": "string"}, "resources": {"type": "array", "items": _QUOTA}}}
_GROUP = {"type": "object", "required": ["coveredResources", "flavors"], "additionalProperties": False,
          "properties": {"coveredResources": {"type": "array", "items": {"type": "string"}},
                         "flavors": {"type": "array", "items": _FLAVOR}}}
KUEUE = "kueue.x-k8s.io/v1beta1"
CRD_SCHEMAS = {
    (KUEUE, "LocalQueue"): _crd({"clusterQueue": {"type": "string"}}),
    (KUEUE, "ResourceFlavor"): _crd({"nodeLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                                     "tolerations": {"type": "array"}}),
    (KUEUE, "ClusterQueue"): _crd({"namespaceSelector": {"type": "object"}, "cohort": {"type": "string"},
                                   "queueingStrategy": {"enum": ["BestEffortFIFO", "StrictFIFO"]},
                                   "preemption": {"type": "object"},
                                   "resourceGroups": {"type": "array", "items": _GROUP}}),
}
# Prometheus Operator (monitoring.coreos.com/v1), after its CRDs' field names and duration pattern
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                          r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_RULE = {"type": "object", "required": ["expr"], "additionalProperties": False,
         "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
         "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                        "expr": {"type": ["string", "integer"]}, "for": _DURATION, "keep_firing_for": _DURATION,
                        "labels": _STRINGS, "annotations": _STRINGS}}
_RULE_GROUP = {"type": "object", "required": ["name", "rules"], "additionalProperties": False,
               "properties": {"name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                              "query_offset": _DURATION, "limit": {"type": "integer"}, "labels": _STRINGS,
                              "rules": {"type": "array", "items": _RULE}}}
_SELECTOR = {"type": "object", "additionalProperties": False,
             "properties": {"matchLabels": _STRINGS, "matchExpressions": {"type": "array"}}}
_POD_ENDPOINT = {"type": "object", "additionalProperties": False, "anyOf": [{"required": ["port"]},
                                                                            {"required": ["portNumber"]}],
                 "properties": {"port": {"type": "string"}, "portNumber": {"type": "integer"},
                                "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                                "interval": _DURATION, "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
                                "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"}}}
MONITORING = "monitoring.coreos.com/v1"
CRD_SCHEMAS |= {
    (MONITORING, "PrometheusRule"): _crd({"groups": {"type": "array", "items": _RULE_GROUP}}, ("groups",)),
    (MONITORING, "PodMonitor"): _crd({"selector": _SELECTOR, "namespaceSelector": {"type": "object"},
                                      "jobLabel": {"type": "string"}, "podTargetLabels": {"type": "array"},
                                      "podMetricsEndpoints": {"type": "array", "minItems": 1,
                                                              "items": _POD_ENDPOINT}},
                                     ("selector", "podMetricsEndpoints")),
}


def object_name(obj: dict) -> str:
    """`Kind/name` of a manifest, for error messages and file names."""
    return f"{obj.get('kind', '?')}/{(obj.get('metadata') or {}).get('name', '?')}"


def quantities(node, path: str = "") -> Iterator[tuple[str, object]]:
    """Every (field path, value) in `node` that Kubernetes parses as a resource quantity."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key in QUANTITY_MAPS and isinstance(value, dict):
                for name, q in value.items():
                    yield f"{where}.{name}", q
            elif key in QUANTITY_KEYS and not isinstance(value, (dict, list)):
                yield where, value
            else:
                yield from quantities(value, where)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from quantities(item, f"{path}[{i}]")


def _schema_problem(obj: dict, version: str) -> str | None:
    import kubernetes_validate

    crd = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    try:
        if crd is not None:
            jsonschema.Draft202012Validator(crd).validate(obj)
        else:
            kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as e:
        return e.message
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        return f"{where}: {e.message}"
    except KeyError as e:
        return f"no {e.args[0]} field"
    return None


def validate_object(obj: dict, version: str) -> None:
    """One object: its schema at `version` (strict), its quantities, its name; DeployError naming it."""
    from kubernetes.utils import parse_quantity

    if not isinstance(obj, dict):
        raise DeployError(f"not a Kubernetes object (a mapping with apiVersion and kind): {obj!r:.80}")
    who = object_name(obj)
    problem = _schema_problem(obj, version)
    if problem:
        raise DeployError(f"{who} is invalid for Kubernetes {version}: {problem}")
    name = obj["metadata"].get("name", "")
    if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise DeployError(f"{who}: metadata.name {name!r} is not a DNS-1123 name (lowercase, digits, '-', '.')")
    for where, value in quantities(obj):
        try:
            parse_quantity(value)
        except (ValueError, TypeError) as e:
            raise DeployError(f"{who}: {where} = {value!r} is not a Kubernetes quantity ({e})") from None


def validate(objects: list[dict], version: str) -> None:
    """Every object against Kubernetes `version` ("1.33"; a leading v is fine); the first problem
    raises `DeployError` naming the object. Two objects of one kind, namespace and name also fail
    (the second would silently replace the first on apply)."""
    from kubernetes_validate.utils import all_versions, major_minor

    version = version.removeprefix("v")
    shipped = sorted({major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    if major_minor(version) not in shipped:
        raise DeployError(f"Kubernetes version {version!r}: kubernetes-validate ships schemas for "
                          f"{shipped[0]}..{shipped[-1]} only")
    seen: set[tuple] = set()
    for obj in objects:
        validate_object(obj, version)
        key = (obj["apiVersion"].split("/")[0], obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in seen:
            raise DeployError(f"{object_name(obj)}: rendered twice (namespace {key[2]!r})")
        seen.add(key)
