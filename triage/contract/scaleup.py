"""Scale-up approval: a small-scale report decides whether a job may ask for more GPUs.

Per the contract (`[scale_up]`): the report must come from a small-scale run (at least
`report_min_gpus`, at most `report_max_gpus` GPUs — the defaults say 4 to 8, one node) and show
MFU ≥ `min_mfu` and GPU utilisation ≥ `min_gpu_utilization` (40% and 65% by default). A request
for no more GPUs than the report ran on is not a scale-up. Every threshold is inclusive.

`decide_scale_up` is pure: the HTTP endpoint (POST /api/v1/scale-up-requests) validates, calls it,
stores the decision and maps `ReportError` to a 422.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triage.contract.errors import ReportError
from triage.contract.load import ContractFile
from triage.contract.mfu import meets
from triage.contract.model import Check, Contract
from triage.contract.quantity import fmt_number, fmt_percent


@dataclass(frozen=True)
class ScaleUpReport:
    """A small-scale run's numbers. Fractions are 0..1 (45% is 0.45)."""

    gpus: int
    mfu: float
    gpu_utilization: float
    step_time_s: float
    requested_gpus: int | None = None
    namespace: str | None = None
    job: str | None = None


@dataclass(frozen=True)
class ScaleUpDecision:
    approved: bool
    reasons: list[str]
    contract_version: str
    contract_namespace: str | None = None
    checks: list[Check] = field(default_factory=list)
    report: ScaleUpReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "decision": "approved" if self.approved else "denied",
            "reasons": list(self.reasons),
            "contract_version": self.contract_version,
            "contract_namespace": self.contract_namespace,
            "checks": [c.to_dict() for c in self.checks],
            "report": dataclasses.asdict(self.report) if self.report is not None else None,
        }


def parse_report(report: Mapping[str, Any] | Any) -> ScaleUpReport:
    """A `ScaleUpReport` from a mapping (JSON body) or any dataclass; `ReportError` names the bad field."""
    if isinstance(report, ScaleUpReport):
        data: Mapping[str, Any] = dataclasses.asdict(report)
    elif dataclasses.is_dataclass(report) and not isinstance(report, type):
        data = dataclasses.asdict(report)
    elif isinstance(report, Mapping):
        data = report
    else:
        raise ReportError(f"a scale-up report must be an object, got {type(report).__name__}")
    util = data.get("gpu_utilization", data.get("gpu_utilisation"))
    return ScaleUpReport(
        gpus=_count(data.get("gpus"), "gpus"),
        mfu=_fraction(data.get("mfu"), "mfu"),
        gpu_utilization=_fraction(util, "gpu_utilization"),
        step_time_s=_positive(data.get("step_time_s"), "step_time_s"),
        requested_gpus=None
        if data.get("requested_gpus") is None
        else _count(data["requested_gpus"], "requested_gpus"),
        namespace=_str(data.get("namespace"), "namespace"),
        job=_str(data.get("job"), "job"),
    )


def _number(value: Any, name: str) -> float:
    if value is None:
        raise ReportError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReportError(f"{name} must be a number, got {value!r}")
    return float(value)


def _fraction(value: Any, name: str) -> float:
    number = _number(value, name)
    if not 0 <= number <= 1:
        hint = f" ({fmt_number(number)}% is {number / 100:g})" if 1 < number <= 100 else ""
        raise ReportError(f"{name} must be a fraction between 0 and 1{hint}, got {value!r}")
    return number


def _positive(value: Any, name: str) -> float:
    number = _number(value, name)
    if number <= 0:
        raise ReportError(f"{name} must be positive, got {value!r}")
    return number


def _count(value: Any, name: str) -> int:
    if value is None:
        raise ReportError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ReportError(f"{name} must be a whole number of GPUs ≥ 1, got {value!r}")
    return value


def _str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ReportError(f"{name} must be a string, got {value!r}")


