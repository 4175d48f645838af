"""Forward passes kept alive: the saved activations of several earlier calls of one line that runs the
model, still held at the OOM because each call's output (and so its autograd graph) is still referenced —
a validation loop run with gradients on that keeps its outputs. No optimizer step passes between the
calls, so nothing survives "across steps"; what tells it apart is that the same line did not keep its
calls before (or did not run at all in the steps the trace shows), where a step that runs the model on
several views before one backward keeps as many calls at every step.

The traces are built as torch records them: each allocation inside a module's forward carries the
module-call frames (``Module._call_impl``) with the user line that called the model outside them; the
backward's allocations come from the autograd engine's thread, without Python frames.
"""

from __future__ import annotations

from typing import Any

from tests.rules.rawsnap import MiB, Trace
from triage.evidence import kept_graphs
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

TORCH = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"
MODULE = [
    {"filename": TORCH, "line": 1762, "name": "_call_impl"},
    {"filename": TORCH, "line": 1751, "name": "_wrapped_call_impl"},
]
MAIN = [{"filename": "/w/train.py", "line": 210, "name": "main"}]
WEIGHTS = [{"filename": "/w/train.py", "line": 190, "name": "main"}, *MAIN]


def line(no: int, name: str) -> dict[str, Any]:
    return {"filename": "/w/train.py", "line": no, "name": name}


TRAIN_CALL = line(61, "train_step")  # `logits = model(x)` in the training step
EVAL_CALL = line(95, "evaluate")  # `out = model(x)` in the validation loop
VIEW_CALL = line(70, "train_step")  # `for v in views: outs.append(model(v))`


def under(call: dict[str, Any], model_line: int) -> list[dict[str, Any]]:
    """The stack of an allocation at ``model.py:model_line`` inside a forward called from ``call``."""
    return [{"filename": "/w/model.py", "line": model_line, "name": "forward"}, *MODULE, call, *MAIN]


def data(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch copied to the device on the line before ``call`` (outside any module)."""
    return [line(call["line"] - 1, call["name"]), *MAIN]


LAYERS = 8


def forward(t: Trace, call: dict[str, Any], act: int) -> list[int]:
    """One forward pass: the batch copied in (freed when the next one replaces it), then per layer a
    saved activation and a freed temporary twice its size."""
    batch = t.alloc(16 * MiB, data(call))
    saved = []
    for _ in range(LAYERS):
        saved.append(t.alloc(act, under(call, 30)))
        tmp = t.alloc(2 * act, under(call, 34))
        t.free(tmp)
    t.free(batch)
    return saved


def backward(t: Trace, saved: list[int]) -> None:
    flowing = t.alloc(64 * MiB, [])  # the gradient flowing back
    for a in reversed(saved):
        t.free(a)
    t.free(flowing)


def oom(t: Trace, call: dict[str, Any]) -> dict[str, Any]:
    t.entries.append(
        {
            "action": "oom",
            "addr": 0,
            "size": 256 << 20,
            "stream": 0,
            "device_free": 0,
            "frames": under(call, 30),
        }
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


def weights(t: Trace) -> None:
    for _ in range(4):
        t.alloc(512 * MiB, WEIGHTS)


def eval_after_training(
    *, steps: int, evals: int, call: dict[str, Any] = EVAL_CALL, keep: bool = True
) -> dict[str, Any]:
    t = Trace(0)
    weights(t)
    for _ in range(steps):
        backward(t, forward(t, TRAIN_CALL, 128 * MiB))
    for _ in range(evals):
        saved = forward(t, call, 128 * MiB)
        if not keep:
            for a in saved:
                t.free(a)
    t.alloc(16 * MiB, data(call))  # the failing call: its batch, then its first activation fails
    return oom(t, call)


def test_a_validation_loop_keeping_its_graphs_is_a_leak_at_the_line_that_calls_the_model() -> None:
    d, ev = diagnose_snapshot(normalise(eval_after_training(steps=5, evals=6)))
    kc = ev.kept_calls
    assert kc is not None and kc.call.line == EVAL_CALL["line"]
    assert (kc.calls, kc.blocks, kc.bytes) == (6, 6 * LAYERS, 6 * LAYERS * 128 * MiB)
    assert kc.before is None and kc.freed_before == 5  # the training steps' forward passes
    assert kept_graphs(ev) is not None
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site == EVAL_CALL
    assert any("torch.no_grad()" in a for a in d.actions)


def test_the_same_line_for_training_and_validation_kept_nothing_before() -> None:
    """One helper runs the model for both: in training each call's activations were freed by its
    backward before the next call began; now six calls are held at once."""
    d, ev = diagnose_snapshot(normalise(eval_after_training(steps=5, evals=6, call=TRAIN_CALL)))
    kc = ev.kept_calls
    assert kc is not None and kc.before == 0 and kc.calls == 6
    assert d.verdict == "tensor_leak" and d.leak_site == TRAIN_CALL


def test_a_validation_loop_that_drops_its_outputs_keeps_no_calls() -> None:
    _, ev = diagnose_snapshot(normalise(eval_after_training(steps=5, evals=6, keep=False)))
    assert ev.kept_calls is None and kept_graphs(ev) is None


def test_one_kept_call_is_not_enough() -> None:
    """Two forward passes before one backward (a pair of inputs) are common; one earlier call held proves
    nothing."""
    _, ev = diagnose_snapshot(normalise(eval_after_training(steps=5, evals=1)))
    assert ev.kept_calls is not None and ev.kept_calls.calls == 1
    assert kept_graphs(ev) is None


def test_without_the_steps_before_the_kept_calls_are_not_read_as_a_leak() -> None:
    """The trace begins in the validation loop (a short ring buffer): nothing shows that this line did not
    hold its calls at every step."""
    d, ev = diagnose_snapshot(normalise(eval_after_training(steps=0, evals=6)))
    assert ev.kept_calls is not None and ev.kept_calls.freed_before == 0
    assert kept_graphs(ev) is None
    assert d.verdict != "tensor_leak"


def multi_view(*, steps: int, views: int, longer_at_the_end: bool) -> dict[str, Any]:
    """Each step runs the model on ``views`` views of the batch (one line, in a loop) and then one backward
    frees them all; the failing step's inputs are twice as long and it fails in its third view."""
    t = Trace(0)
    weights(t)
    for _ in range(steps):
        saved: list[int] = []
        for _ in range(views):
            saved += forward(t, VIEW_CALL, 128 * MiB)
        backward(t, saved)
    act = 256 * MiB if longer_at_the_end else 128 * MiB
    for _ in range(2):
        forward(t, VIEW_CALL, act)
    t.alloc(16 * MiB, data(VIEW_CALL))
    return oom(t, VIEW_CALL)


def test_views_of_one_step_run_before_one_backward_are_no_leak() -> None:
    """The line held four calls at once at every step: two held now, each twice the size (longer inputs),
    is the step growing, not outputs kept."""
    d, ev = diagnose_snapshot(normalise(multi_view(steps=5, views=4, longer_at_the_end=True)))
    kc = ev.kept_calls
    assert kc is not None and kc.call.line == VIEW_CALL["line"]
    assert kc.before == 3 and kc.calls == 2
    assert kept_graphs(ev) is None
    assert d.verdict != "tensor_leak" and d.leak_site is None
