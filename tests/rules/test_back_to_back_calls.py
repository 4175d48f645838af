"""A loop that calls the model back to back: nothing is allocated between two calls (the inputs already on the
device, ``outs.append(model(x))`` keeping each output as it is), so the trace reads one long run of allocations
under the calling line, which looks like one call.

Inside that run, a new forward pass shows itself by the run's first stack coming back (the embedding, the
input's cast: a later layer of the same pass does not repeat it), and, without gradients, by everything
allocated since the earlier output coming and going. Outputs kept across such passes are a leak made by the
model, named at the line that allocated them, with the calling line in the facts and the actions.

Not a leak: the same loop keeping nothing; one forward pass whose layers keep a block each at one line (a
prefill's key/value cache: the run's first stack does not come back); a training forward whose layers save
activations at one line (nothing comes and goes: the saved activations stay until the backward).

The traces are built as torch records them (module-call frames inside the forward, the user line that called
the model outside them); the bundle is the collector's, with its per-step samples.
"""

from __future__ import annotations

from typing import Any

from tests.rules.rawsnap import MiB, Trace
from tests.rules.test_eval_loops import (  # EVAL_CALL: `outs.append(model(x))`, x on the device
    EVAL_CALL,
    after_training,
)
from tests.rules.test_kept_calls import under
from triage.pipeline import diagnose_bundle

EMBED, LAYER, HEAD = 20, 30, 44  # model.py lines: the embedding, a layer's activation, the output head


def no_grad_pass(t: Trace, out: int, *, layers: int = 8, embed: bool = True) -> int:
    """One forward without gradients: the embedding, per layer an activation that frees the one before it,
    then the output head. Returns the output's address."""
    prev = t.alloc(32 * MiB, under(EVAL_CALL, EMBED if embed else LAYER))
    for _ in range(layers - (0 if embed else 1)):
        act = t.alloc(96 * MiB, under(EVAL_CALL, LAYER))
        t.free(prev)
        prev = act
    o = t.alloc(out, under(EVAL_CALL, HEAD))
    t.free(prev)
    return o


def incident(tail: list[Any], *, steps: int = 6) -> dict[str, Any]:
    """Training steps sampled by the collector, then each of ``tail`` runs, then the OOM under EVAL_CALL."""

    def run_all(t: Trace) -> None:
        for run in tail:
            run(t)

    return after_training(run_all, steps=steps)


def eval_loop(passes: int, *, keep: bool) -> Any:
    def run(t: Trace) -> None:
        for _ in range(passes):
            o = no_grad_pass(t, 64 * MiB)
            if not keep:
                t.free(o)
        t.alloc(32 * MiB, under(EVAL_CALL, EMBED))  # the next pass began

    return run


def head_survivor(ev: Any) -> Any:
    return next((s for s in ev.survivors if s.stats.site.line == HEAD), None)


def test_outputs_kept_across_back_to_back_passes_are_a_leak_named_at_the_allocating_line() -> None:
    d, ev = diagnose_bundle(incident([eval_loop(10, keep=True)]))
    sv = head_survivor(ev)
    assert sv is not None and sv.stats.count == 10
    assert sv.cycles == 9  # a whole pass came and went between every two outputs
    assert sv.call is not None and sv.call.line == EVAL_CALL["line"]
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == ("/w/model.py", HEAD)
    assert "10 blocks" in d.headline  # the kept blocks lead, not the flat steps before them
    assert any("in its calls at train.py:120 in evaluate" in e.fact for e in d.evidence)
    assert any(a.startswith("At train.py:120 in evaluate") for a in d.actions)


def test_the_same_loop_keeping_nothing_has_no_survivors() -> None:
    d, ev = diagnose_bundle(incident([eval_loop(10, keep=False)]))
    assert head_survivor(ev) is None
    assert d.verdict != "tensor_leak", d.headline


def test_one_pass_whose_layers_keep_a_block_each_is_not_several_passes() -> None:
    """A prefill that keeps each layer's key/value block at one line: the run's first stack (the embedding)
    does not come back between the layers, so they stay one call's blocks."""

    def prefill(t: Trace) -> None:
        prev = t.alloc(32 * MiB, under(EVAL_CALL, EMBED))
        for _ in range(10):
            t.alloc(24 * MiB, under(EVAL_CALL, HEAD))  # this layer's cache, kept
            act = t.alloc(96 * MiB, under(EVAL_CALL, LAYER))
            t.free(prev)
            prev = act

    d, ev = diagnose_bundle(incident([prefill]))
    sv = head_survivor(ev)
    assert sv is not None and sv.stats.count == 10
    assert sv.cycles == 0
    assert d.verdict != "tensor_leak", d.headline


def test_a_forward_with_gradients_whose_layers_save_at_one_line_is_not_several_passes() -> None:
    """A model without an embedding: its first allocation is a layer's, so the run's first stack comes back at
    every layer; with gradients on, each layer's saved activation stays (nothing came and went), so the
    layers are not passes without gradients."""

    def train_forward(t: Trace) -> None:
        for _ in range(10):
            t.alloc(64 * MiB, under(EVAL_CALL, LAYER))  # a saved activation, first in each layer
            t.alloc(32 * MiB, under(EVAL_CALL, HEAD))  # a second saved tensor, at one line in each layer

    d, ev = diagnose_bundle(incident([train_forward]))
    sv = head_survivor(ev)
    assert sv is not None and sv.stats.count == 10
    assert sv.cycles == 0
    assert d.verdict != "tensor_leak", d.headline
