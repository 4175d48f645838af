"""The pre-submit gate: golden manifests (good, and each violation alone) with pinned outputs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import EXPECTED, MANIFESTS, GiB, Result, run_process
from triage.contract.errors import ManifestError
from triage.contract.load import ContractFile
from triage.contract.manifest import audit_documents, declared_workers, parse_documents

REGEN = os.environ.get("TRIAGE_REGEN_GOLDEN") == "1"  # rewrite fixtures/expected/ after a deliberate change

# manifest → (exit code, {check id: status} of the non-passing checks)
GOLDEN: dict[str, tuple[int, dict[str, str]]] = {
    "good.yaml": (0, {}),
    "pytorchjob.yaml": (0, {}),
    "deployment_mig.yaml": (0, {}),
    "shm_no_mount.yaml": (1, {"shm.medium": "fail"}),
    "shm_disk.yaml": (1, {"shm.medium": "fail"}),
    "shm_15gi.yaml": (1, {"shm.size": "fail"}),
    "shm_16gi.yaml": (0, {"shm.size": "warn"}),
    "shm_capped.yaml": (1, {"shm.size": "fail"}),
    "cpu_31.yaml": (1, {"cpu.per_gpu": "fail", "dataloader.workers": "warn"}),
    "no_memory_limit.yaml": (1, {"memory.limit": "fail", "numa.alignment": "warn"}),
    "gpu_fractional.yaml": (1, {"gpu.request": "fail"}),
    "gpu_requests_only.yaml": (1, {"gpu.request": "fail"}),
    "mig_malformed.yaml": (1, {"gpu.request": "fail"}),
    "dataloader_oversubscribed.yaml": (0, {"dataloader.workers": "warn"}),
    "burstable.yaml": (0, {"numa.alignment": "warn"}),
}


def _audit(
    triage_json: Callable[..., tuple[int, dict[str, Any]]], name: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    return triage_json("audit", "manifest", name, *extra)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_manifest(
    name: str, triage_json: Callable[..., tuple[int, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(MANIFESTS)
    rc, report = _audit(triage_json, name)
    expected_rc, off = GOLDEN[name]
    assert rc == expected_rc
    assert {c["id"]: c["status"] for c in report["checks"] if c["status"] != "pass"} == off
    assert report["contract_version"] == "2025.1"
    assert report["status"] == ("fail" if rc else "warn" if off else "pass")
    golden = EXPECTED / (Path(name).stem + ".json")
    if REGEN:
        golden.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    assert report == json.loads(golden.read_text())


def test_every_manifest_fixture_is_pinned() -> None:
    bad_inputs = {"bad_yaml.yaml", "unknown_kind.yaml", "no_containers.yaml"}
    assert {p.name for p in MANIFESTS.glob("*.yaml")} == set(GOLDEN) | bad_inputs


def test_golden_sentences_carry_the_numbers(
    triage_json: Callable[..., tuple[int, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(MANIFESTS)

    def check(name: str, check_id: str) -> dict[str, Any]:
        _, report = _audit(triage_json, name)
        (found,) = [c for c in report["checks"] if c["id"] == check_id]
        return found

    # /dev/shm: 16Gi meets the floor (warns: below the SLA), 15Gi fails
    at_floor = check("shm_16gi.yaml", "shm.size")
    assert (
        at_floor["sentence"]
        == "/dev/shm is 16 GiB: meets the contract floor of 16 GiB but is below the SLA of 64 GiB"
    )
    assert (at_floor["value"], at_floor["threshold"]) == (16 * GiB, 64 * GiB)
    below = check("shm_15gi.yaml", "shm.size")
    assert below["sentence"] == "/dev/shm is 15 GiB, below the contract floor of 16 GiB (SLA 64 GiB)"
    assert (below["value"], below["threshold"], below["related_verdict"]) == (
        15 * GiB,
        16 * GiB,
        "shm_exhausted",
    )
    # CPUs: 32 for 8 GPUs passes, 31 fails
    ok = check("good.yaml", "cpu.per_gpu")
    assert ok["sentence"] == "32 CPUs requested for 8 GPUs (4 per GPU): meets the contract's 4 per GPU"
    short = check("cpu_31.yaml", "cpu.per_gpu")
    assert (
        short["sentence"]
        == "31 CPUs requested for 8 GPUs (3.88 per GPU), below the contract's 4 per GPU (32 CPUs)"
    )
    assert (short["value"], short["threshold"], short["fix"]) == (
        31,
        32,
        "request at least 32 CPUs (4 per GPU)",
    )
    capped = check("shm_capped.yaml", "shm.size")
    assert capped["sentence"] == (
        "/dev/shm is 12 GiB (its sizeLimit is 64 GiB, but its pages count against the pod memory limit of 12 GiB), "
        "below the contract floor of 16 GiB (SLA 64 GiB)"
    )
    no_limit = check("no_memory_limit.yaml", "memory.limit")
    assert no_limit["related_verdict"] == "host_memory_limit"
    assert no_limit["sentence"].startswith("container trainer sets no memory limit")
    sized_by_limit = check("deployment_mig.yaml", "shm.size")
    assert sized_by_limit["sentence"] == (
        "/dev/shm is 97 GiB (no sizeLimit: sized to the pod memory limit of 97 GiB): meets the SLA of 64 GiB"
    )


def test_human_table(triage: Callable[..., Result], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(MANIFESTS)
    rc, out, err = triage("audit", "manifest", "shm_15gi.yaml")
    assert (rc, err) == (1, "")
    lines = out.splitlines()
    assert "triage audit manifest: shm_15gi.yaml" in lines[0]
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:4]]
        for line in lines
        if line.count("│") == 6 and line.split("│")[1].strip()
    }
    assert rows == {
        "gpu.request": ["Job/train-llm/trainer", "pass"],
        "cpu.per_gpu": ["Job/train-llm", "pass"],
        "memory.limit": ["Job/train-llm", "pass"],
        "shm.medium": ["Job/train-llm/trainer", "pass"],
        "shm.size": ["Job/train-llm/dshm", "fail"],
        "dataloader.workers": ["Job/train-llm/trainer", "pass"],
        "numa.alignment": ["Job/train-llm", "pass"],
    }
    assert "/dev/shm is 15 GiB, below the contract floor of 16 GiB (SLA 64 GiB)" in out
    assert "contract 2025.1 (package:triage/contract/contract.toml)" in out
    assert lines[-1] == "6 pass, 0 warn, 1 fail: FAIL"


def test_namespace_overrides_change_the_decision(
    triage_json: Callable[..., tuple[int, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(MANIFESTS)
    rc, report = _audit(triage_json, "shm_15gi.yaml", "--namespace", "dev-sandbox")
    assert rc == 0 and report["contract_namespace"] == "dev-sandbox"
    (shm,) = [c for c in report["checks"] if c["id"] == "shm.size"]
    assert (shm["status"], shm["sentence"]) == (
        "warn",
        "/dev/shm is 15 GiB: meets the contract floor of 2 GiB but is below the SLA of 16 GiB",
    )
    (cpu,) = [c for c in report["checks"] if c["id"] == "cpu.per_gpu"]
    assert cpu["sentence"] == "32 CPUs requested for 8 GPUs (4 per GPU): meets the contract's 2 per GPU"
    assert report["facts"]["workloads"][0]["namespace"] == "ml-train"
    assert report["facts"]["workloads"][0]["contract_namespace"] == "dev-sandbox"


def test_manifest_namespace_picks_overrides(contract_file: ContractFile) -> None:
    doc = parse_documents((MANIFESTS / "shm_15gi.yaml").read_text().replace("ml-train", "dev-sandbox"), "x")
    report = audit_documents(doc, contract_file, target="x")
    assert report.contract.overrides == "dev-sandbox" and report.exit_code == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "bad_yaml.yaml",
            "bad_yaml.yaml: not valid YAML: expected ',' or ']', but got '<stream end>' (line 11, column 1)",
        ),
        (
            "unknown_kind.yaml",
            "unknown_kind.yaml: document 1: kind 'Service' is not a workload the audit reads (supported: CronJob, "
            "DaemonSet, Deployment, Job, JobSet, Pod, PyTorchJob, ReplicaSet, StatefulSet)",
        ),
        (
            "no_containers.yaml",
            "no_containers.yaml: document 1 (Job/empty): spec.template.spec: containers must be a non-empty list",
        ),
        ("missing.yaml", "cannot read missing.yaml: No such file or directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    name: str, message: str, triage: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(MANIFESTS)
    for extra in ((), ("--json",)):
        rc, out, err = triage("audit", "manifest", name, *extra)
        assert (rc, out) == (2, "")
        assert err == f"triage audit: error: {message}\n"


def test_real_process_exit_codes() -> None:
    good = run_process("audit", "manifest", "good.yaml", "--json", cwd=MANIFESTS)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["status"] == "pass"
    failing = run_process("audit", "manifest", "cpu_31.yaml", cwd=MANIFESTS)
    assert failing.returncode == 1 and "cpu.per_gpu" in failing.stdout
    broken = run_process("audit", "manifest", "bad_yaml.yaml", cwd=MANIFESTS)
    assert broken.returncode == 2 and broken.stdout == ""
    assert (
        broken.stderr.startswith("triage audit: error: bad_yaml.yaml: not valid YAML")
        and "Traceback" not in broken.stderr
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "x.yaml: no YAML documents"),
        ("- a\n- b\n", "x.yaml: document 1 is a list, not a Kubernetes object"),
        ("just text", "x.yaml: document 1 is a string, not a Kubernetes object"),
        ("apiVersion: v1\nmetadata: {name: a}\n", "x.yaml: document 1 has no kind"),
        (
            "kind: Job\nmetadata: {name: a}\nspec: {}\n",
            "x.yaml: document 1 (Job/a): spec.template is missing",
        ),
        (
            "kind: Pod\nmetadata: {name: a}\nspec: [1]\n",
            "x.yaml: document 1 (Pod/a): spec is a list, not a mapping",
        ),
        ("kind: List\nitems: 3\n", "x.yaml: document 1 (List): items must be a list"),
        (
            "kind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, resources: {limits: {cpu: 4 cores}}}]\n",
            "x.yaml: document 1 (Pod/a): spec.containers[0].resources.limits.cpu: '4 cores' is not a Kubernetes quantity",
        ),
        (
            "kind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, volumeMounts: [{name: s, mountPath: /dev/shm}]}]\n",
            "x.yaml: document 1 (Pod/a): spec.containers[0]: the /dev/shm volumeMount names volume 's', which spec volumes does not define",
        ),
        (
            "kind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{image: x}]\n",
            "spec.containers[0] has no name",
        ),
    ],
)
def test_malformed_documents(text: str, message: str, contract_file: ContractFile) -> None:
    with pytest.raises(ManifestError) as info:
        audit_documents(parse_documents(text, "x.yaml"), contract_file, target="x.yaml")
    assert message in str(info.value)


def _pod(gpu: str = "nvidia.com/gpu: 1", cpu: str = "4", extra: str = "") -> str:
    return f"""
