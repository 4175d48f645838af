"""Outputs kept by a loop that runs the model without gradients (an evaluation or inference loop under
``torch.no_grad()``): each call frees what it allocates as it goes, so memory swings by one layer's
temporaries, far less than a training step, and no optimizer step comes between the calls. What the loop
keeps outside the model (``preds.append(logits.float())``) piles up one block per call.

Two things tell it apart from a bounded cache and from one long step:
- between two kept blocks a whole call of the model came and went, giving back what it allocated;
- every kept block was made after the last optimizer step the collector sampled, so a flat per-step
  timeline (the training steps before the loop) says nothing about them. The trace's entries and the
  collector's samples share a clock (epoch µs); a sample outside the trace's span decides nothing.

The traces are built as torch records them (module-call frames inside the forward, the user line that
called the model outside them); the bundle is the collector's, with its per-step samples.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tests.rules.rawsnap import MiB, Trace, bundle
from tests.rules.test_kept_calls import TRAIN_CALL, backward, data, forward, line, under, weights
from triage.pipeline import diagnose_bundle

EVAL_CALL = line(120, "evaluate")  # `logits = model(x)` under torch.no_grad()
KEEP = [line(123, "evaluate"), line(210, "main")]  # `preds.append(logits.float())`
START_US = 1_780_000_000_000_000
STEP_US = 1000


def no_grad_call(t: Trace, out: int) -> int:
    """One call without gradients: the batch, per layer an activation freed by the next layer, then the
    output (returned to the loop, freed when the next call's output replaces it)."""
    batch = t.alloc(16 * MiB, data(EVAL_CALL))
    prev = None
    for _ in range(8):
        act = t.alloc(96 * MiB, under(EVAL_CALL, 30))
        if prev is not None:
            t.free(prev)
        prev = act
    if prev is not None:
        t.free(prev)
    t.free(batch)
    return t.alloc(out, under(EVAL_CALL, 44))


def after_training(
    tail: Callable[[Trace], None], *, steps: int = 6, sample_after_eval: bool = False
) -> dict[str, Any]:
    """``steps`` training steps the collector sampled, then ``tail`` runs, then the OOM of a layer's
    activation under EVAL_CALL; the trace's entries and the samples on one clock (epoch µs)."""
    t = Trace(0)
    weights(t)
    ends: list[int] = []
    for _ in range(steps):
        backward(t, forward(t, TRAIN_CALL, 128 * MiB))
        ends.append(len(t.entries) - 1)
    tail(t)
    t.entries.append(
        {
            "action": "oom",
            "addr": 0,
            "size": 96 * MiB,
            "stream": 0,
            "device_free": 0,
            "frames": under(EVAL_CALL, 30),
        }
    )
    for i, e in enumerate(t.entries):
        e["time_us"] = START_US + i * STEP_US
    base = 2048 * MiB
    timeline = [
        {
            "step": k + 1,
            "allocated_bytes": base,
            "peak_allocated_bytes": base + 8 * 128 * MiB,
            "time_us": START_US + (len(t.entries) - 5 if sample_after_eval else end) * STEP_US,
        }
        for k, end in enumerate(ends)
    ]
    raw = {"segments": t.segments(), "device_traces": [t.entries]}
    return bundle(raw, step=steps, timeline=timeline, batch_size=8)


def incident(
    *, steps: int = 6, evals: int = 10, keep: bool = True, sample_after_eval: bool = False
) -> dict[str, Any]:
    def evaluate(t: Trace) -> None:
        logits = None
        for _ in range(evals):
            new = no_grad_call(t, 64 * MiB)
            if logits is not None:
                t.free(logits)
            logits = new
            if keep:
                t.alloc(128 * MiB, KEEP)  # the float copy of the logits, kept in a list
        t.alloc(16 * MiB, data(EVAL_CALL))

    return after_training(evaluate, steps=steps, sample_after_eval=sample_after_eval)


def test_outputs_kept_by_a_no_grad_loop_after_the_last_step_are_a_leak_at_the_keeping_line() -> None:
    d, ev = diagnose_bundle(incident())
    kept = next(s for s in ev.survivors if s.stats.site.line == KEEP[0]["line"])
    assert kept.stats.count == 10 and kept.cycles == 9  # a whole call between every two of them
    assert ev.trend is not None and ev.trend.growth_bytes == 0  # the sampled steps are flat
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == KEEP[0]["line"]
    assert any("after the last optimizer step the collector sampled" in e.fact for e in d.evidence)


def test_the_same_blocks_under_a_flat_timeline_that_covers_them_stay_a_bounded_candidate() -> None:
    """Samples taken after the blocks were made, and flat: they were there at every step and did not grow
    (a cache that filled and stopped), so they are no leak by themselves."""
    d, _ = diagnose_bundle(incident(sample_after_eval=True))
    assert d.verdict != "tensor_leak", d.headline
    assert not any("after the last optimizer step" in e.fact for e in d.evidence)


def test_a_sample_clock_outside_the_trace_decides_nothing() -> None:
    b = incident()
    for s in b["timeline"]:
        s["time_us"] = s["time_us"] // 1000  # milliseconds: no longer the trace's clock
    d, _ = diagnose_bundle(b)
    assert d.verdict != "tensor_leak", d.headline


def test_a_no_grad_loop_that_keeps_nothing_has_no_survivors_across_its_calls() -> None:
    _, ev = diagnose_bundle(incident(keep=False))
    assert not any(s.stats.site.line == KEEP[0]["line"] for s in ev.survivors)
    assert all(s.cycles < 3 for s in ev.survivors)


@pytest.mark.parametrize("grow", [0, 1])
def test_calls_that_keep_more_than_the_block_do_not_count_as_calls_that_came_and_went(grow: int) -> None:
    """A training step that keeps its graph leaves more alive between two blocks than a quarter of the
    block: that is the kept-graph reading, not a call that gave back what it allocated."""
    from triage.evidence import _call_between, _model_calls

    t = Trace(0)
    weights(t)
    kept_idx = []
    out = None
    for _ in range(4):
        new = no_grad_call(t, 64 * MiB)
        if out is not None:
            t.free(out)
        out = new
        if grow:
            t.alloc(96 * MiB, under(EVAL_CALL, 50))  # something of the call left alive
        t.alloc(128 * MiB, KEEP)
        kept_idx.append(len(t.entries) - 1)
    b = incident()
    b["snapshot"] = {"segments": t.segments(), "device_traces": [t.entries]}
    b["timeline"] = []
    _, ev = diagnose_bundle(b)
    tl = ev.oom_timeline or ev.timelines[0]
    calls = _model_calls(ev, tl)
    got = [_call_between(tl, calls, sorted(calls), a, c) for a, c in itertools.pairwise(kept_idx)]
    assert got == [not grow] * 3
