"""MFU: hand-computed examples, the peak table, and both sides of the 35% gate and 45% SLA."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.contract.conftest import Result
from triage.contract.load import ContractFile
from triage.contract.mfu import PEAKS, audit_mfu, compute_mfu, find_gpu
from triage.errors import InputError


def test_hand_computed_a100(triage_json: Callable[..., tuple[int, dict[str, Any]]]) -> None:
    # 1.2e15 FLOPs per step over 4 GPUs in 3 s = 4e14 FLOP/s = 1e14 per GPU; 1e14 / 312e12 = 0.320513
    rc, report = triage_json(
        "audit",
        "mfu",
        "--flops-per-step",
        "1.2e15",
        "--step-time",
        "3",
        "--gpus",
        "4",
        "--gpu",
        "A100-SXM4-80GB",
    )
    assert rc == 1
    facts = report["facts"]
    assert facts["achieved_flops"] == 4e14 and facts["achieved_flops_per_gpu"] == 1e14
    assert facts["peak_flops_per_gpu"] == 312e12 and facts["gpu"] == "A100" and facts["dtype"] == "bf16"
    assert facts["mfu"] == 0.320513
    gate, sla = report["checks"]
    assert (gate["id"], gate["status"], sla["id"], sla["status"]) == (
        "mfu.job_gate",
        "fail",
        "mfu.algorithm_sla",
        "warn",
    )
    assert gate["sentence"] == (
        "MFU 32.05% (100 TFLOP/s per GPU of 312 TFLOP/s peak, 4 × A100 bf16), below the job gate of 35%"
    )
    assert sla["sentence"] == "MFU 32.05%, below the algorithm SLA of 45%"
    assert (gate["threshold"], sla["threshold"]) == (0.35, 0.45)
    assert report["contract_version"] == "2025.1"


def test_hand_computed_h100_7b_model(triage_json: Callable[..., tuple[int, dict[str, Any]]]) -> None:
    # 7B dense transformer, 2^20 tokens per step: 6 × 7e9 × 1048576 = 4.4040192e16 FLOPs; 12 s on 8 × H100 SXM
    # → 4.58752e14 FLOP/s per GPU; / 989.4e12 = 0.463667
    rc, report = triage_json(
        "audit", "mfu", "--flops-per-step", "4.4040192e16", "--step-time", "12", "--gpus", "8",
        "--gpu", "NVIDIA H100 80GB HBM3",
    )  # fmt: skip
    assert rc == 0 and report["status"] == "pass"
    assert report["facts"]["mfu"] == 0.463667
    assert report["checks"][0]["sentence"] == (
        "MFU 46.37% (458.8 TFLOP/s per GPU of 989.4 TFLOP/s peak, 8 × H100-SXM bf16): meets the job gate of 35%"
    )


@pytest.mark.parametrize(
    ("flops", "gate", "sla"),
    [
        (3.5e14, "pass", "warn"),  # exactly 35%: meets the gate
        (3.49e14, "fail", "warn"),  # 34.9%
        (4.5e14, "pass", "pass"),  # exactly 45%: meets the SLA
        (4.49e14, "pass", "warn"),  # 44.9%
    ],
)
def test_gate_and_sla_both_sides(flops: float, gate: str, sla: str, contract_file: ContractFile) -> None:
    report = audit_mfu(contract_file.default, flops_per_step=flops, step_time_s=1.0, peak_flops=1e15)
    assert [c.status for c in report.checks] == [gate, sla]
    assert report.exit_code == (1 if gate == "fail" else 0)


def test_exact_thresholds_survive_float_arithmetic(contract_file: ContractFile) -> None:
    # 0.35 × 312e12 × 4 GPUs / 4 / 312e12 is not exactly 0.35 in binary floating point
    report = audit_mfu(
        contract_file.default, flops_per_step=0.35 * 312e12 * 4 * 2.5, step_time_s=2.5, gpus=4, gpu="A100"
    )
    assert report.checks[0].status == "pass" and report.checks[0].sentence.startswith("MFU 35% ")


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100 80GB PCIe", "tf32", 156e12),
        ("a100-sxm4-40gb", "fp16", 312e12),
        ("H100-SXM", "tf32", 494.7e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200", "bf16", 989.4e12),
        ("H200-NVL", "bf16", 835.5e12),
        ("NVIDIA L40S", "bf16", 362.05e12),
        ("NVIDIA L4", "fp16", 121e12),
        ("NVIDIA A10", "bf16", 125e12),
        ("Tesla V100-SXM2-32GB", "fp16", 125e12),
        ("Tesla T4", "fp16", 65e12),
        ("AMD Instinct MI300X", "bf16", 1307.4e12),
    ],
)
def test_peak_table(name: str, dtype: str, peak: float) -> None:
    assert find_gpu(name).peak(dtype) == peak


def test_peak_table_is_dense_and_ordered() -> None:
    for p in PEAKS:
        for value in (p.bf16, p.fp16, p.tf32):
            assert value is None or 10e12 < value < 2000e12
        if p.tf32 is not None and p.bf16 is not None:
            assert p.tf32 < p.bf16  # TF32 runs at half the 16-bit rate or less on every listed part


def test_l40s_hand_computed(contract_file: ContractFile) -> None:
    # 1.81025e14 FLOPs in 1 s on one L40S (362.05 TFLOP/s fp16) = exactly 50%
    report = audit_mfu(
        contract_file.default, flops_per_step=1.81025e14, step_time_s=1, gpu="L40S", dtype="fp16"
    )
    assert report.facts["mfu"] == 0.5 and report.status == "pass"
    assert compute_mfu(1.81025e14, 1.0, 362.05e12) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu", "B300"), "--gpu 'B300' is not in the peak-FLOPs table"),
        (
            ("--gpu", "H100"),
            "--gpu 'H100' is ambiguous: say which of H100-SXM, H100-PCIE, H100-NVL (or give --peak-flops)",
        ),
        (
            ("--gpu", "V100-SXM2", "--dtype", "bf16"),
            "V100-SXM2 has no bf16 tensor cores (it has: fp16); use --dtype",
        ),
        (("--peak-flops", "1e12"), "MFU would be 100000%, above 100%"),
        (("--peak-flops", "-1"), "--peak-flops must be a positive number, got -1.0"),
        (("--gpu", "A100", "--gpus", "0"), "--gpus must be at least 1, got 0"),
        ((), "give --gpu NAME (see --list-gpus) or --peak-flops P"),
    ],
)
def test_bad_mfu_input(args: tuple[str, ...], message: str, triage: Callable[..., Result]) -> None:
    rc, out, err = triage("audit", "mfu", "--flops-per-step", "1e15", "--step-time", "1", *args)
    assert (rc, out) == (2, "")
    assert err.startswith("triage audit: error: ") and message in err and err.count("\n") == 1


def test_missing_flags_and_conflicts(triage: Callable[..., Result]) -> None:
    rc, _, err = triage("audit", "mfu", "--step-time", "1", "--gpu", "A100")
    assert (rc, err) == (2, "triage audit: error: --flops-per-step is required\n")
    rc, _, err = triage(
        "audit", "mfu", "--flops-per-step", "1", "--step-time", "1", "--gpu", "A100", "--peak-flops", "1"
    )
    assert rc == 2 and "not allowed with argument" in err


def test_namespace_override_has_no_gate(triage_json: Callable[..., tuple[int, dict[str, Any]]]) -> None:
    rc, report = triage_json(
        "audit",
        "mfu",
        "--flops-per-step",
        "1e14",
        "--step-time",
        "1",
        "--peak-flops",
        "1e15",
        "--namespace",
        "dev-sandbox",
    )
    assert rc == 0 and report["contract_namespace"] == "dev-sandbox"
    assert report["checks"][0]["sentence"] == (
        "MFU 10% (100 TFLOP/s per GPU of 1000 TFLOP/s peak, 1 GPU at 1000 TFLOP/s): meets the job gate of 0%"
    )


def test_list_gpus(triage: Callable[..., Result]) -> None:
    rc, out, _ = triage("audit", "mfu", "--list-gpus", "--json")
    rows = json.loads(out)["peak_flops_dense"]
    assert rc == 0 and rows[0] == {
        "gpu": "A100",
        "aliases": [
            "A100-SXM4-40GB",
            "A100-SXM4-80GB",
            "A100-PCIE-40GB",
            "A100-PCIE-80GB",
            "A100-80GB-PCIE",
            "A100-40GB-PCIE",
        ],
        "bf16": 312e12,
        "fp16": 312e12,
        "tf32": 156e12,
    }
    rc, out, _ = triage("audit", "mfu", "--list-gpus")
    assert rc == 0 and "H200-SXM" in out and "989.4" in out


def test_input_error_type() -> None:
    with pytest.raises(InputError):
        compute_mfu(float("nan"), 1.0, 1e12)