def decide_scale_up(report: Mapping[str, Any] | Any, contract: Contract | ContractFile) -> ScaleUpDecision:
    """Approve or deny a scale-up from its small-scale report. `contract` may be a whole contract file,
    in which case the report's `namespace` picks the overrides."""
    parsed = parse_report(report)
    if isinstance(contract, ContractFile):
        contract = contract.for_namespace(parsed.namespace)
    terms = contract.scale_up
    subject = parsed.job or "scale-up"
    checks: list[Check] = []
    lo, hi = terms.report_min_gpus, terms.report_max_gpus
    span = f"{lo}–{hi} GPUs" if lo != hi else f"{lo} GPUs"
    if parsed.gpus < lo:
        checks.append(
            Check(
                "scale_up.report_gpus",
                "fail",
                subject,
                f"the report ran on {parsed.gpus} GPU{'s' if parsed.gpus != 1 else ''}, fewer than the {lo} a "
                f"small-scale report needs ({span})",
                fix=f"run the small-scale test on {lo} GPUs",
                value=parsed.gpus,
                threshold=lo,
            )
        )
    elif parsed.gpus > hi:
        checks.append(
            Check(
                "scale_up.report_gpus",
                "fail",
                subject,
                f"the report ran on {parsed.gpus} GPUs, more than the {hi} of a small-scale report ({span})",
                fix=f"report a run on {lo} to {hi} GPUs",
                value=parsed.gpus,
                threshold=hi,
            )
        )
    else:
        checks.append(
            Check(
                "scale_up.report_gpus",
                "pass",
                subject,
                f"the report ran on {parsed.gpus} GPUs: a small-scale run ({span})",
                value=parsed.gpus,
                threshold=lo,
            )
        )
    if parsed.requested_gpus is not None:
        if parsed.requested_gpus > parsed.gpus:
            checks.append(
                Check(
                    "scale_up.requested_gpus",
                    "pass",
                    subject,
                    f"requests {parsed.requested_gpus} GPUs, more than the report's {parsed.gpus}",
                    value=parsed.requested_gpus,
                    threshold=parsed.gpus + 1,
                )
            )
        else:
            checks.append(
                Check(
                    "scale_up.requested_gpus",
                    "fail",
                    subject,
                    f"requests {parsed.requested_gpus} GPUs, no more than the report's {parsed.gpus}: "
                    "not a scale-up",
                    fix="a scale-up request asks for more GPUs than the small-scale run used",
                    value=parsed.requested_gpus,
                    threshold=parsed.gpus + 1,
                )
            )
    for check_id, label, value, threshold, fix in (
        (
            "scale_up.mfu",
            "MFU",
            parsed.mfu,
            terms.min_mfu,
            "raise MFU at small scale first (profile the step); `triage audit mfu` computes it",
        ),
        (
            "scale_up.gpu_utilization",
            "GPU utilisation",
            parsed.gpu_utilization,
            terms.min_gpu_utilization,
            "keep the GPUs busy at small scale first (DataLoader workers, /dev/shm, host-to-device copies)",
        ),
    ):
        if meets(value, threshold):
            checks.append(
                Check(
                    check_id,
                    "pass",
                    subject,
                    f"{label} {fmt_percent(value)} on {parsed.gpus} GPUs: meets the contract's "
                    f"{fmt_percent(threshold)}",
                    value=value,
                    threshold=threshold,
                )
            )
        else:
            checks.append(
                Check(
                    check_id,
                    "fail",
                    subject,
                    f"{label} {fmt_percent(value)} on {parsed.gpus} GPUs, below the contract's {fmt_percent(threshold)}",
                    fix=fix,
                    value=value,
                    threshold=threshold,
                )
            )
    approved = all(c.status == "pass" for c in checks)
    reasons = [c.sentence for c in checks if approved or c.status != "pass"]
    return ScaleUpDecision(
        approved=approved,
        reasons=reasons,
        contract_version=contract.version,
        contract_namespace=contract.overrides,
        checks=checks,
        report=parsed,
    )
