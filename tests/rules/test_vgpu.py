"""A virtual-GPU layer in a collector bundle: HAMi-core preloads itself into the job, hooks
``cuMemGetInfo`` and reports its share as the device's total, so torch's message says "total capacity of
12.00 GiB" on an 80 GB A100 and no HAMi log line need be in the bundle. Two facts show the layer: its
memory limit in the job's environment (``CUDA_DEVICE_MEMORY_LIMIT_<i>``, HAMi's documented variable), and
a device that reports far less than its product name states.

HAMi cannot run here (it needs a GPU and its device plugin); the bundles follow the shapes its
documentation and its log lines give.
"""

from __future__ import annotations

from typing import Any

import pytest

from triage.evidence import _named_bytes, _vgpu_env_limit
from triage.pipeline import diagnose_bundle
from triage.units import GiB, MiB


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("NVIDIA A100-SXM4-80GB", 80),
        ("NVIDIA H100 80GB HBM3", 80),
        ("Tesla V100-SXM2-16GB", 16),
        ("NVIDIA L4", None),
        ("NVIDIA GH200 480GB", None),  # the superchip's CPU memory is in that figure
    ],
)
def test_the_memory_a_product_name_states(name: str, gib: int | None) -> None:
    assert _named_bytes(name) == (gib * GiB if gib else None)


def test_the_limit_in_the_environment() -> None:
    assert _vgpu_env_limit({"CUDA_DEVICE_MEMORY_LIMIT_1": "12288m"}, 1) == 12 * GiB
    assert _vgpu_env_limit({"CUDA_DEVICE_MEMORY_LIMIT": "12g"}, 0) == 12 * GiB
    assert _vgpu_env_limit({"CUDA_DEVICE_MEMORY_LIMIT": "4096"}, 0) == 4096 * MiB  # no unit: MiB
    assert _vgpu_env_limit({"CUDA_DEVICE_MEMORY_LIMIT_0": "lots"}, 0) is None
    assert _vgpu_env_limit(None, 0) is None


def _bundle(total_gib: float, env: dict[str, str]) -> dict[str, Any]:
    total = int(total_gib * GiB)
    held = total - 42 * MiB
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-0000000a1b2c",
        "occurred_at": "2026-11-30T12:00:00Z",
        "kind": "cuda_oom",
        "error": {
            "type": "torch.OutOfMemoryError",
            "message": (
                f"CUDA out of memory. Tried to allocate 48.00 MiB. GPU 0 has a total capacity of {total_gib:.2f} "
                f"GiB of which 42.00 MiB is free. Including non-PyTorch memory, this process has "
                f"{held / GiB:.2f} GiB memory in use. Of the allocated memory {held / GiB - 1.03:.2f} GiB is "
                "allocated by PyTorch, and 636.50 MiB is reserved by PyTorch but unallocated."
            ),
        },
        "workload": {"step": 1, "batch_size": 8, "pid": 1, "pids": [1]},
        "device": {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "total_bytes": total,
            "free_bytes": 42 * MiB,
            "processes": [],
        },
        "environment": env,
    }


@pytest.mark.parametrize(
    ("total_gib", "env", "limited"),
    [
        (12.0, {"CUDA_DEVICE_MEMORY_LIMIT_0": "12288m", "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"}, True),
        (12.0, {}, True),  # the name alone: 80 GB on the box, 12 GiB reported
        (79.15, {}, False),  # the whole GPU, as an 80 GB A100 reports itself
    ],
)
def test_a_vgpu_share_of_a_bigger_gpu_is_the_platform_s(
    total_gib: float, env: dict[str, str], limited: bool
) -> None:
    d, ev = diagnose_bundle(_bundle(total_gib, env))
    assert (ev.vgpu_limit_bytes is not None) == limited
    if limited:
        assert ev.vgpu_limit_bytes == 12 * GiB
        assert d.verdict == "gpu_quota" and d.owner == "platform", d.headline
        assert any("of the device's 80.0 GiB" in e.fact for e in d.evidence)
    else:
        assert d.verdict != "gpu_quota"


MSG_22 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
    "{total} of which 186.00 MiB is free. Including non-PyTorch memory, this process has {used} memory in use. "
    "Of the allocated memory {alloc} is allocated by PyTorch, and 372.00 MiB is reserved by PyTorch but "
    "unallocated."
)


def _log(device_lines: list[str], total: str, used: str, alloc: str) -> str:
    return "\n".join(
        [
            *device_lines,
            "step 200 loss 0.71",
            "Traceback (most recent call last):",
            MSG_22.format(total=total, used=used, alloc=alloc),
        ]
    )


@pytest.mark.parametrize(
    "device_line",
    ["device: NVIDIA A100-SXM4-80GB, torch 2.3.0+cu121", "Using GPU: NVIDIA H100 80GB HBM3 (count=1)"],
)
def test_a_log_naming_a_bigger_gpu_than_the_capacity_torch_saw_is_a_vgpu_share(device_line: str) -> None:
    """From the text alone: the job printed its device's product name, and torch's message gives a total
    capacity a quarter of it. Only a layer hooking ``cuMemGetInfo`` (or a slice) shows a device that way."""
    from triage.pipeline import diagnose_text

    d, ev = diagnose_text(_log([device_line], "20.00 GiB", "19.81 GiB", "18.92 GiB"))
    assert ev.device_name == device_line.split(": ", 1)[1].split(",")[0].split(" (")[0]
    assert ev.vgpu_limit_bytes == 20 * GiB
    assert d.verdict == "gpu_quota", d.headline


def test_a_log_naming_the_gpu_it_really_has_decides_nothing() -> None:
    from triage.pipeline import diagnose_text

    d, ev = diagnose_text(_log(["device: NVIDIA A100-SXM4-80GB"], "79.15 GiB", "78.90 GiB", "77.80 GiB"))
    assert ev.vgpu_limit_bytes is None
    assert d.verdict == "inconclusive" and "gpu_quota" not in d.candidates


def test_a_log_naming_gpus_of_two_sizes_names_no_device() -> None:
    """``nvidia-smi -L`` of a mixed node, or a message about another machine: which one this rank ran on
    is not in the text."""
    from triage.pipeline import diagnose_text

    lines = ["GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)", "GPU 1: NVIDIA A100-PCIE-40GB (UUID: GPU-2)"]
    d, ev = diagnose_text(_log(lines, "20.00 GiB", "19.81 GiB", "18.92 GiB"))
    assert ev.device_name == "" and ev.vgpu_limit_bytes is None
    assert d.verdict != "gpu_quota"


def test_a_vgpu_limit_over_a_gpu_of_unknown_size_leaves_the_platform_and_the_job_open() -> None:
    """HAMi's line says the job hit its share; torch sees the share as the whole device. Whether the share
    is what the job asked for is not in the text: the slice-sized question, for a vGPU."""
    from triage.pipeline import diagnose_text

    hami = "[HAMI-core ERROR (pid:1 thread=139872563422016 allocator.c:52)]: Device 0 OOM 16322134016 / 16106127360"
    d, ev = diagnose_text(_log([hami], "15.00 GiB", "13.25 GiB", "12.48 GiB"))
    assert ev.vgpu_limit_bytes == 16106127360 and ev.named_total_bytes is None
    assert d.verdict == "inconclusive", d.headline
    assert {"gpu_quota", "workload_too_large"} <= set(d.candidates)
    d, _ = diagnose_text(_log([hami, "device: NVIDIA A100-SXM4-80GB"], "15.00 GiB", "13.25 GiB", "12.48 GiB"))
    assert d.verdict == "gpu_quota", d.headline
