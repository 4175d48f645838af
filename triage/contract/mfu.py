"""Model FLOPs utilisation (MFU) and the contract's gates on it.

MFU = model FLOPs per step / step time / (peak FLOP/s per GPU × GPUs), the peak being the GPU's dense
tensor-core rate for the training dtype. `--flops-per-step` is the model's FLOPs for one optimizer
step summed over every GPU of the run (e.g. 6 × parameters × tokens per step for a dense transformer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from triage.contract.model import AuditReport, Check, Contract
from triage.contract.quantity import fmt_percent
from triage.errors import InputError

DTYPES = ("bf16", "fp16", "tf32")
_TOL = 1e-9  # MFU computed from round inputs lands a hair off its decimal value (0.35 → 0.34999999999999998)


@dataclass(frozen=True)
class GpuPeak:
    """Dense (no sparsity) tensor-core peak FLOP/s of one GPU, per dtype; None where it has no such unit."""

    name: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    aliases: tuple[str, ...] = ()

    def peak(self, dtype: str) -> float | None:
        return {"bf16": self.bf16, "fp16": self.fp16, "tf32": self.tf32}[dtype]


T = 1e12
# Dense peaks from the vendors' datasheets. NVIDIA's datasheets print the sparse rate with an asterisk
# ("* With sparsity"); the dense rate is half of it. Hopper's dense rates are from the H100 architecture
# whitepaper (SXM5: 132 SMs × 1830 MHz × 4096 FLOP/clk = 989.4 TFLOP/s BF16; PCIe: 756 TFLOP/s).
#   A100 datasheet (40GB/80GB, SXM4 and PCIe): TF32 156 | 312*, BF16 312 | 624*, FP16 312 | 624*.
#   H100 datasheet / whitepaper: SXM BF16/FP16 1,979*, TF32 989*; PCIe BF16/FP16 1,513*, TF32 756*;
#     NVL BF16/FP16 1,671*, TF32 835*.
#   H200 datasheet: SXM BF16/FP16 1,979*, TF32 989* (the H100 SXM's GH100 configuration);
#     NVL BF16/FP16 1,671*, TF32 835*.
#   L40S datasheet: TF32 183 | 366*, BF16 362.05 | 733*, FP16 362.05 | 733*.
#   L4 datasheet: TF32 120*, BF16 242*, FP16 242*.
#   A10 datasheet: TF32 62.5 | 125*, BF16 125 | 250*, FP16 125 | 250*.
#   A40 datasheet: TF32 74.8 | 149.6*, BF16 149.7 | 299.4*, FP16 149.7 | 299.4*.
#   V100 datasheet: Tensor Performance (FP16) SXM2 125 TFLOPS, PCIe 112 TFLOPS; no BF16/TF32 units.
#   T4 datasheet: Mixed Precision (FP16/FP32) 65 TFLOPS; no BF16/TF32 units.
#   AMD Instinct MI300X datasheet: TF32 653.7, BF16 1,307.4, FP16 1,307.4 TFLOPS (dense).
PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak(
        "A100",
        312 * T,
        312 * T,
        156 * T,
        (
            "A100-SXM4-40GB",
            "A100-SXM4-80GB",
            "A100-PCIE-40GB",
            "A100-PCIE-80GB",
            "A100-80GB-PCIE",
            "A100-40GB-PCIE",
        ),
    ),
    GpuPeak("H100-SXM", 989.4 * T, 989.4 * T, 494.7 * T, ("H100-SXM5", "H100-SXM5-80GB", "H100-80GB-HBM3")),
    GpuPeak("H100-PCIE", 756 * T, 756 * T, 378 * T, ("H100-PCIE-80GB",)),
    GpuPeak("H100-NVL", 835.5 * T, 835.5 * T, 417.5 * T, ("H100-NVL-94GB",)),
    GpuPeak("H200-SXM", 989.4 * T, 989.4 * T, 494.7 * T, ("H200", "H200-SXM-141GB", "H200-141GB-HBM3E")),
    GpuPeak("H200-NVL", 835.5 * T, 835.5 * T, 417.5 * T, ("H200-NVL-141GB",)),
    GpuPeak("L40S", 362.05 * T, 362.05 * T, 183 * T),
    GpuPeak("L4", 121 * T, 121 * T, 60 * T),
    GpuPeak("A10", 125 * T, 125 * T, 62.5 * T),
    GpuPeak("A40", 149.7 * T, 149.7 * T, 74.8 * T),
    GpuPeak("V100-SXM2", None, 125 * T, None, ("V100-SXM2-16GB", "V100-SXM2-32GB")),
    GpuPeak("V100-PCIE", None, 112 * T, None, ("V100-PCIE-16GB", "V100-PCIE-32GB")),
    GpuPeak("T4", None, 65 * T, None),
    GpuPeak("MI300X", 1307.4 * T, 1307.4 * T, 653.7 * T, ("INSTINCT-MI300X",)),
)


def _norm(name: str) -> str:
    text = re.sub(r"[\s_]+", "-", name.strip().upper())
    for prefix in ("NVIDIA-", "TESLA-", "AMD-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def find_gpu(name: str) -> GpuPeak:
    """The table entry for a GPU name as NVML prints it or as our table names it; InputError otherwise."""
    wanted = _norm(name)
    for entry in PEAKS:
        if wanted == _norm(entry.name) or wanted in {_norm(a) for a in entry.aliases}:
            return entry
    close = [e.name for e in PEAKS if e.name.startswith(wanted.split("-")[0])]
    if len(close) > 1:
        raise InputError(
            f"--gpu {name!r} is ambiguous: say which of {', '.join(close)} (or give --peak-flops)"
        )
    known = ", ".join(e.name for e in PEAKS)
    raise InputError(f"--gpu {name!r} is not in the peak-FLOPs table ({known}); give --peak-flops instead")


def compute_mfu(flops_per_step: float, step_time_s: float, peak_flops_per_gpu: float, gpus: int = 1) -> float:
    """MFU as a fraction; InputError for non-positive or non-finite inputs."""
    for label, value in (
        ("--flops-per-step", flops_per_step),
        ("--step-time", step_time_s),
        ("--peak-flops", peak_flops_per_gpu),
    ):
        if not math.isfinite(value) or value <= 0:
            raise InputError(f"{label} must be a positive number, got {value!r}")
    if gpus < 1:
        raise InputError(f"--gpus must be at least 1, got {gpus}")
    return flops_per_step / step_time_s / (peak_flops_per_gpu * gpus)


def fmt_flops(flops: float) -> str:
    """`312e12` → `312 TFLOP/s`, `1.0e14` → `100 TFLOP/s`, `989.4e12` → `989.4 TFLOP/s`."""
    return f"{flops / T:.4g} TFLOP/s"


def meets(value: float, threshold: float) -> bool:
    """value ≥ threshold, forgiving the last bits of float arithmetic."""
    return value + _TOL >= threshold


def mfu_checks(mfu: float, contract: Contract, subject: str, how: str) -> list[Check]:
    """The job gate (fail below) and the algorithm SLA (warn below) for an MFU."""
    shown = fmt_percent(mfu)
    gate, sla = contract.mfu.job_gate, contract.mfu.algorithm_sla
    fix = (
        "profile the step (data loading stalls, small kernels, communication not overlapped, activation "
        "recomputation); check --flops-per-step counts the model FLOPs of the whole step"
    )
    if meets(mfu, gate):
        gate_check = Check(
            "mfu.job_gate", "pass", subject, f"MFU {shown} ({how}): meets the job gate of {fmt_percent(gate)}"
        )
    else:
        gate_check = Check(
            "mfu.job_gate",
            "fail",
            subject,
            f"MFU {shown} ({how}), below the job gate of {fmt_percent(gate)}",
            fix=fix,
        )
    if meets(mfu, sla):
        sla_check = Check(
            "mfu.algorithm_sla",
            "pass",
            subject,
            f"MFU {shown}: meets the algorithm SLA of {fmt_percent(sla)}",
        )
    else:
        sla_check = Check(
            "mfu.algorithm_sla",
            "warn",
            subject,
            f"MFU {shown}, below the algorithm SLA of {fmt_percent(sla)}",
            fix=fix,
        )
    value = round(mfu, 6)
    return [replace(gate_check, value=value, threshold=gate), replace(sla_check, value=value, threshold=sla)]


def audit_mfu(
    contract: Contract,
    *,
    flops_per_step: float,
    step_time_s: float,
    gpus: int = 1,
    gpu: str | None = None,
    peak_flops: float | None = None,
    dtype: str = "bf16",
) -> AuditReport:
    """`triage audit mfu`: MFU from the inputs and the gate decisions."""
    if dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if (gpu is None) == (peak_flops is None):
        raise InputError("give exactly one of --gpu NAME and --peak-flops FLOPS")
    if gpu is not None:
        entry = find_gpu(gpu)
        peak = entry.peak(dtype)
        if peak is None:
            have = ", ".join(d for d in DTYPES if entry.peak(d) is not None)
            raise InputError(f"{entry.name} has no {dtype} tensor cores (it has: {have}); use --dtype")
        source = f"{entry.name} dense {dtype} (vendor datasheet)"
        device = f"{gpus} × {entry.name} {dtype}"
    else:
        assert peak_flops is not None
        peak = peak_flops
        source = "--peak-flops"
        device = f"{gpus} GPU{'s' if gpus != 1 else ''} at {fmt_flops(peak)}"
    mfu = compute_mfu(flops_per_step, step_time_s, peak, gpus)
    if mfu > 1 + _TOL:
        raise InputError(
            f"MFU would be {fmt_percent(mfu)}, above 100%: --flops-per-step is the model FLOPs of one step "
            "summed over all GPUs, --gpus the GPUs of the run, and the peak is per GPU"
        )
    achieved = flops_per_step / step_time_s
    per_gpu = achieved / gpus
    how = f"{fmt_flops(per_gpu)} per GPU of {fmt_flops(peak)} peak, {device}"
    return AuditReport(
        audit="mfu",
        target=gpu if gpu is not None else "--peak-flops",
        contract=contract,
        checks=mfu_checks(mfu, contract, "job", how),
        facts={
            "flops_per_step": flops_per_step,
            "step_time_s": step_time_s,
            "gpus": gpus,
            "gpu": find_gpu(gpu).name if gpu is not None else None,
            "dtype": dtype,
            "peak_flops_per_gpu": peak,
            "peak_source": source,
            "achieved_flops": achieved,
            "achieved_flops_per_gpu": per_gpu,
            "mfu": round(mfu, 6),
        },
    )
