"""max_batch_size: what is fixed and what grows with the batch, read from the step samples and the stacks.

Two readings are pinned here, each on both sides:
- a bounded buffer (a cache of the last K per-batch tensors) filled at one batch size is per-sample
  memory *of that batch size*: after a ramp to a bigger batch its entries grow with the new size;
- at an OOM in the first forward pass, with a trace that also recorded the model being loaded, the
  fixed memory is what was live before the line that called the model began allocating (the weights,
  the batch), not the nothing the trace started from.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import workload_too_large
from tests.rules.rawsnap import one_block_segment
from triage.evidence import Evidence, _step_samples, _trend
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise
from triage.units import GiB, MiB


def _cache_then_ramp(ramp: bool) -> Evidence:
    """Fixed 10 GiB; 1 GiB of activations per sample; a cache of the last 4 outputs of 0.25 GiB per
    sample fills over steps 1-4 at batch 8 (2 GiB more per step: 8 GiB) and stays full. A step's peak
    holds its activations and its new entry before the oldest is dropped. With ``ramp`` one step then
    runs at batch 16, whose 4 GiB entry replaces a 2 GiB one."""
    samples: list[dict[str, Any]] = []
    live = 10 * GiB
    for step in range(10):
        peak = live + 10 * GiB  # 8 GiB of activations, the new 2 GiB entry (8 samples × 0.25 GiB)
        if 1 <= step <= 4:
            live += 2 * GiB  # the cache is not full yet: nothing is dropped
        samples.append({"step": step, "allocated_bytes": live, "peak_allocated_bytes": peak, "batch_size": 8})
    if ramp:
        peak = live + 16 * GiB + 4 * GiB  # 16 samples of activations, the new 16-sample entry
        live += 4 * GiB - 2 * GiB
        samples.append({"step": 10, "allocated_bytes": live, "peak_allocated_bytes": peak, "batch_size": 16})
    ev = Evidence(
        kind="cuda_oom",
        total_bytes=80 * GiB,
        reserved_bytes=40 * GiB,
        allocated_bytes=40 * GiB,
        device_free_bytes=38 * GiB,
        request_bytes=GiB,
        batch_size=16,
        step=len(samples),
        steps=_step_samples(samples),
        trend=_trend(samples),
    )
    assert ev.trend is not None and ev.trend.plateaued
    return ev


@pytest.mark.parametrize("ramp", [False, True])
def test_a_bounded_buffer_grows_with_the_batch_it_was_filled_at(ramp: bool) -> None:
    """usable 78 GiB; fixed without the cache 10 GiB (the level after the last step at batch 8, less
    the cache); per sample 1.25 GiB at the peak (activations and the new entry) + 4 entries × 0.25 GiB
    = 2.25 GiB → 30 samples, read the same way before and after a step at the new size (before this
    reading, the step at 16 divided the 8-sample cache by 16 and took the mixed level as fixed: 37)."""
    est, info = workload_too_large.estimate_max_batch(_cache_then_ramp(ramp))
    assert "bounded buffer" in info["source"]
    assert info["buffer_bytes"] == 8 * GiB
    assert info["fixed_bytes"] == 10 * GiB
    assert info["per_sample_bytes"] == 9 * GiB // 4
    assert est == 15  # capped below the batch that just failed
    ev = _cache_then_ramp(ramp)
    ev.kind = "none"
    assert workload_too_large.estimate_max_batch(ev)[0] == 30


def test_without_a_plateau_nothing_is_counted_as_a_buffer() -> None:
    samples = [
        {"step": s, "allocated_bytes": 10 * GiB, "peak_allocated_bytes": 18 * GiB, "batch_size": 8}
        for s in range(10)
    ]
    ev = Evidence(
        kind="none",
        reserved_bytes=60 * GiB,
        allocated_bytes=10 * GiB,
        device_free_bytes=18 * GiB,
        batch_size=8,
        steps=_step_samples(samples),
        trend=_trend(samples),
    )
    est, info = workload_too_large.estimate_max_batch(ev)
    assert "buffer_bytes" not in info and info["fixed_bytes"] == 10 * GiB
    assert est == 18  # 78 usable - 50 stranded (reserved, unallocated) - 10 fixed, at 1 GiB per sample


def test_an_upper_bound_keeps_the_memory_stranded_at_the_failing_batch() -> None:
    """One sample after the first step, then an OOM in the second: the failing step gives the per-sample
    figure (an upper bound). 20 GiB were reserved but unusable at batch 60; a smaller batch strands less,
    so taking all 20 GiB off would put the "upper bound" below batches that fit (as on an H200: 78 where
    82 fitted). A pair of completed steps gives an estimate, which takes the stranded memory off."""
    one = [{"step": 1, "allocated_bytes": 10 * GiB, "peak_allocated_bytes": 70 * GiB, "batch_size": 60}]

    def ev(samples: list[dict[str, Any]], request: int) -> Evidence:
        return Evidence(
            kind="cuda_oom",
            reserved_bytes=78 * GiB,
            allocated_bytes=58 * GiB,
            device_free_bytes=0,
            request_bytes=request,
            batch_size=60,
            steps=_step_samples(samples),
            trend=_trend(samples),
        )

    est, info = workload_too_large.estimate_max_batch(ev(one, 30 * GiB))
    assert info["source"] == "failing step (upper bound)" and "stranded_bytes" not in info
    assert est == 52  # (78 usable - 10 fixed) / (88 GiB needed - 10 fixed over 60 samples); 36 less 20
    two = [*one, {"step": 2, "allocated_bytes": 10 * GiB, "peak_allocated_bytes": 70 * GiB, "batch_size": 60}]
    est, info = workload_too_large.estimate_max_batch(ev(two, 12 * GiB))
    assert info["source"] == "1 completed steps" and info["stranded_bytes"] == 20 * GiB
    assert est == 48  # (78 - 20 stranded - 10) at 1 GiB per sample


# ---------------------------------------------------------------- the first forward pass
_TORCH = "/usr/lib/python3/dist-packages/torch/nn/modules/module.py"
WEIGHTS = [
    {"filename": _TORCH, "line": 1341, "name": "convert"},
    {"filename": _TORCH, "line": 942, "name": "_apply"},
    {"filename": _TORCH, "line": 1355, "name": "to"},
    {"filename": "/w/train.py", "line": 30, "name": "main"},
]
BATCH = [
    {"filename": "/w/train.py", "line": 50, "name": "train"},
    {"filename": "/w/train.py", "line": 80, "name": "main"},
]


def _in_forward(line: int) -> list[dict[str, Any]]:
    return [
        {"filename": "/w/model.py", "line": line, "name": "forward"},
        {"filename": _TORCH, "line": 1762, "name": "_call_impl"},
        {"filename": _TORCH, "line": 1751, "name": "_wrapped_call_impl"},
        {"filename": "/w/train.py", "line": 52, "name": "train"},
        {"filename": "/w/train.py", "line": 80, "name": "main"},
    ]


LOSS = [
    {"filename": "/w/train.py", "line": 53, "name": "train"},
    {"filename": "/w/train.py", "line": 80, "name": "main"},
]


def _first_step(oom_frames: list[dict[str, Any]], *, stacks: bool = True) -> dict[str, Any]:
    """A raw snapshot recorded from process start: 8 weights of 1 GiB loaded by ``model.to()``, a batch
    of 512 MiB, then the first forward pass (a 2 GiB activation per layer, a 1 GiB temporary freed in
    each), and the OOM."""
    trace: list[dict[str, Any]] = []
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    addr = 1 << 34

    def alloc(size: int, frames: list[dict[str, Any]]) -> int:
        nonlocal addr
        addr += 1 << 32
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames})
        live[addr] = (size, frames)
        return addr

    for _ in range(8):
        alloc(GiB, WEIGHTS)
    alloc(512 * MiB, BATCH)
    for layer in range(6):
        alloc(2 * GiB, _in_forward(10 + layer % 2))
        tmp = alloc(GiB, _in_forward(20))
        size, frames = live.pop(tmp)
        for action in ("free_requested", "free_completed"):
            trace.append({"action": action, "addr": tmp, "size": size, "stream": 0, "frames": frames})
    trace.append(
        {"action": "oom", "addr": 0, "size": 4 * GiB, "stream": 0, "device_free": 0, "frames": oom_frames}
    )
    if not stacks:
        for e in trace:
            e["frames"] = []
    segments = [one_block_segment(0, a, size, frames if stacks else []) for a, (size, frames) in live.items()]
    return {"segments": segments, "device_traces": [trace]}


@pytest.mark.parametrize("where", ["forward", "loss"])
def test_the_first_forward_pass_starts_where_the_model_is_called(where: str) -> None:
    """Live at the OOM: 8 GiB of weights, the 512 MiB batch, 12 GiB of activations. Fixed = the weights
    and the batch, whether the OOM came inside the forward (its own stack names the call line) or in the
    loss (the call line under which most live memory was made)."""
    oom = _in_forward(11) if where == "forward" else LOSS
    snap = normalise(_first_step(oom), source="test", shared_frames=False)
    _, ev = diagnose_snapshot(snap, batch_size=32)
    est, info = workload_too_large.estimate_max_batch(ev)
    assert info["fixed_bytes"] == 8 * GiB + 512 * MiB
    assert info["source"] == "failing step (upper bound)"
    # 16 GiB of this step (12 live + the 4 GiB request) for 32 samples: an upper bound of 31
    assert info["per_sample_bytes"] == 16 * GiB // 32
    assert est is not None and est < 32


def test_without_stacks_the_trace_start_is_all_that_is_known() -> None:
    """The same run recorded without stacks: nothing tells where training began, and the trace started
    at nothing: fixed 0 (the estimate is still capped below the failing batch)."""
    snap = normalise(_first_step([], stacks=False), source="test", shared_frames=False)
    _, ev = diagnose_snapshot(snap, batch_size=32)
    est, info = workload_too_large.estimate_max_batch(ev)
    assert info["fixed_bytes"] == 0
    assert est is not None and est < 32


def test_the_diagnosis_says_whether_the_number_is_a_ceiling() -> None:
    """A first-step OOM gives only a ceiling: the Diagnosis marks it and the report says "at most";
    completed steps give an estimate, printed as the number."""
    from triage.engine import diagnose
    from triage.render import max_batch_text

    snap = normalise(_first_step(_in_forward(11)), source="test", shared_frames=False)
    d, _ = diagnose_snapshot(snap, batch_size=32)
    assert d.max_batch_size is not None
    assert d.details["max_batch_size"]["bound"] == "upper"
    assert max_batch_text(d).startswith(f"at most {d.max_batch_size} ")

    d = diagnose(_cache_then_ramp(True))
    assert d.verdict == "workload_too_large" and d.max_batch_size == 15
    assert d.details["max_batch_size"] == {
        "value": 15,
        "bound": "estimate",
        "source": "10 completed steps (bounded buffer counted per sample)",
    }
    assert max_batch_text(d) == "15"


def test_completed_steps_at_two_batch_sizes_give_fixed_and_per_sample_memory() -> None:
    """A ramp from batch 8 to 12, then 16 fails: peaks 14 GiB at 8 and 18 GiB at 12 are 6 GiB fixed and 1 GiB a
    sample; 30 GiB usable → 24, capped below the failing 16. Below the larger size run, no fit is used."""
    samples = [
        {"step": k, "allocated_bytes": 6 * GiB, "peak_allocated_bytes": (14 if k < 5 else 18) * GiB,
         "batch_size": 8 if k < 5 else 12}
        for k in range(10)
    ]  # fmt: skip
    ev = Evidence(
        kind="cuda_oom",
        total_bytes=32 * GiB,
        reserved_bytes=29 * GiB,
        allocated_bytes=29 * GiB,
        device_free_bytes=GiB,
        request_bytes=2 * GiB,
        batch_size=16,
        step=10,
        steps=_step_samples(samples),
        trend=_trend(samples),
    )
    est, info = workload_too_large.estimate_max_batch(ev)
    assert info["source"] == "completed steps at batch sizes 8 and 12"
    assert info["fixed_bytes"] == 6 * GiB and info["per_sample_bytes"] == GiB
    assert est == 15
    ev.kind = "none"
    assert workload_too_large.estimate_max_batch(ev)[0] == 24
    ev.batch_size = 12  # not beyond the sizes run: the fit says nothing new
    assert "batch sizes" not in workload_too_large.estimate_max_batch(ev)[1].get("source", "")
