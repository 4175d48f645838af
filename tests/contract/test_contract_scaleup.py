"""Scale-up approval: every threshold of the 4-GPU small-scale report on both sides."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from triage.contract.errors import ReportError
from triage.contract.load import ContractFile, parse_contract
from triage.contract.scaleup import ScaleUpReport, decide_scale_up

PACKAGED = (Path(__file__).resolve().parents[2] / "triage" / "contract" / "contract.toml").read_text()
GOOD = {"gpus": 4, "mfu": 0.42, "gpu_utilization": 0.70, "step_time_s": 1.8, "requested_gpus": 32}


def _decide(contract_file: ContractFile, **changes: Any) -> Any:
    return decide_scale_up({**GOOD, **changes}, contract_file.default)


def test_approved_report_gives_every_reason(contract_file: ContractFile) -> None:
    decision = _decide(contract_file)
    assert decision.approved is True and decision.contract_version == "2025.1"
    assert decision.reasons == [
        "the report ran on 4 GPUs: a small-scale run (4–8 GPUs)",
        "requests 32 GPUs, more than the report's 4",
        "MFU 42% on 4 GPUs: meets the contract's 40%",
        "GPU utilisation 70% on 4 GPUs: meets the contract's 65%",
    ]
    as_json = decision.to_dict()
    assert as_json["decision"] == "approved" and as_json["contract_version"] == "2025.1"
    assert as_json["report"]["requested_gpus"] == 32
    assert [c["id"] for c in as_json["checks"]] == [
        "scale_up.report_gpus",
        "scale_up.requested_gpus",
        "scale_up.mfu",
        "scale_up.gpu_utilization",
    ]


@pytest.mark.parametrize(
    ("changes", "approved", "reasons"),
    [
        ({"mfu": 0.40}, True, None),  # exactly 40%
        ({"mfu": 0.3999}, False, ["MFU 39.99% on 4 GPUs, below the contract's 40%"]),
        ({"gpu_utilization": 0.65}, True, None),  # exactly 65%
        ({"gpu_utilization": 0.6499}, False, ["GPU utilisation 64.99% on 4 GPUs, below the contract's 65%"]),
        ({"gpus": 4}, True, None),
        (
            {"gpus": 3},
            False,
            ["the report ran on 3 GPUs, fewer than the 4 a small-scale report needs (4–8 GPUs)"],
        ),
        ({"gpus": 8}, True, None),
        (
            {"gpus": 9},
            False,
            ["the report ran on 9 GPUs, more than the 8 of a small-scale report (4–8 GPUs)"],
        ),
        ({"requested_gpus": 5}, True, None),
        ({"requested_gpus": 4}, False, ["requests 4 GPUs, no more than the report's 4: not a scale-up"]),
        (
            {"mfu": 0.2, "gpu_utilization": 0.5},
            False,
            [
                "MFU 20% on 4 GPUs, below the contract's 40%",
                "GPU utilisation 50% on 4 GPUs, below the contract's 65%",
            ],
        ),
    ],
)
def test_thresholds_both_sides(
    changes: dict[str, Any], approved: bool, reasons: list[str] | None, contract_file: ContractFile
) -> None:
    decision = _decide(contract_file, **changes)
    assert decision.approved is approved
    if reasons is not None:
        assert decision.reasons == reasons


def test_float_thresholds_from_arithmetic(contract_file: ContractFile) -> None:
    # 0.1 × 4 is 0.4000000000000001 and 0.65 may arrive as 13/20 computed: both meet their thresholds
    assert _decide(contract_file, mfu=0.1 * 4, gpu_utilization=13 / 20).approved is True
    assert _decide(contract_file, mfu=0.4 - 1e-6).approved is False


def test_dataclass_and_own_dataclass_reports(contract_file: ContractFile) -> None:
    report = ScaleUpReport(gpus=4, mfu=0.45, gpu_utilization=0.9, step_time_s=0.5)
    decision = decide_scale_up(report, contract_file.default)
    assert decision.approved is True and len(decision.reasons) == 3  # no requested_gpus: no such check

    @dataclass
    class Theirs:
        gpus: int
        mfu: float
        gpu_utilisation: float
        step_time_s: float

    assert decide_scale_up(Theirs(4, 0.39, 0.9, 1.0), contract_file.default).approved is False


def test_contract_file_picks_namespace_overrides() -> None:
    custom = parse_contract(
        PACKAGED + "\n[namespaces.research.scale_up]\nmin_mfu = 0.30\nreport_min_gpus = 2\n", "custom.toml"
    )
    research = {**GOOD, "gpus": 2, "mfu": 0.31, "namespace": "research"}
    decision = decide_scale_up(research, custom)
    assert decision.approved is True and decision.contract_namespace == "research"
    assert decision.reasons[0] == "the report ran on 2 GPUs: a small-scale run (2–8 GPUs)"
    assert decide_scale_up({**research, "namespace": None}, custom).approved is False


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({**GOOD, "mfu": 42}, "mfu must be a fraction between 0 and 1 (42% is 0.42), got 42"),
        ({**GOOD, "gpu_utilization": -0.1}, "gpu_utilization must be a fraction between 0 and 1, got -0.1"),
        ({k: v for k, v in GOOD.items() if k != "mfu"}, "mfu is required"),
        ({**GOOD, "gpus": 0}, "gpus must be a whole number of GPUs ≥ 1, got 0"),
        ({**GOOD, "gpus": 4.0}, "gpus must be a whole number of GPUs ≥ 1, got 4.0"),
        ({**GOOD, "gpus": True}, "gpus must be a whole number of GPUs ≥ 1, got True"),
        ({**GOOD, "step_time_s": 0}, "step_time_s must be positive, got 0"),
        ({**GOOD, "mfu": "0.5"}, "mfu must be a number, got '0.5'"),
        ({**GOOD, "mfu": float("nan")}, "mfu must be a number, got nan"),
        ({**GOOD, "requested_gpus": 2.5}, "requested_gpus must be a whole number of GPUs ≥ 1, got 2.5"),
        ([1, 2], "a scale-up report must be an object, got list"),
    ],
)
def test_bad_reports(report: Any, message: str, contract_file: ContractFile) -> None:
    with pytest.raises(ReportError) as info:
        decide_scale_up(report, contract_file.default)
    assert str(info.value) == message
