"""`factory deploy render`: every file a cluster install needs, validated before any is written.

The output directory holds, for one profile:

    values.yaml                 Dagster's chart values (helm.py)
    00-access.yaml ...          the factory's own objects, one file per group in apply order (cluster.py)
    kustomization.yaml          those files in apply order (`kubectl apply -k DIR`)
    examples/*.yaml             what the run launcher and Pipes create per asset kind (a run Job, a step
                                Job, a training pod set), for review; never applied
    README.md                   the apply order and the install commands

Every object (groups and examples) is validated strictly against the profile's `cluster_version`
(validate.py) and the whole set is built in a temporary directory beside the target, renamed into
place only when all of it is valid: an invalid profile leaves the old output (or nothing) in place,
never half a directory of manifests.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from factory.deploy.config import DeployConfig, DeployError
from factory.deploy.kube.cluster import cluster_manifests
from factory.deploy.kube.helm import CHART, CHART_REPO, CHART_VERSION, RELEASE, dump_all_yaml, dump_yaml, \
    require_kubernetes, values_yaml
from factory.deploy.kube.validate import object_name, validate


def example_objects(profile: DeployConfig) -> dict[str, dict]:
    """The kube helper's per-kind examples (resources/k8s_manifests.py builds them with dagster-k8s's own
    Job builder, so they live outside factory/); {} when that module is not there."""
    try:
        from resources.k8s_manifests import example_manifests
    except ModuleNotFoundError as e:
        if e.name in ("resources", "resources.k8s_manifests"):
            return {}
        raise
    return example_manifests(profile)


def _readme(profile: DeployConfig, groups: list[str], examples: list[str]) -> str:
    k8s = profile.kubernetes
    lines = [f"# Cluster files of deploy profile `{profile.name}` (Kubernetes {k8s.cluster_version})", "",
             f"Rendered by `factory deploy render --deploy {profile.name}`; every object validated strictly "
             f"for Kubernetes {k8s.cluster_version}. Apply in this order (deploy/README.md has the whole install):", "",
             "```sh"]
    lines += [f"kubectl apply -f {name}.yaml" for name in groups]
    lines += ["# or all of them: kubectl apply -k .",
              f"# fill the Secret templates (02-secrets.yaml) with real values, then:",
              f"helm repo add dagster {CHART_REPO}",
              f"helm upgrade --install {RELEASE} {CHART} --version {CHART_VERSION} -n {k8s.namespace} -f values.yaml",
              "```"]
    if examples:
        lines += ["", "`examples/` shows what the run launcher and Pipes create per asset kind; it is for review and "
                      "is not applied:", ""] + [f"- examples/{name}" for name in examples]
    return "\n".join(lines) + "\n"


def render_files(profile: DeployConfig) -> dict[str, str]:
    """Relative path -> text of every output file; DeployError (naming the object) on any invalid one."""
    k8s = require_kubernetes(profile)
    groups = cluster_manifests(profile)
    examples = example_objects(profile)
    every = [obj for objects in groups.values() for obj in objects]
    validate(every, k8s.cluster_version)
    for name, obj in examples.items():
        try:
            validate([obj], k8s.cluster_version)
        except DeployError as e:
            raise DeployError(f"examples/{name}: {e}") from None
    files = {"values.yaml": values_yaml(profile)}
    header = f"# Deploy profile {profile.name!r}, rendered by `factory deploy render` (do not edit by hand).\n"
    for name, objects in groups.items():
        files[f"{name}.yaml"] = header + dump_all_yaml(objects)
    for name, obj in examples.items():
        files[f"examples/{name}"] = f"# Example ({object_name(obj)}) for review: created by Dagster at run time, " \
                                    f"never applied.\n" + dump_yaml(obj)
    files["kustomization.yaml"] = header + dump_yaml({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{name}.yaml" for name in groups]})
    files["README.md"] = _readme(profile, list(groups), list(examples))
    return files


def write_render(profile: DeployConfig, out: Path | str) -> list[Path]:
    """Render, validate, write into a temporary directory, then move it to `out` (replacing what was
    there). Nothing at `out` changes when anything is invalid. The written paths, in order."""
    out = Path(out)
    files = render_files(profile)  # raises before anything touches the disk
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        old = None
        if out.exists():
            old = out.parent / f"{tmp.name}.old"
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / rel for rel in files]
