"""Step samples that say what the holes and a site's survivors cannot:

- live memory that grew, then never again went above its highest point for a third of the run or more (a
  store of the last N requests' caches turning over with entries of different sizes) stopped growing: no
  leak, however it wobbles;
- steps that typically peaked above all the job could hold at the OOM (its reservation plus the device's
  free memory): the memory it may use shrank, so packing its holes would not have saved the step.

Bundles follow docs/bundle.md; messages follow SNAPSHOT_FORMAT.md §4 (2.2+).
"""

from __future__ import annotations

from typing import Any

import pytest

from triage.evidence import _trend
from triage.pipeline import diagnose_bundle

GiB = 1 << 30
MSG = (
    "CUDA out of memory. Tried to allocate {req:.2f} GiB. GPU 0 has a total capacity of {total:.2f} GiB of which "
    "{free:.2f} GiB is free. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and {ru:.2f} GiB is "
    "reserved by PyTorch but unallocated."
)


def _series(values: list[float], peak_over: float = 2.0) -> list[dict[str, Any]]:
    return [
        {
            "step": k,
            "allocated_bytes": int(v * GiB),
            "peak_allocated_bytes": int((v + peak_over) * GiB),
            "batch_size": 16,
        }
        for k, v in enumerate(values)
    ]


def _bundle(
    timeline: list[dict[str, Any]], *, req: float, alloc: float, ru: float, free: float, total: float
) -> Any:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-00000000a11e",
        "occurred_at": "2026-12-01T04:00:00Z",
        "kind": "cuda_oom",
        "error": {
            "type": "torch.OutOfMemoryError",
            "message": MSG.format(req=req, total=total, free=free, alloc=alloc, ru=ru),
        },
        "workload": {"step": len(timeline), "batch_size": 16, "pid": 7, "pids": [7]},
        "device": {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "total_bytes": int(total * GiB)},
        "timeline": timeline,
        "snapshot": None,
    }


TURNOVER = [12.0, 15.6, 25.1, 33.1, 35.9, 45.2, 47.1, 50.2, 46.6, 44.9, 45.5, 42.0, 41.0, 41.7, 49.8]
LEAK = [12.0, 15.6, 25.1, 33.1, 35.9, 45.2, 47.1, 50.2, 46.6, 51.0, 52.5, 51.9, 54.0, 55.2, 57.1]


def test_a_store_that_turns_over_stopped_growing() -> None:
    t = _trend(_series(TURNOVER))
    assert t is not None and t.since_high == 7 and t.plateaued
    d, _ = diagnose_bundle(_bundle(_series(TURNOVER), req=1.73, alloc=64.5, ru=12.8, free=1.33, total=79.15))
    assert d.verdict != "tensor_leak", d.headline


def test_new_highs_to_the_end_are_still_growth() -> None:
    t = _trend(_series(LEAK))
    assert t is not None and t.since_high == 0 and not t.plateaued
    d, _ = diagnose_bundle(_bundle(_series(LEAK), req=1.73, alloc=75.5, ru=1.8, free=1.33, total=79.15))
    assert d.verdict == "tensor_leak", d.headline


@pytest.mark.parametrize(("peak", "capped"), [(11.2, True), (8.0, False)])
def test_steps_that_peaked_above_all_it_could_hold_were_squeezed_not_fragmented(
    peak: float, capped: bool
) -> None:
    """Steps peaking at 11.2 GiB; at the OOM the job could hold 9.0 GiB (13 GiB of the 22 GiB card outside
    its allocator): 1.6 GiB of holes and 4.2 GiB free would have held the 4.5 GiB request, but not the rest of
    a step like the ones before. Steps peaking at 8 GiB leave the holes' story standing."""
    from rules import fragmentation
    from triage.evidence import Evidence, _step_samples
    from triage.snapshot.model import Segment, Snapshot

    samples = _series([3.1 + 0.01 * (k % 3) for k in range(40)], peak_over=peak - 3.1)
    ev = Evidence(
        kind="cuda_oom",
        snapshot=Snapshot([Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])], [], {}, [], era="v2"),
        total_bytes=int(22.06 * GiB),
        reserved_bytes=int(4.8 * GiB),
        allocated_bytes=int(3.2 * GiB),
        device_free_bytes=int(4.2 * GiB),
        request_bytes=int(4.5 * GiB),
        largest_free_block_bytes=int(1.3 * GiB),
        free_in_pool_bytes=int(1.6 * GiB),
        batch_size=16,
        step=40,
        steps=_step_samples(samples),
        trend=_trend(samples),
    )
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert any("would not have fitted" in s for s in f.facts) is capped
    assert (f.score <= 0.25) is capped  # CANDIDATE: cannot be ruled out, nothing for it
