"""Narrow margins: a job that ran for hundreds of steps within a few hundred MiB of its device, and the
small things that decide when it stops fitting.

- A neighbour of under a GiB arrives: the steps had peaked at exactly what the failing moment needed, and
  fitted; the job can now hold less by no more than the neighbour holds. The neighbour took the margin:
  other_process, not a step too large. Without it (the job short by more than any neighbour holds, or the
  earlier steps far below this moment) it is not.
- Two findings 0.15 apart (a likely verdict beside a lead) decide: the engine's margin is not lost to the
  float error of subtracting scores.

Bundles follow docs/bundle.md (the collector's shape); the message is torch 2.2+'s.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules.base import LEAD, LIKELY, Finding
from triage.engine import decide
from triage.evidence import Evidence
from triage.pipeline import diagnose_bundle
from triage.units import GiB, MiB

PEAK = 22_542_836_224  # the earlier steps' peak, and (within 2 MiB) what the failing moment needed


def tight_l4(neighbour_mib: int, peak: int = PEAK) -> dict[str, Any]:
    """An L4 (22.17 GiB): 237 steps at batch 18 peaking at ``peak``, then a neighbour of
    ``neighbour_mib`` arrives and the next step's 3.51 GiB request fails."""
    msg = (
        "CUDA out of memory. Tried to allocate 3.51 GiB. GPU 0 has a total capacity of 22.17 GiB of which 3.20 GiB "
        f"is free. Process 715902 has {neighbour_mib:.2f} MiB memory in use. Process 713355 has 18.07 GiB memory "
        "in use. Of the allocated memory 17.49 GiB is allocated by PyTorch, and 203.74 MiB is reserved by PyTorch "
        "but unallocated."
    )
    timeline = [
        {"step": k, "allocated_bytes": 3125 * MiB, "peak_allocated_bytes": peak, "batch_size": 18}
        for k in range(237)
    ]
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": f"margin-{neighbour_mib}-{peak}",
        "occurred_at": "2026-11-30T08:00:00Z",
        "kind": "cuda_oom",
        "error": {"type": "torch.OutOfMemoryError", "message": msg},
        "workload": {"step": 237, "batch_size": 18, "pid": 8, "pids": [8]},
        "device": {
            "index": 0,
            "name": "NVIDIA L4",
            "total_bytes": 23_804_772_352,
            "free_bytes": 3_439_329_280,
            "processes": [
                {"pid": 715902, "used_bytes": neighbour_mib * MiB},
                {"pid": 713355, "used_bytes": 19_398_656_000},
            ],
        },
        "timeline": timeline,
    }


@pytest.mark.parametrize(
    ("neighbour_mib", "peak", "verdict"),
    [
        (874, PEAK, "other_process"),  # 874 MiB more would have held the step that ran 237 times
        (64, PEAK, None),  # the job was short of more than the neighbour holds
        (874, 16 * GiB, None),  # the earlier steps never came near this moment: this step is new
    ],
)
def test_a_small_neighbour_that_took_the_margin_the_steps_ran_in(
    neighbour_mib: int, peak: int, verdict: str | None
) -> None:
    d, ev = diagnose_bundle(tight_l4(neighbour_mib, peak))
    if verdict:
        assert ev.neighbour_took_margin == peak
        assert d.verdict == verdict, d.headline
        assert d.owner == "platform"
    else:
        assert ev.neighbour_took_margin is None
        assert d.verdict != "other_process", d.headline


def test_a_likely_finding_a_margin_above_a_lead_decides() -> None:
    ev = Evidence(kind="cuda_oom")
    top = Finding(rule="fragmentation", verdict="fragmentation", score=LIKELY)
    runner = Finding(rule="workload_too_large", verdict="workload_too_large", score=LEAD)
    d = decide(ev, [top, runner])
    assert d.verdict == "fragmentation"
