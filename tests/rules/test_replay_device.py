"""A replay (a snapshot with its OOM message, no incident context) knows the device only from the
message: its size, not what the job was scheduled for. A step that cannot fit a 22 GiB L4 is too large
for that L4, and the same numbers are the platform's when the pod had asked for an 80 GB GPU; the
replay's answer says what would tell the two apart. The bundle carries the device record, and says
nothing of the kind when it knows the job runs on what it asked for.
"""

from __future__ import annotations

import copy
from typing import Any

from triage.pipeline import diagnose_bundle, diagnose_snapshot
from triage.simulate.scenarios import run_scenario
from triage.snapshot.loader import normalise


def _scheduled_for(missing: list[str]) -> list[str]:
    return [m for m in missing if "scheduled for" in m]


def test_replay_names_the_device_it_cannot_see_the_request_for() -> None:
    case = run_scenario("gpu_quota", 2)  # declared an A100-80GB, ran on an L4
    snap = normalise(case.snapshot, source="simulated", shared_frames=False)
    d, _ = diagnose_snapshot(snap, message=case.message)
    assert d.verdict == "workload_too_large"
    lines = _scheduled_for(d.missing)
    assert len(lines) == 1 and "22.2 GiB" in lines[0] and "gpu_quota" in lines[0]


def test_bundle_with_the_device_record_does_not_ask() -> None:
    case = run_scenario("gpu_quota", 2)
    d, _ = diagnose_bundle(case.bundle)
    assert d.verdict == "gpu_quota"
    assert _scheduled_for(d.missing) == []
    too_large = run_scenario("workload_too_large", 2)
    d, _ = diagnose_bundle(too_large.bundle)
    assert d.verdict == "workload_too_large"
    assert _scheduled_for(d.missing) == []


def _with_request(raw: dict[str, Any], size: int) -> dict[str, Any]:
    """The snapshot with its allocator's ``oom`` entry asking for ``size`` bytes."""
    out = copy.deepcopy(raw)
    for trace in out["device_traces"]:
        for e in trace:
            if e["action"] == "oom":
                e["size"] = size
    return out


def test_a_snapshot_alone_whose_holes_held_the_request_within_its_reservation_is_fragmentation() -> None:
    """A snapshot alone does not show the device: a neighbour's share or a smaller slice cannot be ruled out
    for a request that needed more device memory. One that fitted, packed, in the segments the job had
    already reserved did not need any."""
    case = run_scenario("fragmentation", 1)
    d, ev = diagnose_snapshot(normalise(case.snapshot, source="simulated", shared_frames=False))
    assert ev.device_unseen
    assert ev.needed_bytes is not None and ev.reserved_bytes is not None
    assert ev.needed_bytes <= ev.reserved_bytes
    assert d.verdict == "fragmentation"
    # a request that the holes and the device's free memory could serve together, but not the reservation
    # alone: the job needed more of the device, and what limited it there is not in the snapshot
    pool = ev.free_in_pool_bytes or 0
    d, ev = diagnose_snapshot(
        normalise(_with_request(case.snapshot, pool + (1 << 30)), source="simulated", shared_frames=False)
    )
    assert ev.needed_bytes is not None and ev.reserved_bytes is not None
    assert ev.needed_bytes > ev.reserved_bytes
    assert d.verdict == "inconclusive"


def test_a_snapshot_alone_whose_reach_is_a_mig_slices_size_leaves_the_holes_undecided() -> None:
    """The same holes on a MIG slice: the job's reach (reservation plus the device's free memory) is just
    under a 20 GB slice's size, and whether the job was meant to run in that slice is not in a snapshot."""
    case = run_scenario("gpu_quota", 10)  # a 3g.20gb slice where a whole A100-40GB was declared
    d, ev = diagnose_snapshot(normalise(case.snapshot, source="simulated", shared_frames=False))
    assert ev.needed_bytes is not None and ev.reserved_bytes is not None
    assert ev.needed_bytes <= ev.reserved_bytes  # the holes held the request
    assert ev.slice_sized is not None and "20gb" in ev.slice_sized
    assert d.verdict == "inconclusive"
    assert "gpu_quota" in d.candidates


def test_holes_beside_a_site_kept_at_every_step_are_not_decided_by_a_snapshot_alone() -> None:
    """A small leak (one block at each of 33 steps, 1.7% of the job's memory) pins its blocks between each
    step's temporaries: the holes the OOM failed beside may be its doing, and a snapshot has no step samples to
    say whether live memory grew to the OOM."""
    case = run_scenario("tensor_leak", 47)
    snap = normalise(case.snapshot, source="simulated", shared_frames=False)
    d, ev = diagnose_snapshot(snap)
    assert ev.needed_bytes is not None and ev.reserved_bytes is not None
    assert ev.needed_bytes <= ev.reserved_bytes  # the holes held the request, as in the case above
    assert d.verdict == "inconclusive"
    assert d.candidates[:2] == ["tensor_leak", "fragmentation"]
    # the bundle's step samples show the growth
    d, _ = diagnose_bundle(case.bundle)
    assert d.verdict == "tensor_leak"