kind: Pod
metadata: {{name: p}}
spec:
  containers:
    - name: c
      resources:
        limits: {{cpu: "{cpu}", memory: 64Gi, {gpu}}}
      volumeMounts: [{{name: s, mountPath: /dev/shm}}]
{extra}
  volumes: [{{name: s, emptyDir: {{medium: Memory, sizeLimit: 64Gi}}}}]
"""


def _gpu_check(contract_file: ContractFile, text: str) -> dict[str, Any]:
    report = audit_documents(parse_documents(text, "x"), contract_file, target="x")
    (check,) = [c.to_dict() for c in report.checks if c.id == "gpu.request"]
    return check


@pytest.mark.parametrize(
    ("gpu", "status", "sentence"),
    [
        ("nvidia.com/gpu: 1", "pass", "1 × nvidia.com/gpu in limits"),
        ("nvidia.com/mig-1g.10gb: 1", "pass", "1 × nvidia.com/mig-1g.10gb in limits"),
        ("nvidia.com/mig-1g.5gb.me: 1", "pass", "1 × nvidia.com/mig-1g.5gb.me in limits"),
        (
            "nvidia.com/mig-2g.20gb: 2",
            "warn",
            "2 × nvidia.com/mig-2g.20gb in limits: 2 MIG slices in one container: a CUDA process uses one MIG device",
        ),
        (
            "nvidia.com/gpu: 1, nvidia.com/mig-1g.10gb: 1",
            "warn",
            "1 × nvidia.com/gpu, 1 × nvidia.com/mig-1g.10gb in limits: full GPUs and MIG slices in one container",
        ),
        (
            "nvidia.com/gpus: 1",
            "fail",
            "unknown GPU resource 'nvidia.com/gpus' (the device plugins advertise nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-<profile>)",
        ),
        (
            "nvidia.com/mig-9g.10gb: 1",
            "fail",
            "malformed MIG resource 'nvidia.com/mig-9g.10gb': expected nvidia.com/mig-<slices>g.<memory>gb, e.g. nvidia.com/mig-1g.10gb",
        ),
        (
            "nvidia.com/gpu: 500m",
            "fail",
            "nvidia.com/gpu is '500m' in limits: GPUs are whole devices (1, 2, …, 8)",
        ),
        ("nvidia.com/gpu: -1", "fail", "nvidia.com/gpu is -1 in limits: GPUs are whole devices (1, 2, …, 8)"),
    ],
)
def test_gpu_requests(gpu: str, status: str, sentence: str, contract_file: ContractFile) -> None:
    check = _gpu_check(contract_file, _pod(gpu=gpu))
    assert (check["status"], check["sentence"]) == (status, sentence)


def test_gpu_requests_differ_from_limits(contract_file: ContractFile) -> None:
    text = _pod().replace("limits:", "requests: {nvidia.com/gpu: 2}\n        limits:")
    check = _gpu_check(contract_file, text)
    assert (check["status"], check["sentence"]) == (
        "fail",
        "nvidia.com/gpu: requests (2) differ from limits (1)",
    )


def test_every_kind_and_multi_document(contract_file: ContractFile) -> None:
    pod_spec = "{containers: [{name: c, resources: {limits: {cpu: 4, memory: 8Gi}}}]}"
    text = f"""
