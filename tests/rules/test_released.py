"""A site that keeps blocks across steps and lets them go again is not a leak: a memory bank of detached
features (or any cache) that ages its entries out after a few steps, however irregularly, holds a bounded
number of them. A leak's freed allocations are its temporaries, freed within their own step. And an
inference loop under ``torch.no_grad()`` that keeps each call's output keeps one block a call: each call
between two of them is a whole forward that gave back what it made, a step of that loop.

Traces are built as torch records them (see test_kept_calls): the model's allocations under the
module-call frames, the backward's without Python frames, the bank's entries made at a user line outside
the model after each forward.
"""

from __future__ import annotations

import random
from typing import Any

from tests.rules.rawsnap import MiB, Trace
from tests.rules.test_kept_calls import MAIN, TRAIN_CALL, backward, forward, line, oom, weights
from triage.evidence import released_after_calls
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

BANK = [line(80, "train_step"), {"filename": "/w/train.py", "line": 210, "name": "main"}]


def run(
    *, steps: int, lifetime: tuple[int, int] | None, scratch: bool = False, seed: int = 0
) -> dict[str, Any]:
    """``steps`` training steps, each pushing one 96 MiB entry into a bank at train.py:80; with a
    ``lifetime`` (in steps, drawn per entry) the bank drops each entry when its time is up, else never."""
    rng = random.Random(seed)
    t = Trace(0)
    weights(t)
    bank: list[tuple[int, int]] = []  # (step it leaves at, address)
    for s in range(steps):
        saved = forward(t, TRAIN_CALL, 128 * MiB)
        if scratch:
            t.free(t.alloc(32 * MiB, BANK))  # a temporary from the same line, freed in its step
        due = s + rng.randint(*lifetime) if lifetime else steps + 1
        bank.append((due, t.alloc(96 * MiB, BANK)))
        backward(t, saved)
        for entry in [e for e in bank if e[0] <= s]:
            bank.remove(entry)
            t.free(entry[1])
    return oom(t, TRAIN_CALL)


def test_a_bank_that_ages_its_entries_out_is_not_a_leak() -> None:
    d, ev = diagnose_snapshot(normalise(run(steps=60, lifetime=(2, 40))))
    bank = next(s for s in ev.survivors if s.site.line == 80)
    assert bank.cycles >= 3  # its live entries were made in different steps ...
    assert not bank.bounded  # ... not oldest first (entries made after its oldest were dropped before it) ...
    assert released_after_calls(ev, bank) >= 30  # ... and most of the ones it made were let go again
    assert d.verdict != "tensor_leak", d.headline
    # (its count of live entries also levels early and turns over: either reading names it)
    assert any("lets go of what it keeps" in e.fact or "a cache that evicts" in e.fact for e in d.evidence)


def test_a_bank_that_never_lets_go_is_a_leak_at_its_line() -> None:
    d, ev = diagnose_snapshot(normalise(run(steps=12, lifetime=None, scratch=True)))
    bank = next(s for s in ev.survivors if s.site.line == 80)
    assert released_after_calls(ev, bank) == 0  # its temporaries were freed within their own step
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == 80


def test_entries_let_go_within_a_call_or_two_do_not_count() -> None:
    """Kept for the next step only (a lagged metric), each entry outlives one later call: that is not a
    bank that ages out, and a leak beside it would still be read."""
    _, ev = diagnose_snapshot(normalise(run(steps=20, lifetime=(1, 1))))
    bank = next((s for s in ev.survivors if s.site.line == 80), None)
    assert bank is None or released_after_calls(ev, bank) == 0


# ---------------------------------------------------------------- an inference loop keeping its outputs
PREDICT_CALL = line(63, "run_inference")  # `logits = model(batch).float()` under torch.no_grad()


def inference(*, calls: int, keep: bool) -> dict[str, Any]:
    """An evaluation loop under ``torch.no_grad()``: each call's layers free their tensors as they go, and
    its 256 MiB output is appended to a list (``keep``) or dropped. No backward anywhere in the trace, and
    a warm-up's fall far larger than one call's swing, so nothing reads the calls as training steps."""
    from tests.rules.test_kept_calls import data, under

    t = Trace(0)
    weights(t)
    # a warm-up pass over one large batch, freed: the trace's largest fall dwarfs one call's swing
    t.free(t.alloc(4096 * MiB, under(PREDICT_CALL, 30)))
    for _ in range(calls):
        batch = t.alloc(16 * MiB, data(PREDICT_CALL))
        prev = None
        for _ in range(
            16
        ):  # each layer's output replaces the one before: a call makes far more than it keeps
            h = t.alloc(128 * MiB, under(PREDICT_CALL, 30))
            if prev is not None:
                t.free(prev)
            prev = h
        out = t.alloc(256 * MiB, under(PREDICT_CALL, 90))
        assert prev is not None
        t.free(prev)
        t.free(batch)
        if not keep:
            t.free(out)
    t.alloc(16 * MiB, data(PREDICT_CALL))
    return oom(t, PREDICT_CALL)


