"""Outputs a training loop holds past their step, from a model whose layers are library code (so every
block of a forward pass has the line that called the model as its innermost user frame).

- ``history.append(out.logits)``: one block per step survives, and the call under way at the OOM holds its
  activations under the same line. The call's blocks are one survivor, not one per layer: four kept
  logits over a five-step run are a leak at the call line, however many layers the failing call had run.
- ``logits, loss = model(x, y)`` with a sequence-length schedule: the previous step's logits live until the
  name is bound again, so live memory after each step rises with the sequence, and the steps' own peaks
  rise far faster. With a trace over those steps where nothing outlived the step after its own, nothing
  accumulates: not a leak.

Traces are built as torch records them (see test_kept_calls).
"""

from __future__ import annotations

from typing import Any

from tests.rules.rawsnap import MiB, Trace, bundle
from tests.rules.test_kept_calls import MAIN, weights
from triage.pipeline import diagnose_bundle, diagnose_snapshot
from triage.snapshot.loader import normalise

LIB = "/usr/lib/python3.11/site-packages/transformers/models/gemma/modeling_gemma.py"
TORCH = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"
SFT_CALL = {"filename": "/w/sft.py", "line": 48, "name": "train_step"}  # `outputs = model(**batch)`


def in_model(call: dict[str, Any], lib_line: int) -> list[dict[str, Any]]:
    return [
        {"filename": LIB, "line": lib_line, "name": "forward"},
        {"filename": TORCH, "line": 1762, "name": "_call_impl"},
        call,
        *MAIN,
    ]


def forward(t: Trace, layers: int, act: int, logits: int) -> tuple[list[int], int]:
    saved = []
    for _ in range(layers):
        saved.append(t.alloc(act, in_model(SFT_CALL, 310)))
        t.free(t.alloc(2 * act, in_model(SFT_CALL, 322)))
    return saved, t.alloc(logits, in_model(SFT_CALL, 1189))


def backward(t: Trace, saved: list[int]) -> None:
    flowing = t.alloc(64 * MiB, [])
    for a in reversed(saved):
        t.free(a)
    t.free(flowing)


def oom(t: Trace) -> dict[str, Any]:
    t.entries.append(
        {
            "action": "oom",
            "addr": 0,
            "size": 1 << 30,
            "stream": 0,
            "device_free": 0,
            "frames": in_model(SFT_CALL, 310),
        }
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def kept_logits(steps: int, keep: bool) -> dict[str, Any]:
    t = Trace(0)
    weights(t)
    for _ in range(steps):
        saved, logits = forward(t, 24, 96 * MiB, 1024 * MiB)
        backward(t, saved)
        if not keep:
            t.free(logits)
    for _ in range(12):  # the failing call: twelve layers in when it ran out
        t.alloc(96 * MiB, in_model(SFT_CALL, 310))
    return oom(t)


def test_logits_kept_each_step_of_a_short_run_are_a_leak_at_the_call() -> None:
    d, ev = diagnose_snapshot(normalise(kept_logits(4, keep=True)))
    site = next(s for s in ev.survivors if s.site.line == SFT_CALL["line"])
    assert site.cycles >= 3 and site.gaps <= site.cycles + 1  # the failing call's 12 blocks: one survivor
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == ("/w/sft.py", 48)


def test_logits_freed_each_step_are_not() -> None:
    d, _ = diagnose_snapshot(normalise(kept_logits(4, keep=False)))
    assert d.verdict != "tensor_leak", d.headline


def curriculum(steps: int, *, kept: bool) -> dict[str, Any]:
    """Sequence length up by an eighth of the first each step; the previous step's logits held until the
    next forward binds the name again (``kept``: appended to a list instead, never freed)."""
    t = Trace(0)
    weights(t)
    timeline = []
    prev: int | None = None
    for s in range(steps):
        scale = 8 + s
        saved, logits = forward(t, 16, 12 * scale * MiB, 24 * scale * MiB)
        peak = sum(size for size, _ in t.live.values())
        if prev is not None and not kept:
            t.free(prev)
        backward(t, saved)
        prev = logits
        live = sum(size for size, _ in t.live.values())
        timeline.append({"step": s, "allocated_bytes": live, "peak_allocated_bytes": peak, "batch_size": 8})
    for _ in range(6):
        t.alloc(12 * (8 + steps) * MiB, in_model(SFT_CALL, 310))
    return bundle(oom(t), step=steps, timeline=timeline, batch_size=8)


def test_a_sequence_schedule_holding_last_steps_logits_is_not_a_leak() -> None:
    b = curriculum(12, kept=False)
    d, ev = diagnose_bundle(b)
    assert ev.trend is not None and ev.trend.rising_fraction >= 0.9  # the floor rose at every step
    assert d.verdict != "tensor_leak", d.headline
    assert any("the steps themselves grew" in e.fact for e in d.evidence)


def test_the_same_schedule_keeping_every_steps_logits_is_one() -> None:
    d, _ = diagnose_bundle(curriculum(12, kept=True))
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == SFT_CALL["line"]
