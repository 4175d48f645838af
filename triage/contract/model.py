"""The resource contract as typed values, and the result of checking something against it.

A `Contract` is one namespace's view of the contract file: the defaults with that namespace's
overrides applied. Every `Check` it produces, and every report built from checks, carries the
contract version (and the override section used), so a decision can be traced to the SLA text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail")
_RANK = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class ShmTerms:
    sla_bytes: int
    floor_bytes: int
    runtime_default_bytes: int
    usage_warn: float


@dataclass(frozen=True)
class CpuTerms:
    min_per_gpu: float


@dataclass(frozen=True)
class MemoryTerms:
    require_limit: bool


@dataclass(frozen=True)
class GpuTerms:
    resources: tuple[str, ...]
    mig_prefix: str


@dataclass(frozen=True)
class DataLoaderTerms:
    min_workers: int
    numa_pinning: bool


@dataclass(frozen=True)
class MfuTerms:
    job_gate: float
    algorithm_sla: float


@dataclass(frozen=True)
class ScaleUpTerms:
    min_mfu: float
    min_gpu_utilization: float
    report_min_gpus: int
    report_max_gpus: int


@dataclass(frozen=True)
class Contract:
    """One namespace's contract: defaults with its overrides (if any) applied."""

    version: str
    source: str
    overrides: str | None  # the `[namespaces.X]` section applied, or None for the defaults
    shm: ShmTerms
    cpu: CpuTerms
    memory: MemoryTerms
    gpu: GpuTerms
    dataloader: DataLoaderTerms
    mfu: MfuTerms
    scale_up: ScaleUpTerms

    def header(self) -> dict[str, Any]:
        """The keys every JSON result starts with."""
        return {
            "contract_version": self.version,
            "contract_namespace": self.overrides,
            "contract_source": self.source,
        }


@dataclass(frozen=True)
class Check:
    """One contract check: a stable id, a status, and a human sentence with the numbers."""

    id: str
    status: Status
    subject: str
    sentence: str
    fix: str | None = None
    value: Any = None
    threshold: Any = None
    related_verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "subject": self.subject,
            "sentence": self.sentence,
            "fix": self.fix,
            "value": self.value,
            "threshold": self.threshold,
            "related_verdict": self.related_verdict,
        }


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The worst status of a list (`pass` for none)."""
    result: Status = "pass"
    for status in statuses:
        if _RANK[status] > _RANK[result]:
            result = status
    return result


@dataclass
class AuditReport:
    """What `triage audit manifest|pod|mfu` prints: checks plus the facts they were computed from."""

    audit: str
    target: str
    contract: Contract
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return worst([c.status for c in self.checks])

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "oom-triage/audit@1",
            "audit": self.audit,
            "target": self.target,
            **self.contract.header(),
            **self.extra,
            "status": self.status,
            "counts": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
            "facts": self.facts,
        }