kind: CronJob
metadata: {{name: nightly, namespace: dev-sandbox}}
spec: {{jobTemplate: {{spec: {{template: {{spec: {pod_spec}}}}}}}}}
---
kind: StatefulSet
metadata: {{name: s}}
spec: {{template: {{spec: {pod_spec}}}}}
---
kind: List
items:
  - {{kind: DaemonSet, metadata: {{name: d}}, spec: {{template: {{spec: {pod_spec}}}}}}}
  - {{kind: ReplicaSet, metadata: {{name: r}}, spec: {{template: {{spec: {pod_spec}}}}}}}
---
kind: JobSet
metadata: {{name: js}}
spec:
  replicatedJobs:
    - {{name: workers, template: {{spec: {{template: {{spec: {pod_spec}}}}}}}}}
"""
    report = audit_documents(parse_documents(text, "multi.yaml"), contract_file, target="multi.yaml")
    workloads = [w["workload"] for w in report.facts["workloads"]]
    assert workloads == [
        "CronJob/nightly",
        "StatefulSet/s",
        "DaemonSet/d",
        "ReplicaSet/r",
        "JobSet/js/workers",
    ]
    assert [w["contract_namespace"] for w in report.facts["workloads"]] == [
        "dev-sandbox",
        None,
        None,
        None,
        None,
    ]
    assert report.contract.overrides is None  # mixed namespaces: the report header shows the defaults
    # no GPU and no /dev/shm mount: every pod fails shm.medium (64 MiB runtime default)
    assert {c.id for c in report.checks if c.status == "fail"} == {"shm.medium"}


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"env": [{"name": "NUM_WORKERS", "value": "6"}]}, (6, "env NUM_WORKERS")),
        ({"env": [{"name": "NUM_WORKERS", "valueFrom": {"configMapKeyRef": {}}}]}, None),
        ({"args": ["--num_workers=2"]}, (2, "arg --num_workers=2")),
        ({"args": ["--dataloader-num-workers", "5"]}, (5, "arg --dataloader-num-workers 5")),
        ({"command": ["bash", "-c", "torchrun train.py --workers 7 --lr 1e-4"]}, (7, "arg --workers 7")),
        ({"args": ["trainer.dataloader.num_workers=0"]}, (0, "arg trainer.dataloader.num_workers=0")),
        ({"args": ["--num-workers", "$(NW)"]}, None),
        ({"args": ["--epochs", "3"]}, None),
        ({}, None),
    ],
)
def test_declared_workers(container: dict[str, Any], expected: tuple[int, str] | None) -> None:
    assert declared_workers(container) == expected


def test_zero_workers_warns(contract_file: ContractFile) -> None:
    text = _pod().replace("      volumeMounts:", '      args: ["--num-workers", "0"]\n      volumeMounts:')
    report = audit_documents(parse_documents(text, "x"), contract_file, target="x")
    (check,) = [c for c in report.checks if c.id == "dataloader.workers"]
    assert (check.status, check.sentence) == (
        "warn",
        "num_workers=0 (arg --num-workers 0), below the contract's 1: batches are loaded in the training process, "
        "which stalls the GPU",
    )


def test_hostile_yaml_is_a_clean_error(contract_file: ContractFile) -> None:
    with pytest.raises(ManifestError, match=r"deep\.yaml: YAML nested too deeply to be a manifest"):
        parse_documents("[" * 1_000 + "]" * 1_000, "deep.yaml")
    # an alias bomb (9^10 leaves if expanded) used as args: neither expanded nor stringified
    anchors = "    l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
    )
    text = f"kind: Pod\nmetadata:\n  name: p\n  labels:\n{anchors}spec:\n  containers:\n    - name: c\n      args: *l9\n"
    report = audit_documents(parse_documents(text, "bomb.yaml"), contract_file, target="bomb.yaml")
    assert report.exit_code == 1 and [c.id for c in report.checks if c.status == "fail"] == [
        "memory.limit",
        "shm.medium",
    ]
