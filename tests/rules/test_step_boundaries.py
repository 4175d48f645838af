"""Gradients are not a leak: the blocks a backward pass makes survive it by design.

On the autograd engine's thread a backward pass frees the saved activations layer by layer while it makes
the gradients, so live memory falls between two gradients of one pass and does not come back: no step
ended between them. The gradients then live across the micro-steps of gradient accumulation (or for the
whole run, zeroed in place) until ``zero_grad`` frees them. A kept tensor, by contrast, is made once per
step, and between two of them a whole backward and the next forward come and go.

These traces give the gradients the stack of the line that called ``backward()`` — what a job shows when
its backward runs Python (a hook, a custom Function) — so the site is user code and only the step
boundaries decide.
"""

from __future__ import annotations

from typing import Any

from tests.rules.rawsnap import ACT, KEEP, MiB, Trace
from triage.pipeline import diagnose_snapshot
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
