"""A step that failed within a sliver of everything the job could hold.

With the device's size from the OOM message and a trace with stacks, a replay (no collector) can say the
step is too large when the job needed all but a few percent of what it could ever hold and nothing in
the trace could have filled the device instead: packing the cache's few holes would have put the failure
off by an allocation or two, not let the step finish. "Nothing else" needs proof from the trace: several
steps in which no site's blocks survived from step to step, or a trace from the model's load that has not
yet seen a step end; no earlier forward passes still held (kept validation outputs fill the device the
same way, and the step itself may be small); never a leak recorded without stacks or a trace too short.

Holes that are a sliver of what the job may hold do not argue against a too-large step either: the rule
does not take off for them.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import workload_too_large
from rules.base import LIKELY, POSSIBLE
from tests.rules.rawsnap import MiB, Trace
from tests.rules.test_kept_calls import TRAIN_CALL, data, oom, under, weights
from triage.evidence import Evidence
from triage.pipeline import diagnose_snapshot
from triage.simulate.scenarios import run_scenario
from triage.snapshot.loader import normalise
from triage.snapshot.model import Segment, Snapshot
from triage.units import GiB


def replay(name: str, seed: int, **params: Any) -> str:
    r = run_scenario(name, seed, **params)
    assert r.snapshot is not None and r.message
    d, _ = diagnose_snapshot(
        normalise(r.snapshot, source="simulated", shared_frames=False), message=r.message
    )
    return d.verdict


@pytest.mark.parametrize(("name", "seed"), [("workload_too_large", 0), ("small_request_big_hole", 1)])
def test_a_first_step_that_fills_the_device_is_too_large_from_the_snapshot_and_message(
    name: str, seed: int
) -> None:
    assert replay(name, seed) == "workload_too_large"


@pytest.mark.parametrize(
    ("name", "seed", "params"),
    [("leak_no_frames", 1, {}), ("tensor_leak", 2, {"small_ring": True}), ("leak_like_big_batch", 44, {})],
)
def test_a_leak_the_trace_cannot_show_is_never_called_too_large(
    name: str, seed: int, params: dict[str, Any]
) -> None:
    """Without stacks, with a ring buffer too short to reach back, or with a trace of four steps in which a
    line's blocks survived two of them (too few to convict, enough to doubt), a leak fills the device the
    same way."""
    assert replay(name, seed, **params) in ("tensor_leak", "inconclusive")


def _first_step(start_from_nothing: bool) -> dict[str, Any]:
    """The model loaded, then one forward pass whose ninth layer fails: 2 GiB of weights, 8 saved 1 GiB
    activations, and one segment split around a 56 MiB block with a 200 MiB hole beside it. Without the
    load in the trace (a ring buffer that dropped it), nothing shows that the job was in its first step."""
    t = Trace(0)
    if start_from_nothing:
        weights(t)
    t.alloc(16 * MiB, data(TRAIN_CALL))
    for _ in range(8):
        t.alloc(1024 * MiB, under(TRAIN_CALL, 30))
        t.free(t.alloc(2048 * MiB, under(TRAIN_CALL, 34)))
    raw = oom(t, TRAIN_CALL)
    held, hole = 56 * MiB, 200 * MiB
    # the small block beside the hole, allocated first (the trace begins with it)
    first = {
        "action": "alloc",
        "addr": 0x7F00_0000_0000,
        "size": held,
        "stream": 0,
        "frames": data(TRAIN_CALL),
    }
    raw["device_traces"][0].insert(0, first)
    if not start_from_nothing:  # the weights are live, their allocations older than the trace
        w = Trace(1)
        weights(w)
        raw["segments"] += [
            {**seg, "device": 0, "blocks": [{**seg["blocks"][0], "frames": []}]} for seg in w.segments()
        ]
    raw["segments"].append(
        {
            **raw["segments"][0],
            "address": 0x7F00_0000_0000,
            "total_size": held + hole,
            "allocated_size": held,
            "active_size": held,
            "requested_size": held,
            "blocks": [
                {
                    "address": 0x7F00_0000_0000,
                    "size": held,
                    "requested_size": held,
                    "state": "active_allocated",
                    "frames": [],
                },
                {
                    "address": 0x7F00_0000_0000 + held,
                    "size": hole,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                },
            ],
        }
    )
    return raw


def _message(raw: dict[str, Any], free: int, request: int) -> str:
    allocated = sum(s["allocated_size"] for s in raw["segments"])
    reserved = sum(s["total_size"] for s in raw["segments"])
    total = reserved + free + 500 * MiB  # the CUDA context
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request / MiB:.2f} MiB. GPU 0 has a total "
        f"capacity of {total / GiB:.2f} GiB of which {free / MiB:.2f} MiB is free. Including non-PyTorch memory, "
        f"this process has {(reserved + 500 * MiB) / GiB:.2f} GiB memory in use. Of the allocated memory "
        f"{allocated / MiB:.2f} MiB is allocated by PyTorch, and {(reserved - allocated) / MiB:.2f} MiB is reserved "
        "by PyTorch but unallocated."
    )


@pytest.mark.parametrize(("from_nothing", "decided"), [(True, True), (False, False)])
def test_the_first_step_is_known_only_from_a_trace_that_saw_the_model_load(
    from_nothing: bool, decided: bool
) -> None:
    """10 GiB held, 256 MiB asked; a 200 MiB hole and 100 MiB free on the device would have held it,
    packed: within 1% of all the job could hold."""
    raw = _first_step(from_nothing)
    d, ev = diagnose_snapshot(normalise(raw), message=_message(raw, free=100 * MiB, request=256 * MiB))
    usable = (ev.reserved_bytes or 0) + (ev.device_free_bytes or 0)
    assert ev.needed_bytes is not None and 0 <= usable - ev.needed_bytes < 0.05 * usable
    assert (d.verdict == "workload_too_large") is decided, d.headline
    assert d.verdict in ("workload_too_large", "inconclusive")


def _holes(free_in_pool: int) -> Evidence:
    seg = Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])
    return Evidence(
        kind="cuda_oom",
        snapshot=Snapshot([seg], [], {}, [], era="v2"),
        total_bytes=80 * GiB,
        reserved_bytes=78 * GiB,
        allocated_bytes=78 * GiB - free_in_pool,
        device_free_bytes=100 * MiB,
        request_bytes=2 * GiB,
        largest_free_block_bytes=GiB,
        free_in_pool_bytes=free_in_pool,
        step=0,
    )


@pytest.mark.parametrize(("free_in_pool", "penalised"), [(3 * GiB, False), (8 * GiB, True)])
def test_holes_a_sliver_of_what_the_job_may_hold_do_not_count_against_a_too_large_step(
    free_in_pool: int, penalised: bool
) -> None:
    """At step 0, 3 GiB of holes (under 5% of 78 GiB) beside a 2 GiB request: packed they would have served
    it, but the step was still going; 8 GiB of holes are a layout that may have decided it."""
    f = workload_too_large.evaluate(_holes(free_in_pool))
    assert f is not None
    assert any("packed, it would have fitted" in s for s in f.facts)
    assert (f.score < LIKELY) is penalised
    assert f.score >= POSSIBLE
