"""An inference server keeps one KV-cache tensor per request in flight: requests come and go, so the
cache site's live blocks outlive many calls of the model, yet their count comes and goes around one level
(it reached it early and then made several times as many again, freeing as many). That store is turning
over, not leaking, even though the count wanders above where it ends (a quarter more at most); and with
it seen turning over in a loop that runs no optimizer step (no step will ever show in a server's trace),
the trace has watched what outlived its calls and seen nothing grow, so the holes in the cache decide. A
site whose count climbs to the end is still a leak; a training loop's cache turning over settles nothing
about its failing step.

Snapshots are torch's raw layout (tests/rules/rawsnap.py); the bundle follows docs/bundle.md.
"""

from __future__ import annotations

import random
from typing import Any

from tests.rules.rawsnap import ACT, MiB, Trace, one_block_segment, segment_with_hole
from triage.pipeline import diagnose_bundle, diagnose_snapshot
from triage.simulate.scenarios import run_scenario
from triage.snapshot.loader import normalise

KV = [
    {"filename": "/app/server/kv_cache.py", "line": 77, "name": "allocate"},
    {"filename": "/app/server/engine.py", "line": 219, "name": "step"},
]
WEIGHTS = [{"filename": "/app/server/engine.py", "line": 40, "name": "load"}]


def server(*, level: int, leak_every: int | None) -> dict[str, Any]:
    """150 engine steps; each admits a request (a KV block of 40–120 MiB) and, once ``level`` are in
    flight, finishes a random one (``leak_every``: every that many finished requests is never freed);
    then a 2 GiB prefill fails beside 6 holes of 600 MiB."""
    rng = random.Random(7)
    t = Trace(0)
    in_flight: list[int] = []
    finished = 0
    for _ in range(150):
        acts = [t.alloc(256 * MiB, ACT) for _ in range(3)]
        in_flight.append(t.alloc(rng.randint(40, 120) * MiB, KV))
        for a in reversed(acts):
            t.free(a)
        while len(in_flight) > level + rng.randint(-4, 4):
            done = in_flight.pop(rng.randrange(len(in_flight)))
            finished += 1
            if leak_every is None or finished % leak_every:
                t.free(done)
    t.oom(2048 * MiB, ACT, device_free=800 * MiB)
    segments = t.segments()
    base = 1 << 46
    for k in range(6):
        segments.append(segment_with_hole(0, base + k * (1 << 32), 2048 * MiB, 600 * MiB, WEIGHTS))
    segments.append(one_block_segment(0, base + 7 * (1 << 32), 8192 * MiB, WEIGHTS))
    raw = {"segments": segments, "device_traces": [t.entries]}
    reserved = sum(s["total_size"] for s in segments)
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-0000000005e7",
        "occurred_at": "2026-11-30T12:00:00Z",
        "kind": "cuda_oom",
        "workload": {"pid": 7, "pids": [7]},
        "device": {
            "index": 0,
            "name": "NVIDIA L40S",
            "total_bytes": reserved + 1300 * MiB,
            "free_bytes": 800 * MiB,
            "processes": [{"pid": 7, "used_bytes": reserved + 500 * MiB, "name": "python"}],
        },
        "snapshot": raw,
    }


def test_requests_coming_and_going_around_one_level_are_a_store_turning_over() -> None:
    d, _ = diagnose_bundle(server(level=40, leak_every=None))
    assert d.verdict == "fragmentation"
    assert any(e.rule == "tensor_leak" and "a cache that evicts, not a leak" in e.fact for e in d.evidence)


def test_a_store_that_keeps_some_finished_requests_climbs_and_leaks() -> None:
    d, _ = diagnose_bundle(server(level=40, leak_every=3))
    assert not any("a cache that evicts" in e.fact for e in d.evidence)
    assert d.verdict == "tensor_leak"
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == (
        "/app/server/kv_cache.py",
        77,
    )


def test_a_training_cache_turning_over_does_not_settle_a_step_that_barely_fits_packed() -> None:
    """The simulator's cache of the last 4 feature tensors in a training loop whose batch grew 3 -> 7: the
    cache turns over in the trace, but the failing step, set beside the one before it, would need within a
    few percent of all the job may hold. Nothing in a snapshot and its message tells whether packing would
    have let the step finish: the steps' own samples decide (too large, in the bundle)."""
    case = run_scenario("bounded_cache", 17)
    snap = normalise(case.snapshot, source="simulated", shared_frames=False)
    d, _ = diagnose_snapshot(snap, message=case.message)
    assert d.verdict == "inconclusive" and "fragmentation" in d.candidates
    d, _ = diagnose_bundle(case.bundle)
    assert d.verdict == "workload_too_large"