def test_outputs_kept_by_a_loop_without_gradients_are_a_leak_at_its_call() -> None:
    d, ev = diagnose_snapshot(normalise(inference(calls=10, keep=True)))
    kept = next(s for s in ev.survivors if s.site.line == 90)
    assert kept.cycles == 9  # every call, a whole forward that gave back what it made, between two outputs
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site == {
        "filename": "/w/model.py",
        "line": 90,
        "name": "forward",
    }  # the line that made them


def test_outputs_dropped_by_a_loop_without_gradients_are_no_leak() -> None:
    d, ev = diagnose_snapshot(normalise(inference(calls=10, keep=False)))
    assert not any(s.site.line == 90 for s in ev.survivors)
    assert d.verdict != "tensor_leak"


def test_calls_of_one_training_step_are_not_steps() -> None:
    """Four views through the model before one backward: each forward holds its saved activations, so the
    calls between two outputs did not give back what they made."""
    from tests.rules.test_kept_calls import forward

    t = Trace(0)
    weights(t)
    for _ in range(4):
        forward(t, PREDICT_CALL, 128 * MiB)
    t.alloc(16 * MiB, BANK)
    _, ev = diagnose_snapshot(normalise(oom(t, PREDICT_CALL)))
    assert all(s.cycles == 0 for s in ev.survivors if s.site.line == 30)


# ---------------------------------------------------------------- a KV cache re-made by torch.cat each token
GEN_CALL = line(77, "run")  # `out = model.generate(**batch, max_new_tokens=512)`
HF = "/usr/lib/python3.10/site-packages/transformers"


def _in_layer(what: str, lineno: int) -> list[dict[str, Any]]:
    return [
        {"filename": f"{HF}/{what}", "line": lineno, "name": "update" if "cache" in what else "forward"},
        {"filename": f"{HF}/models/llama/modeling_llama.py", "line": 281, "name": "forward"},
        {"filename": f"{HF}/generation/utils.py", "line": 2255, "name": "generate"},
        GEN_CALL,
        *MAIN,
    ]


def generation(*, tokens: int, layers: int = 16, free_old: bool = True) -> dict[str, Any]:
    """Token after token, each layer re-makes its cache one token longer with ``torch.cat`` (the old one
    freed) among the layer's own temporaries, all under the one user line that called ``generate``."""
    t = Trace(0)
    weights(t)
    cache: list[int | None] = [None] * layers
    for tok in range(1, tokens + 1):
        for layer in range(layers):
            tmp = [t.alloc(8 * MiB, _in_layer("activations.py", 60)) for _ in range(3)]
            new = t.alloc(tok * 2 * MiB, _in_layer("cache_utils.py", 449))
            old, cache[layer] = cache[layer], new
            if old is not None and free_old:
                t.free(old)
            for a in tmp:
                t.free(a)
        if tok == tokens - 1:
            # the newest token's mask and positions, made once and still held: the count's last few
            for _ in range(3):
                t.alloc(512, _in_layer("utils.py", 3251))
    t.oom((tokens + 1) * 2 * MiB, _in_layer("cache_utils.py", 449))
    return {"segments": t.segments(), "device_traces": [t.entries]}


def test_a_cache_re_made_longer_each_token_is_not_a_pile() -> None:
    """Its live blocks (one per layer, among the layer's temporaries) stay at the layer count as they are
    re-made, and the few the last tokens still hold come in their turn: turned over, not kept. The same loop
    that never frees the shorter caches is a leak."""
    d, _ = diagnose_snapshot(normalise(generation(tokens=12)))
    assert d.verdict != "tensor_leak" and "tensor_leak" not in d.candidates, d.headline
    d, _ = diagnose_snapshot(normalise(generation(tokens=12, free_old=False)))
    assert d.verdict == "tensor_leak", d.headline
