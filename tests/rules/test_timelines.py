"""Per-step samples that tell the story, with the OOM message and no snapshot (history not recorded):
- a cache that grows at nearly every step and is cleared every few hundred steps rises at nearly every
  step too, but gives back all it gained each time: a saw-tooth, not a leak;
- a batch that grew (an evaluation batch seven times the training one) beside a neighbour holding almost
  half the GPU: the job alone would fit the device, so the grown batch does not outweigh the neighbour.
"""

from __future__ import annotations

from typing import Any

from triage.pipeline import diagnose_bundle
from triage.units import GiB, MiB

MSG = (
    "CUDA out of memory. Tried to allocate {req:.2f} GiB. GPU 0 has a total capacity of 79.25 GiB of which "
    "{free:.2f} GiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB memory in use.{other} "
    "Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and {ru:.2f} GiB is reserved by PyTorch "
    "but unallocated."
)


def bundle(
    timeline: list[dict[str, Any]], *, req: float, alloc: float, ru: float, other: float = 0.0, batch: int = 8
) -> dict[str, Any]:
    used = alloc + ru + 0.5
    free = 79.25 - used - other
    procs = [{"pid": 7, "used_bytes": int(used * GiB), "name": "python"}]
    if other:
        procs.append({"pid": 30711, "used_bytes": int(other * GiB), "name": "python"})
    text = MSG.format(
        req=req,
        free=free,
        used=used,
        other=f" Process 30711 has {other:.2f} GiB memory in use." if other else "",
        alloc=alloc,
        ru=ru,
    )
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-0000000071e5",
        "occurred_at": "2026-11-30T12:00:00Z",
        "kind": "cuda_oom",
        "error": {"type": "torch.OutOfMemoryError", "message": text},
        "workload": {"step": timeline[-1]["step"] + 1, "batch_size": batch, "pid": 7, "pids": [7]},
        "device": {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "total_bytes": int(79.25 * GiB),
            "free_bytes": int(free * GiB),
            "processes": procs,
        },
        "timeline": timeline,
        "snapshot": None,
    }


def test_a_cache_cleared_every_few_hundred_steps_is_a_saw_tooth_not_a_leak() -> None:
    """8 MiB more after every step, back to the baseline every 400 steps; then a batch four times the usual
    length asks for 19.5 GiB at step 1321."""
    base = 9 * GiB
    timeline = [
        {"step": k, "allocated_bytes": base + (k % 400) * 8 * MiB, "peak_allocated_bytes": base + 30 * GiB}
        for k in range(1321)
    ]
    d, ev = diagnose_bundle(bundle(timeline, req=19.5, alloc=72.8, ru=3.2))
    assert ev.trend is not None and ev.trend.rising_fraction > 0.99 and ev.trend.given_back > 0.9
    assert d.verdict != "tensor_leak", d.headline


def test_the_same_rise_never_given_back_is_a_leak() -> None:
    base = 9 * GiB
    timeline = [
        {
            "step": k,
            "allocated_bytes": base + k * 48 * MiB,
            "peak_allocated_bytes": base + k * 48 * MiB + 4 * GiB,
        }
        for k in range(1321)
    ]
    d, ev = diagnose_bundle(bundle(timeline, req=1.0, alloc=72.8, ru=0.3))
    assert ev.trend is not None and ev.trend.given_back == 0
    assert d.verdict == "tensor_leak", d.headline


def test_a_grown_batch_beside_a_neighbour_holding_half_the_gpu_is_the_neighbour() -> None:
    """Training at batch 40 for 2000 steps, then an evaluation batch of 280 asks for 34.2 GiB with 11.4 GiB
    held: 45.6 GiB, which an empty 79 GiB device holds, but a process left from the previous attempt holds
    36 GiB of it."""
    timeline = [
        {"step": k, "allocated_bytes": 7 * GiB, "peak_allocated_bytes": 12 * GiB, "batch_size": 40}
        for k in range(2000)
    ]
    d, _ = diagnose_bundle(bundle(timeline, req=34.18, alloc=11.36, ru=5.94, other=36.0, batch=280))
    assert d.verdict == "other_process", d.headline
    d, _ = diagnose_bundle(bundle(timeline, req=34.18, alloc=11.36, ru=5.94, other=0.0, batch=280))
    assert d.verdict != "other_process", d.headline
