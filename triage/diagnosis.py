"""The Diagnosis: what `triage replay/diagnose --json` print and what the API returns (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = (
    "tensor_leak",
    "workload_too_large",
    "fragmentation",
    "other_process",
    "gpu_quota",
    "shm_exhausted",
    "host_memory_limit",
    "inconclusive",
)
ALGORITHM = "algorithm"
PLATFORM = "platform"
OWNER_OF: dict[str, str | None] = {
    "tensor_leak": ALGORITHM,
    "workload_too_large": ALGORITHM,
    "fragmentation": ALGORITHM,
    "other_process": PLATFORM,
    "gpu_quota": PLATFORM,
    "shm_exhausted": PLATFORM,
    "host_memory_limit": PLATFORM,
    "inconclusive": None,
}

SUMMARY_KEYS = (
    "reserved_bytes",
    "allocated_bytes",
    "requested_bytes",
    "active_bytes",
    "free_in_reserved_bytes",
    "largest_free_block_bytes",
    "segments",
    "blocks",
    "trace_entries",
)


@dataclass(slots=True)
class EvidenceItem:
    rule: str
    fact: str
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "fact": self.fact, "value": self.value}


@dataclass
class Diagnosis:
    verdict: str = "inconclusive"
    owner: str | None = None
    confidence: float = 0.0
    candidates: list[str] = field(default_factory=list)
    evidence: list[EvidenceItem] = field(default_factory=list)
    leak_site: dict[str, Any] | None = None
    max_batch_size: int | None = None
    actions: list[str] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SUMMARY_KEYS, 0))
    missing: list[str] = field(default_factory=list)
    headline: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "owner": self.owner,
            "confidence": round(self.confidence, 3),
            "candidates": list(self.candidates),
            "evidence": [e.to_dict() for e in self.evidence],
            "leak_site": self.leak_site,
            "max_batch_size": self.max_batch_size,
            "actions": list(self.actions),
            "summary": dict(self.summary),
            "missing": list(self.missing),
            "headline": self.headline,
            "details": self.details,
        }
