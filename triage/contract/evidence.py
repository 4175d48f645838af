"""Contract violations of a crashed pod, as evidence for the OOM diagnosis.

`pod_violations(pod_facts, contract)` reads the incident bundle's fields (docs/bundle.md) plus optional
Kubernetes facts, runs the pod checks of the contract, and returns what is off: each violation has a
sentence with the numbers and the verdict it bears on (`shm_exhausted` for /dev/shm,
`host_memory_limit` for the memory limit and OOM kills, None for CPU/GPU/DataLoader facts), so the
rule engine can strengthen that verdict and the ticket can cite the SLA.

`pod_facts` keys (all optional; absent or null means unknown, and an unknown fact is never a violation)::

    host:        shm_total_bytes, shm_used_bytes, cpu_count, cpu_affinity [ints], dataloader_workers,
                 cgroup: {version, memory_limit_bytes, memory_usage_bytes, oom_kill_count}
    environment: CUDA_VISIBLE_DEVICES (counts the pod's GPUs when k8s.gpu_count is absent)
    workload:    namespace (picks the namespace overrides when `contract` is a ContractFile)
    k8s:         shm_medium ("Memory", "" for a disk-backed emptyDir, "none" for nothing mounted),
                 shm_size_limit_bytes, cpu_request (cores, or a quantity such as "31500m"), gpu_count,
                 memory_limit_bytes (null: the spec sets no limit), namespace

A whole bundle is a valid `pod_facts`. So is the flat form, the `host` mapping with the `k8s` keys merged
into it (`{"shm_total_bytes": …, "cgroup": {…}, "shm_medium": "Memory", …}`). `host.cgroup.memory_limit_bytes` counts as "no limit" when it is
null or ≥ 2^60 (cgroup v1's "unlimited") *and* the cgroup block says which `version` was read; a bundle
without a cgroup block says nothing about limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from triage.contract.checks import PodFacts, evaluate_pod
from triage.contract.load import ContractFile
from triage.contract.model import Contract
from triage.contract.quantity import parse_millicores

UNLIMITED = 2**60


@dataclass(frozen=True)
class Violation:
    """One contract violation of a pod, for a ticket's evidence."""

    check: str
    severity: Literal["fail", "warn"]
    sentence: str
    value: Any
    threshold: Any
    contract_version: str
    related_verdict: str | None
    fix: str | None = None
    contract_namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity,
            "sentence": self.sentence,
            "value": self.value,
            "threshold": self.threshold,
            "contract_version": self.contract_version,
            "contract_namespace": self.contract_namespace,
            "related_verdict": self.related_verdict,
            "fix": self.fix,
        }


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _section(pod_facts: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """`pod_facts[name]` in the bundle shape; the mapping itself in the flat shape (host and k8s keys merged)."""
    value = pod_facts.get(name)
    if isinstance(value, Mapping):
        return value
    return {} if name in pod_facts else pod_facts


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _count_cvd(value: Any) -> int | None:
    if not isinstance(value, str) or not value.strip():
        return None
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def facts_from_bundle(pod_facts: Mapping[str, Any]) -> PodFacts:
    """The checkable facts of a bundle-shaped mapping (see the module docstring)."""
    host = _section(pod_facts, "host")
    cgroup = _map(host.get("cgroup"))
    k8s = _section(pod_facts, "k8s")
    env = _map(pod_facts.get("environment"))
    facts = PodFacts(
        shm_total_bytes=_int(host.get("shm_total_bytes")),
        shm_used_bytes=_int(host.get("shm_used_bytes")),
        cpu_count=_int(host.get("cpu_count")),
        dataloader_workers=_int(host.get("dataloader_workers")),
        oom_kill_count=_int(cgroup.get("oom_kill_count")),
        memory_usage_bytes=_int(cgroup.get("memory_usage_bytes")),
    )
    if facts.shm_total_bytes is not None and facts.shm_total_bytes <= 0:
        facts.shm_total_bytes = None
    affinity = host.get("cpu_affinity")
    if isinstance(affinity, list) and affinity and all(_int(c) is not None and c >= 0 for c in affinity):
        facts.cpu_affinity = sorted(set(affinity))
    if cgroup.get("version") is not None and "memory_limit_bytes" in cgroup:
        limit = _int(cgroup.get("memory_limit_bytes"))
        facts.memory_limit_known = True
        facts.memory_limit_bytes = limit if limit is not None and 0 < limit < UNLIMITED else None
    elif "memory_limit_bytes" in k8s:
        limit = _int(k8s.get("memory_limit_bytes"))
        facts.memory_limit_known = True
        facts.memory_limit_bytes = limit if limit is not None and limit > 0 else None
    medium = k8s.get("shm_medium")
    if isinstance(medium, str):
        facts.shm_medium = medium
    facts.shm_size_limit_bytes = _int(k8s.get("shm_size_limit_bytes"))
    request = k8s.get("cpu_request")
    if request is not None and not isinstance(request, bool):
        try:
            facts.cpu_request_millicores = parse_millicores(request)
        except ValueError:
            pass
    gpus = _int(k8s.get("gpu_count"))
    facts.gpu_count = gpus if gpus is not None and gpus >= 0 else _count_cvd(env.get("CUDA_VISIBLE_DEVICES"))
    return facts


def pod_violations(pod_facts: Mapping[str, Any], contract: Contract | ContractFile) -> list[Violation]:
    """The contract checks the facts fail or warn on, in a fixed order (shm, CPU, memory, DataLoader)."""
    if isinstance(contract, ContractFile):
        namespace = _map(pod_facts.get("workload")).get("namespace") or _map(pod_facts.get("k8s")).get(
            "namespace"
        )
        contract = contract.for_namespace(namespace if isinstance(namespace, str) else None)
    facts = facts_from_bundle(pod_facts)
    out: list[Violation] = []
    for check in evaluate_pod(facts, contract):
        if check.status == "pass":
            continue
        out.append(
            Violation(
                check=check.id,
                severity=check.status,
                sentence=check.sentence,
                value=check.value,
                threshold=check.threshold,
                contract_version=contract.version,
                related_verdict=check.related_verdict,
                fix=check.fix,
                contract_namespace=contract.overrides,
            )
        )
    return out
