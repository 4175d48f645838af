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


def _stairs(
    every: int,
    steps: int,
    rise: float,
    *,
    burst: int = 1,
    fall_at: int | None = None,
    until: int | None = None,
) -> list[dict[str, Any]]:
    """Live memory after each step: flat at 30 GiB, rising by ``rise`` GiB at every ``every``-th step (over
    ``burst`` steps in a row) up to step ``until``, and a 1 MiB buffer re-made smaller once at ``fall_at``."""
    out, level = [], 30 * GiB
    for k in range(1, steps + 1):
        if k % every < burst and k >= every and (until is None or k <= until):
            level += int(rise * GiB / burst)
        if k == fall_at:
            level -= 1 * MiB
        out.append(
            {
                "step": k,
                "allocated_bytes": level,
                "reserved_bytes": level + GiB,
                "peak_allocated_bytes": level + 8 * GiB,
                "time_us": k * 1_000_000,
                "batch_size": 8,
            }
        )
    return out


def test_a_staircase_between_its_risers_has_not_levelled_off() -> None:
    """Validation outputs kept every 500 steps (7.7 GiB each time), the OOM 499 steps after the third: the
    flat tail is the wait for the next riser, not a plateau. A buffer re-made 1 MiB smaller once does not
    make the stairs fall. A cache that filled in two bursts (eight steps in a row each) and then stayed flat
    for twice as long as between them has levelled off."""
    from triage.evidence import _trend

    stairs = _stairs(500, 2000, 7.7, fall_at=1402)
    trend = _trend(stairs)
    assert trend is not None and not trend.plateaued and trend.staircase
    d, _ = diagnose_bundle(bundle(stairs, req=3.1, alloc=61.0, ru=5.4))
    assert d.verdict == "tensor_leak", d.headline
    bursts = _trend(_stairs(400, 2000, 2.0, burst=8, until=900))
    assert bursts is not None and bursts.plateaued


def test_a_staircase_whose_flat_stretches_wobble_is_still_one() -> None:
    """Validation losses kept with their graphs every five steps (1.7 GiB each time); between the risers
    live memory wobbles by a few small blocks either way (a variable-length batch's last tensors): those
    falls are a twentieth of a riser or less and give back little. A cache cleared every few steps, whose
    falls give back what it rose by, is not a staircase however small its steps."""
    from triage.evidence import _trend

    level, stairs = 2.25 * GiB, []
    for k in range(55):
        if k and k % 5 == 0:
            level += 1.71 * GiB
        wobble = (k % 3 - 1) * 768 * 1024  # -768 KiB, 0, +768 KiB
        stairs.append(
            {"step": k, "allocated_bytes": int(level + wobble), "peak_allocated_bytes": int(level + 4 * GiB)}
        )
    trend = _trend(stairs)
    assert trend is not None and trend.falling_fraction > 0.05  # the wobbles do fall ...
    assert trend.major_falling_fraction == 0 and trend.staircase  # ... by a sliver of a riser
    saw = []
    level = 10 * GiB
    for k in range(55):
        level = 10 * GiB if k % 5 == 0 else level + GiB
        saw.append({"step": k, "allocated_bytes": level, "peak_allocated_bytes": level + 4 * GiB})
    trend = _trend(saw)
    assert trend is not None and not trend.staircase
