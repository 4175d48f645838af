"""What counts as a step between two surviving blocks of one line: not the gradients of one backward pass,
not the layers of one forward pass, not the micro-steps of a job in its first steps.

On the autograd engine's thread a backward pass frees the saved activations layer by layer while it makes
the gradients, so live memory falls between two gradients of one pass and does not come back: no step
ended between them. The gradients then live across the micro-steps of gradient accumulation (or for the
whole run, zeroed in place) until ``zero_grad`` frees them. A kept tensor, by contrast, is made once per
step, and between two of them a whole backward and the next forward come and go.

In a forward pass the same line saves a tensor at every layer, and between two layers the temporaries
(the attention scores) make live memory rise and fall; that swing is small next to the fall at the end of
a step, when the backward frees everything the forward saved.

These traces give the gradients the stack of the line that called ``backward()`` — what a job shows when
its backward runs Python (a hook, a custom Function) — so the site is user code and only the step
boundaries decide.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.rawsnap import ACT, KEEP, MiB, Trace
from triage.pipeline import diagnose_bundle, diagnose_snapshot
from triage.snapshot.loader import normalise

BACKWARD = [{"filename": "/w/train.py", "line": 147, "name": "train_step"}]
WEIGHTS = [{"filename": "/w/train.py", "line": 30, "name": "main"}]
LAYERS = 12


def _backward(t: Trace, acts: list[int], grads: list[int] | None) -> None:
    """Layer by layer from the last: the gradient flowing back (made on the engine's thread, no Python
    frames) replaces the previous one, the layer's weight gradient is made (the first backward of an
    optimizer step only: later ones accumulate into it), the layer's saved activation is freed."""
    flowing = t.alloc(512 * MiB, [])
    for layer in reversed(range(LAYERS)):
        nxt = t.alloc(512 * MiB, [])
        t.free(flowing)
        flowing = nxt
        if grads is not None:
            grads.append(t.alloc(256 * MiB, BACKWARD))
        t.free(acts[layer])
    t.free(flowing)


def _accumulation(optimizer_steps: int, micro: int, keep_each_micro_step: bool) -> dict[str, Any]:
    t = Trace(0)
    for _ in range(LAYERS):
        t.alloc(256 * MiB, WEIGHTS)
    for _ in range(optimizer_steps):
        grads: list[int] = []
        for m in range(micro):
            acts = [t.alloc(512 * MiB, ACT) for _ in range(LAYERS)]
            if keep_each_micro_step:
                t.alloc(8 * MiB, KEEP)  # e.g. `losses.append(loss)`: the graph's output kept
            _backward(t, acts, grads if m == 0 else None)
        for g in grads:  # optimizer.zero_grad(set_to_none=True)
            t.free(g)
    # the next optimizer step's first backward made its gradients; the OOM comes in the second micro-step
    _backward(t, [t.alloc(512 * MiB, ACT) for _ in range(LAYERS)], [])
    for _ in range(LAYERS // 2):
        t.alloc(512 * MiB, ACT)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def test_the_gradients_of_one_backward_are_not_survivors_of_many_steps() -> None:
    d, ev = diagnose_snapshot(
        normalise(_accumulation(optimizer_steps=3, micro=4, keep_each_micro_step=False))
    )
    grads = [s for s in ev.survivors if s.stats.site.line == 147]
    assert grads and max(s.cycles for s in grads) < 3
    assert d.verdict != "tensor_leak"


def test_a_tensor_kept_every_micro_step_is_still_a_leak() -> None:
    d, ev = diagnose_snapshot(normalise(_accumulation(optimizer_steps=3, micro=4, keep_each_micro_step=True)))
    kept = [s for s in ev.survivors if s.stats.site.line == 99]
    assert kept and kept[0].cycles >= 3
    assert "tensor_leak" in [d.verdict, *d.candidates]
    assert d.leak_site is None or d.leak_site["line"] == 99


SAVED = [{"filename": "/w/model.py", "line": 77, "name": "forward"}]
SCORES = [{"filename": "/w/model.py", "line": 81, "name": "forward"}]


def _forward(t: Trace, layers: int) -> list[int]:
    """One forward pass: each layer saves two tensors from the same line and makes (and frees) a large
    temporary, like the attention scores; the layer's input is freed once the next one is made."""
    saved: list[int] = []
    x = t.alloc(64 * MiB, [])
    for _ in range(layers):
        saved += [t.alloc(128 * MiB, SAVED), t.alloc(128 * MiB, SAVED)]
        scores = t.alloc(1024 * MiB, SCORES)
        nxt = t.alloc(64 * MiB, [])
        t.free(scores)
        t.free(x)
        x = nxt
    t.free(x)
    return saved


def _steps_then_failing_forward(steps: int, kept: bool) -> dict[str, Any]:
    t = Trace(0)
    for _ in range(4):
        t.alloc(512 * MiB, WEIGHTS)
    for _ in range(steps):
        saved = _forward(t, LAYERS)
        if kept:
            t.alloc(384 * MiB, KEEP)  # e.g. `outputs.append(logits)`
        for a in reversed(saved):  # the backward frees what the forward saved
            t.free(a)
    _forward(t, LAYERS // 2)  # the failing step: half its layers done
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def test_the_layers_of_the_failing_forward_are_not_steps() -> None:
    """Layer after layer the same line saves a tensor, and between two layers the attention scores rise
    and fall: a swing of live memory, but a small one next to the backward's fall at the end of a step."""
    d, ev = diagnose_snapshot(normalise(_steps_then_failing_forward(steps=4, kept=False)))
    saved = next(s for s in ev.survivors if s.stats.site.line == 77)
    assert saved.stats.count == LAYERS  # two per layer, six layers done
    assert saved.cycles == 0
    assert d.verdict != "tensor_leak" and "tensor_leak" not in d.candidates


def test_a_tensor_kept_at_each_step_still_spans_the_steps() -> None:
    _, ev = diagnose_snapshot(normalise(_steps_then_failing_forward(steps=4, kept=True)))
    kept = next(s for s in ev.survivors if s.stats.site.line == 99)
    assert kept.cycles == 3
    assert next(s for s in ev.survivors if s.stats.site.line == 77).cycles == 0


@pytest.mark.parametrize(("step", "leak"), [(1, False), (5, True)])
def test_a_job_in_its_first_steps_has_no_leak_across_steps(step: int, leak: bool) -> None:
    """The collector says which step failed: survivors of 'four steps' at step 1 are passes within the
    first steps (the micro-steps of gradient accumulation, the layers of a forward), not a leak."""
    bundle = {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-000000000001",
        "occurred_at": "2026-11-29T12:00:00Z",
        "kind": "cuda_oom",
        "workload": {"step": step},
        "snapshot": _steps_then_failing_forward(steps=4, kept=True),
    }
    d, _ = diagnose_bundle(bundle)
    assert (d.verdict == "tensor_leak") is leak
    assert ("tensor_leak" in d.candidates) is True
