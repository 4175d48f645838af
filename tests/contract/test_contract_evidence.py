"""Contract violations of a crashed pod as OOM-ticket evidence, from incident-bundle fields."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.conftest import GiB, MiB
from triage.contract.evidence import Violation, pod_violations
from triage.contract.load import ContractFile


def _ids(violations: list[Violation]) -> list[tuple[str, str, str | None]]:
    return [(v.check, v.severity, v.related_verdict) for v in violations]


def test_small_shm_and_starved_cpus(contract_file: ContractFile) -> None:
    bundle = {
        "schema": "oom-triage/incident@1",
        "kind": "shm_exhausted",
        "workload": {"namespace": "ml-train", "pod": "train-0"},
        "host": {
            "shm_total_bytes": 64 * MiB,
            "shm_used_bytes": 60 * MiB,
            "cgroup": {
                "version": 2,
                "memory_limit_bytes": 512 * GiB,
                "memory_usage_bytes": 100 * GiB,
                "oom_kill_count": 0,
            },
            "cpu_count": 96,
            "cpu_affinity": list(range(16)),
            "dataloader_workers": 8,
        },
        "k8s": {"gpu_count": 8},
    }
    violations = pod_violations(bundle, contract_file)
    assert _ids(violations) == [
        ("shm.size", "fail", "shm_exhausted"),
        ("shm.usage", "warn", "shm_exhausted"),
        ("cpu.per_gpu", "fail", None),
        ("dataloader.workers", "warn", None),
    ]
    shm, usage, cpu, workers = violations
    assert shm.sentence == "/dev/shm is 64 MiB, below the contract floor of 16 GiB (SLA 64 GiB)"
    assert (shm.value, shm.threshold, shm.contract_version) == (64 * MiB, 16 * GiB, "2025.1")
    assert (
        usage.sentence
        == "/dev/shm holds 60 MiB of 64 MiB (93.75%), at or above the contract's warning level of 90%"
    )
    assert (
        cpu.sentence == "16 CPUs available for 8 GPUs (2 per GPU), below the contract's 4 per GPU (32 CPUs)"
    )
    assert workers.sentence == (
        "num_workers=8 (DataLoader workers): 9 processes per GPU (8 workers + the trainer) on 2 CPUs per GPU: "
        "the workers compete for CPUs"
    )
    assert shm.to_dict() == {
        "check": "shm.size",
        "severity": "fail",
        "sentence": "/dev/shm is 64 MiB, below the contract floor of 16 GiB (SLA 64 GiB)",
        "value": 64 * MiB,
        "threshold": 16 * GiB,
        "contract_version": "2025.1",
        "contract_namespace": None,
        "related_verdict": "shm_exhausted",
        "fix": "give the pod a memory-backed /dev/shm: an emptyDir with medium: Memory and sizeLimit 64Gi",
    }


@pytest.mark.parametrize(
    ("shm", "expected"),
    [
        (64 * GiB, []),
        (16 * GiB, [("shm.size", "warn", "shm_exhausted")]),  # meets the floor, below the SLA
        (15 * GiB, [("shm.size", "fail", "shm_exhausted")]),
    ],
)
def test_shm_floor_both_sides(shm: int, expected: list[Any], contract_file: ContractFile) -> None:
    assert _ids(pod_violations({"host": {"shm_total_bytes": shm}}, contract_file.default)) == expected


def test_no_memory_limit_and_oom_kills(contract_file: ContractFile) -> None:
    facts = {
        "host": {"cgroup": {"version": 1, "memory_limit_bytes": 9223372036854771712, "oom_kill_count": 3}}
    }
    violations = pod_violations(facts, contract_file)
    assert _ids(violations) == [
        ("memory.limit", "fail", "host_memory_limit"),
        ("memory.oom_kills", "warn", "host_memory_limit"),
    ]
    assert violations[1].sentence == "the memory cgroup has recorded 3 OOM kills"
    v2_max = {"host": {"cgroup": {"version": 2, "memory_limit_bytes": None}}}
    assert _ids(pod_violations(v2_max, contract_file)) == [("memory.limit", "fail", "host_memory_limit")]


def test_shm_capped_by_memory_limit(contract_file: ContractFile) -> None:
    facts = {"host": {"shm_total_bytes": 64 * GiB, "cgroup": {"version": 2, "memory_limit_bytes": 8 * GiB}}}
    (violation,) = pod_violations(facts, contract_file)
    assert violation.sentence == (
        "/dev/shm is 8 GiB (its tmpfs size is 64 GiB, but its pages count against the memory limit of 8 GiB), "
        "below the contract floor of 16 GiB (SLA 64 GiB)"
    )


@pytest.mark.parametrize(
    "facts",
    [
        {},
        {"host": None, "device": None},
        {"host": {"cgroup": {"memory_limit_bytes": None}}},  # no version: the collector did not read a cgroup
        {
            "host": {"shm_total_bytes": "64Mi", "cpu_affinity": "0-3", "cpu_count": None}
        },  # wrong types: unknown
        {"host": {"cpu_count": 8}},  # GPUs unknown: no CPU-per-GPU verdict
    ],
)
def test_unknown_facts_are_never_violations(facts: dict[str, Any], contract_file: ContractFile) -> None:
    assert pod_violations(facts, contract_file) == []


def test_k8s_facts(contract_file: ContractFile) -> None:
    disk = pod_violations({"k8s": {"shm_medium": "", "shm_size_limit_bytes": 64 * GiB}}, contract_file)
    assert _ids(disk) == [("shm.medium", "fail", "shm_exhausted")]
    nothing = pod_violations({"k8s": {"shm_medium": "none"}}, contract_file)
    assert _ids(nothing) == [("shm.medium", "fail", "shm_exhausted"), ("shm.size", "fail", "shm_exhausted")]
    assert nothing[1].value == 64 * MiB
    small = pod_violations({"k8s": {"shm_medium": "Memory", "shm_size_limit_bytes": 15 * GiB}}, contract_file)
    assert _ids(small) == [("shm.size", "fail", "shm_exhausted")]
    no_limit = pod_violations({"k8s": {"memory_limit_bytes": None}}, contract_file)
    assert _ids(no_limit) == [("memory.limit", "fail", "host_memory_limit")]
    cpus = pod_violations({"k8s": {"cpu_request": "31500m", "gpu_count": 8}}, contract_file)
    assert [v.sentence for v in cpus] == [
        "31.5 CPUs available for 8 GPUs (3.94 per GPU), below the contract's 4 per GPU (32 CPUs)"
    ]


@pytest.mark.parametrize(("cpus", "violated"), [(16, False), (15, True)])
def test_cpu_per_gpu_both_sides_from_cuda_visible_devices(
    cpus: int, violated: bool, contract_file: ContractFile
) -> None:
    facts = {"host": {"cpu_affinity": list(range(cpus))}, "environment": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}
    assert bool(pod_violations(facts, contract_file)) is violated


def test_namespace_overrides_from_the_bundle(contract_file: ContractFile) -> None:
    facts = {"workload": {"namespace": "dev-sandbox"}, "host": {"shm_total_bytes": 8 * GiB}}
    (violation,) = pod_violations(facts, contract_file)
    assert (violation.severity, violation.contract_namespace) == ("warn", "dev-sandbox")
    assert (
        violation.sentence
        == "/dev/shm is 8 GiB: meets the contract floor of 2 GiB but is below the SLA of 16 GiB"
    )
    # a resolved Contract is used as given, whatever the bundle says
    assert pod_violations(facts, contract_file.default)[0].severity == "fail"


def test_flat_host_and_k8s_form(contract_file: ContractFile) -> None:
    # the host mapping with the k8s keys merged in, as triage.evidence passes it
    flat = {
        "shm_total_bytes": 64 * MiB,
        "cgroup": {"version": 2, "memory_limit_bytes": None, "oom_kill_count": 0},
        "cpu_affinity": list(range(32)),
        "shm_medium": "Memory",
        "gpu_count": 8,
    }
    violations = pod_violations(flat, contract_file.default)
    assert _ids(violations) == [
        ("shm.size", "fail", "shm_exhausted"),
        ("memory.limit", "fail", "host_memory_limit"),
    ]
    assert violations[0].sentence == "/dev/shm is 64 MiB, below the contract floor of 16 GiB (SLA 64 GiB)"
    assert pod_violations({**flat, "gpu_count": 9}, contract_file.default)[1].check == "cpu.per_gpu"
