"""A replay (a snapshot with its OOM message, no incident context) knows the device only from the
message: its size, not what the job was scheduled for. A step that cannot fit a 22 GiB L4 is too large
for that L4, and the same numbers are the platform's when the pod had asked for an 80 GB GPU; the
replay's answer says what would tell the two apart. The bundle carries the device record, and says
nothing of the kind when it knows the job runs on what it asked for.
"""

from __future__ import annotations

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
