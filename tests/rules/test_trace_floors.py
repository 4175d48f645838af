"""A serving loop's trace: each request's KV tensor is made when the request is admitted and freed when it
completes, so blocks outlive the step that made them without anything leaking; every step also makes and
frees its temporaries. When the trace's step floors (what each step kept) did not climb, nothing grew,
and a request that no hole could take while the holes and the device's free memory together could is the
holes' doing. When the floors climb step after step (requests never freed), the holes may be a leak's.

Traces are built as torch records them (see test_kept_calls); the final segments hold each live block
with the hole beside it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.rules.rawsnap import MiB, Trace, segment_with_hole
from tests.rules.test_kept_calls import weights
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

GiB = 1 << 30
ADMIT = [
    {"filename": "/srv/engine.py", "line": 167, "name": "admit"},
    {"filename": "/srv/engine.py", "line": 240, "name": "loop"},
]
STEP = [
    {"filename": "/srv/model.py", "line": 88, "name": "decode"},
    {"filename": "/srv/engine.py", "line": 251, "name": "loop"},
]
HOLE = 600 * MiB


def serve(steps: int, *, complete: bool, seed: int = 3) -> dict[str, Any]:
    rng = random.Random(seed)
    t = Trace(0)
    weights(t)
    active: list[tuple[int, int]] = []  # (step it completes at, address)
    for s in range(steps):
        for _ in range(2):  # two requests admitted per step, each living 2-4 steps
            active.append((s + rng.randint(2, 4), t.alloc(rng.randint(400, 900) * MiB, ADMIT)))
        tmps = [t.alloc(1536 * MiB, STEP) for _ in range(4)]
        for a in reversed(tmps):
            t.free(a)
        if complete:
            for entry in [e for e in active if e[0] <= s]:
                active.remove(entry)
                t.free(entry[1])
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 2 * GiB, "stream": 0, "device_free": 1 * GiB, "frames": ADMIT}
    )
    segments = [segment_with_hole(0, addr, size, HOLE, frames) for addr, (size, frames) in t.live.items()]
    return {"segments": segments, "device_traces": [t.entries]}


def message(raw: dict[str, Any]) -> str:
    """The OOM message for ``raw``: 1 GiB free on the device beside the job's reservation and context."""
    allocated = sum(s["allocated_size"] for s in raw["segments"])
    reserved = sum(s["total_size"] for s in raw["segments"])
    total = reserved + GiB + 500 * MiB
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        f"{total / GiB:.2f} GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has "
        f"{(reserved + 500 * MiB) / GiB:.2f} GiB memory in use. Of the allocated memory {allocated / MiB:.2f} MiB "
        f"is allocated by PyTorch, and {(reserved - allocated) / MiB:.2f} MiB is reserved by PyTorch but unallocated."
    )


@pytest.mark.parametrize(("complete", "want"), [(True, True), (False, False)])
def test_a_server_whose_step_floors_held_still_ran_out_in_its_holes(complete: bool, want: bool) -> None:
    raw = serve(12, complete=complete)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert ev.trace_steps >= 4
    assert ev.trace_floor_flat is want
    assert any(s.cycles for s in ev.survivors)  # blocks outlived their steps either way
    if want:
        assert d.verdict == "fragmentation", d.headline
    else:
        assert d.verdict != "fragmentation", d.headline
