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

import pytest

from tests.rules.rawsnap import MiB, Trace, bundle
from triage.evidence import kept_graphs
from triage.pipeline import diagnose_bundle, diagnose_snapshot
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
    """The trace begins in the calls (a short ring buffer), made in a training step: nothing shows that
    this line did not hold its calls at every step (micro-batches summed for one backward). Made in a loop
    named for evaluation, they are read as a leak (tests/rules/test_stores_and_climbs.py)."""
    d, ev = diagnose_snapshot(normalise(eval_after_training(steps=0, evals=6, call=line(95, "train_step"))))
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


def test_summed_micro_batches_a_step_more_than_before_are_no_leak() -> None:
    """Steps that sum two or three micro-batches' losses for one backward, then one with five: the line
    held up to two calls at once before and holds four now (fewer than twice as many): a bigger step."""
    t = Trace(0)
    weights(t)
    for chunks in (2, 3, 3, 2, 3):
        saved: list[int] = []
        for _ in range(chunks):
            saved += forward(t, VIEW_CALL, 128 * MiB)
        backward(t, saved)
    for _ in range(4):
        forward(t, VIEW_CALL, 128 * MiB)
    t.alloc(16 * MiB, data(VIEW_CALL))
    d, ev = diagnose_snapshot(normalise(oom(t, VIEW_CALL)))
    kc = ev.kept_calls
    assert kc is not None and (kc.before, kc.calls) == (2, 4)
    assert kept_graphs(ev) is None and kept_graphs(ev, unproven=True) is None
    assert d.verdict != "tensor_leak"


def test_a_step_holding_more_calls_than_any_before_is_not_proved_fragmented() -> None:
    """A rollout that runs the policy step after step and keeps every call for one update: when it holds
    more calls than any rollout before and wants more than every earlier peak, holes at the OOM do not
    convict the layout; the longer rollout may not fit at all."""
    from rules import fragmentation
    from triage.evidence import Evidence, KeptCalls, _step_samples
    from triage.snapshot.frames import Site
    from triage.snapshot.model import Segment, Snapshot
    from triage.units import GiB

    def evidence(calls: int) -> Evidence:
        samples = [
            {"step": i, "allocated_bytes": GiB, "peak_allocated_bytes": p * GiB, "batch_size": 64}
            for i, p in enumerate((9, 10, 12, 13, 14, 15, 16))
        ]
        kc = KeptCalls(
            Site("/w/rl.py", 153, "collect_rollout"), calls, 3000, 19 * GiB, calls, 40, 41, 16 * GiB
        )
        return Evidence(
            kind="cuda_oom",
            snapshot=Snapshot([Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])], [], {}, [], era="v2"),
            total_bytes=24 * GiB,
            reserved_bytes=21 * GiB,
            allocated_bytes=18 * GiB,
            device_free_bytes=8 * MiB,
            request_bytes=18 * MiB,
            largest_free_block_bytes=8 * MiB,
            free_in_pool_bytes=3 * GiB,
            batch_size=64,
            step=7,
            steps=_step_samples(samples),
            kept_calls=kc,
        )

    more = fragmentation.evaluate(evidence(46))
    same = fragmentation.evaluate(evidence(40))
    assert more is not None and same is not None
    assert any("more than any step before" in s for s in more.facts)
    assert more.score < same.score and more.score <= 0.55


ROLL_CALL = line(124, "collect_rollout")  # `logits = policy(obs)`, the output stored in a replay buffer
OBS = [line(123, "collect_rollout"), *MAIN]  # `obs = torch.as_tensor(obs, device=device)`, stored too


def replay_buffer(updates: int) -> tuple[dict[str, Any], list[int]]:
    """Each update collects two policy outputs (64 MiB, made by the policy's head) with their graphs (8 saved
    32 MiB activations each) and their observations into a buffer that is never emptied, then trains on a
    batch (a 4 GiB forward and backward, all freed). Returns the raw snapshot and the trace index where each
    update began."""
    t = Trace(0)
    weights(t)
    starts = []
    for _ in range(updates):
        starts.append(len(t.entries))
        for _ in range(2):
            t.alloc(16 * MiB, OBS)
            forward(t, ROLL_CALL, 32 * MiB)
            t.alloc(64 * MiB, under(ROLL_CALL, 40))  # the output, kept with its graph
        backward(t, forward(t, TRAIN_CALL, 512 * MiB))
    forward(t, TRAIN_CALL, 512 * MiB)[:0]
    return oom(t, TRAIN_CALL), starts


def test_a_buffer_of_outputs_with_their_graphs_is_named_at_the_call_not_at_the_observation() -> None:
    """Both the observations and the outputs' graphs outlive the updates; the graphs are most of it (16
    calls' activations against 16 observations), so the line to fix is the call whose outputs are kept."""
    raw, _ = replay_buffer(updates=8)
    d, ev = diagnose_snapshot(normalise(raw))
    obs = next(s for s in ev.survivors if s.stats.site.line == OBS[0]["line"])
    assert obs.cycles >= 3
    assert ev.kept_calls is not None and ev.kept_calls.call.line == ROLL_CALL["line"]
    assert d.verdict == "tensor_leak" and d.leak_site == ROLL_CALL
    assert any("kept with their autograd graphs" in e.fact for e in d.evidence)


def test_the_steps_prove_the_leak_and_the_kept_calls_name_it() -> None:
    """The collector's samples show live memory rising at every update; the trace reaches back only into
    the last update. No one line's blocks add up to the growth, but the blocks made inside the policy's
    calls do (their stacks are in the snapshot, older than the trace or not)."""
    updates = 8
    raw, starts = replay_buffer(updates)
    raw["device_traces"][0] = raw["device_traces"][0][starts[-1] :]
    per_update = 2 * (16 + 8 * 32 + 64) * MiB
    base = 2048 * MiB
    timeline = [
        {
            "step": k + 1,
            "allocated_bytes": base + (k + 1) * per_update,
            "peak_allocated_bytes": base + 4096 * MiB,
        }
        for k in range(updates)
    ]
    from triage.pipeline import diagnose_bundle

    d, ev = diagnose_bundle(bundle(raw, step=updates, timeline=timeline))
    assert ev.trend is not None and not any(s.cycles >= 3 for s in ev.survivors)
    assert d.verdict == "tensor_leak" and d.leak_site == ROLL_CALL, d.headline


@pytest.mark.parametrize(("in_call", "new"), [(True, True), (False, False)])
def test_one_call_more_than_before_is_new_only_when_the_next_call_had_begun(in_call: bool, new: bool) -> None:
    """Steps summed up to three micro-batches (two held as the third began). Three held as a fourth
    begins is a step bigger than any before; three held in the loss after the third is every step."""
    from rules import fragmentation
    from triage.evidence import Evidence, KeptCalls, _step_samples
    from triage.snapshot.frames import Site
    from triage.snapshot.model import Segment, Snapshot
    from triage.units import GiB

    samples = [{"step": i, "allocated_bytes": GiB, "peak_allocated_bytes": 19 * GiB} for i in range(6)]
    kc = KeptCalls(Site("/w/train.py", 115, "training_step"), 3, 600, 13 * GiB, 21, 2, 18, 19 * GiB, in_call)
    ev = Evidence(
        kind="cuda_oom",
        snapshot=Snapshot([Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])], [], {}, [], era="v2"),
        total_bytes=24 * GiB,
        reserved_bytes=int(21.5 * GiB),
        allocated_bytes=20 * GiB,
        device_free_bytes=36 * MiB,
        request_bytes=80 * MiB,
        largest_free_block_bytes=4 * MiB,
        free_in_pool_bytes=int(1.5 * GiB),
        step=6,
        steps=_step_samples(samples),
        kept_calls=kc,
    )
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert any("more than any step before" in s for s in f.facts) is new


OPTIM = [
    {"filename": "/usr/lib/python3.11/site-packages/torch/optim/adam.py", "line": 166, "name": "_init_group"},
    {"filename": "/usr/lib/python3.11/site-packages/torch/optim/adam.py", "line": 236, "name": "step"},
    {
        "filename": "/usr/lib/python3.11/site-packages/torch/optim/optimizer.py",
        "line": 485,
        "name": "wrapper",
    },
    line(64, "train_step"),
    *MAIN,
]


def carried_state(
    *, steps: int, optimizer: bool, static_gib: int = 0, backward: bool = True
) -> dict[str, Any]:
    """A trace from the model's load. Each step's forward is kept: a recurrent model's hidden state is
    carried into the next step without ``.detach()`` (and ``backward(retain_graph=True)`` keeps the graph
    the backward would free). The backward's gradient flows on the engine's thread and is freed; with
    ``optimizer`` each step then updates the weights (Adam makes its state at the first step, under
    torch/optim's frames). Without the backward (``backward=False``) and the optimizer nothing shows a step
    ended between the calls: a rollout of several forward passes before one backward looks the same."""
    t = Trace(0)
    weights(t)
    for _ in range(static_gib):  # a frozen encoder, an embedding table: memory that is no one's leak
        t.alloc(1024 * MiB, WEIGHTS)
    for k in range(steps):
        forward(t, TRAIN_CALL, 128 * MiB)
        if backward:
            t.free(t.alloc(64 * MiB, []))  # the gradient flowing back through the last step only
        if optimizer and k == 0:
            for _ in range(2):
                t.alloc(512 * MiB, OPTIM)
    t.alloc(16 * MiB, data(TRAIN_CALL))
    return oom(t, TRAIN_CALL)


@pytest.mark.parametrize("static_gib", [0, 8])
def test_forward_passes_that_outlive_an_optimizer_step_are_a_leak(static_gib: int) -> None:
    """No step free of kept calls is in the trace (every forward since the load is held), but the first
    ones were made before an optimizer step: their step was over, and their graphs were still held. With
    8 GiB of static memory beside them they are about a third of the job's memory, not most of it: past
    an optimizer step that is enough. (The backward's allocations are left out: the optimizer's step
    alone shows the first step ended.)"""
    d, ev = diagnose_snapshot(
        normalise(carried_state(steps=6, optimizer=True, static_gib=static_gib, backward=False))
    )
    kc = ev.kept_calls
    assert kc is not None and (kc.calls, kc.freed_before, kc.before) == (6, 0, None)
    assert kc.past_step == 1  # the first call came before the optimizer's first step
    got = kept_graphs(ev)
    assert got is not None and got[1] is None  # no earlier peak: convicted by what the kept calls hold
    assert d.verdict == "tensor_leak" and d.leak_site == TRAIN_CALL, d.headline
    assert any("outlived an optimizer step" in e.fact for e in d.evidence)
    assert any("hidden.detach()" in a for a in d.actions)


def test_forward_passes_kept_with_no_step_between_them_are_not_convicted() -> None:
    """The same calls held with neither a backward nor an optimizer step between them: a rollout of
    several forward passes before one backward."""
    d, ev = diagnose_snapshot(normalise(carried_state(steps=6, optimizer=False, backward=False)))
    kc = ev.kept_calls
    assert kc is not None and kc.calls == 6 and kc.past_step == 0
    assert kept_graphs(ev) is None
    assert d.verdict != "tensor_leak"


def test_forward_passes_that_outlive_a_backward_before_the_next_call_are_a_leak() -> None:
    """No optimizer step allocates (a manual SGD update in place), but a backward ran on the engine's
    thread after each call and before the next one: each call's step was over, and its graph outlived
    that backward (``backward(retain_graph=True)`` with a hidden state carried without ``.detach()``)."""
    d, ev = diagnose_snapshot(normalise(carried_state(steps=6, optimizer=False)))
    kc = ev.kept_calls
    assert (
        kc is not None and kc.calls == 6 and kc.past_step == 5
    )  # no call of the line began after the last one's backward
    assert d.verdict == "tensor_leak" and d.leak_site == TRAIN_CALL, d.headline


@pytest.mark.parametrize(("evals", "leak"), [(6, True), (3, False)])
def test_kept_calls_that_are_most_of_the_memory_convict_when_the_call_under_way_is_larger(
    evals: int, leak: bool
) -> None:
    """Validation after five training steps (1 GiB of activations each), its outputs kept with their
    graphs; the failing validation call is twice a training step's size (a larger batch) and had made
    2 GiB when it failed, so this moment less the kept calls is more than any training step. Six kept
    calls (6 GiB of 10.3) are most of it, and without them it fitted; three (3 of 7.3) are not."""
    t = Trace(0)
    weights(t)
    for _ in range(5):
        backward(t, forward(t, TRAIN_CALL, 128 * MiB))
    for _ in range(evals):
        forward(t, EVAL_CALL, 128 * MiB)
    t.alloc(16 * MiB, data(EVAL_CALL))
    for _ in range(4):
        t.alloc(512 * MiB, under(EVAL_CALL, 30))
    d, ev = diagnose_snapshot(normalise(oom(t, EVAL_CALL)))
    kc = ev.kept_calls
    assert kc is not None and kc.calls == evals and kc.freed_before == 5
    needed, peak = ev.needed_bytes, kc.peak_before
    assert needed is not None and needed - peak > kc.bytes  # not within the earlier steps' peak
    assert (kept_graphs(ev) is not None) == leak
    assert (d.verdict == "tensor_leak") == leak, d.headline


def test_a_forward_on_the_stack_without_module_call_frames_is_a_model_call() -> None:
    """``model.forward(x)`` called directly (or a stack recorded without torch's module-call frames): the
    user line outside a user ``forward`` is the model call; a stack with no forward on it is none."""
    from triage.evidence import model_call
    from triage.snapshot.frames import FrameClassifier

    fc = FrameClassifier()
    direct = [{"filename": "/w/model.py", "line": 139, "name": "forward"}, TRAIN_CALL, *MAIN]
    assert model_call(fc, direct) == ("/w/train.py", 61, "train_step")
    nested = [
        *under(TRAIN_CALL, 30)[:1],
        *MODULE,
        {"filename": "/w/model.py", "line": 141, "name": "forward"},
    ]
    assert model_call(fc, [*nested, TRAIN_CALL, *MAIN]) == ("/w/train.py", 61, "train_step")
    assert model_call(fc, [line(73, "train_step"), *MAIN]) is None  # the loss, outside any forward


@pytest.mark.parametrize("first_layer", [False, True])
def test_blocks_kept_inside_every_forward_are_read_across_steps(first_layer: bool) -> None:
    """A forward hook keeps two layers' attention maps every step (a list never cleared), or a memory
    keeps every layer's output from the first layer on: blocks made inside the forward, several a call.
    Each call is read at its first survivor, so consecutive calls are compared at the same point of their
    forward passes, and the steps between them show."""
    hook = [{"filename": "/w/model.py", "line": 74, "name": "forward"}, *MODULE, TRAIN_CALL, *MAIN]
    t = Trace(0)
    weights(t)
    for _ in range(8):
        t.alloc(16 * MiB, data(TRAIN_CALL))
        saved = []
        for layer in range(LAYERS):
            saved.append(t.alloc(128 * MiB, under(TRAIN_CALL, 30)))
            if first_layer or layer >= LAYERS - 2:
                t.alloc(16 * MiB, hook)  # kept: never freed
            t.free(t.alloc(256 * MiB, under(TRAIN_CALL, 34)))
        backward(t, saved)
    forward(t, TRAIN_CALL, 128 * MiB)
    d, ev = diagnose_snapshot(normalise(oom(t, TRAIN_CALL)))
    site = next(s for s in ev.survivors if s.stats.site.line == 74)
    assert site.cycles >= 6
    assert d.verdict == "tensor_leak" and d.leak_site == hook[0], d.headline


def test_calls_kept_before_a_short_trace_began_name_the_line_when_the_steps_prove_the_leak() -> None:
    """The steps prove a leak (live memory rose 6 GiB by a riser at every evaluation); the trace (a short
    ring) shows only the current training step, so no two of the validation line's calls are in it. The
    live blocks whose stacks say they were made inside that line's calls, all older than the trace, are as
    much as live memory grew: that line is named."""
    t = Trace(0)
    weights(t)
    for j in range(6 * LAYERS):  # six validation calls' saved activations, made before the trace began
        t.addr += 1 << 30
        t.live[t.addr] = (128 * MiB, under(EVAL_CALL, 40 + j % 4))  # by the model's lines, none most of it
    t.entries.clear()  # the ring kept only what follows
    forward(t, TRAIN_CALL, 128 * MiB)
    raw = oom(t, TRAIN_CALL)
    timeline = [
        {
            "step": s,
            "allocated_bytes": 2048 * MiB + (s // 10) * LAYERS * 128 * MiB,
            "peak_allocated_bytes": 6 * 1024 * MiB,
        }
        for s in range(60)
    ]
    d, ev = diagnose_bundle(bundle(raw, step=60, timeline=timeline))
    assert ev.kept_calls is None or ev.kept_calls.call.line != EVAL_CALL["line"]  # the trace cannot show them
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site == EVAL_CALL
    assert any("before the trace began" in e.fact for e in d.evidence)


OPT_STEP = [
    {"filename": "/usr/lib/python3.11/site-packages/torch/optim/adamw.py", "line": 200, "name": "step"},
    line(66, "train_step"),
]


def kept_inside_the_model(beside_mib: int) -> dict[str, Any]:
    """Twelve training steps whose forward keeps one 32 MiB tensor per layer at model.py:30 (the model
    appending to a list on itself) and, when ``beside_mib``, a smaller block per layer at model.py:31 too
    (what a kept graph holds beside it); the saved activations at model.py:34 go with each backward."""
    t = Trace(0)
    weights(t)
    for _ in range(12):
        batch = t.alloc(16 * MiB, data(TRAIN_CALL))
        saved = []
        for _ in range(LAYERS):
            t.alloc(32 * MiB, under(TRAIN_CALL, 30))
            if beside_mib:
                t.alloc(beside_mib * MiB, under(TRAIN_CALL, 31))
            saved.append(t.alloc(128 * MiB, under(TRAIN_CALL, 34)))
        backward(t, saved)
        t.free(batch)
        t.free(t.alloc(8 * MiB, OPT_STEP))
    t.alloc(16 * MiB, data(TRAIN_CALL))
    return oom(t, TRAIN_CALL)


def test_calls_that_hold_only_one_inner_lines_blocks_name_that_line() -> None:
    d, ev = diagnose_snapshot(normalise(kept_inside_the_model(0)))
    kc = ev.kept_calls
    assert kc is not None and kc.call.line == TRAIN_CALL["line"] and kc.bytes == 12 * LAYERS * 32 * MiB
    assert d.verdict == "tensor_leak"
    assert d.leak_site == {"filename": "/w/model.py", "line": 30, "name": "forward"}
    # the calls hold more than that line's blocks (a graph's other saved tensors): the call line keeps them
    d, _ = diagnose_snapshot(normalise(kept_inside_the_model(16)))
    assert d.verdict == "tensor_leak"
    assert d.leak_site == TRAIN_CALL


def _small_keep_then_a_longer_pass(*, kept_each: int, failing_layers: int) -> dict[str, Any]:
    """Eight training steps, each keeping one ``kept_each`` block made at the layers' line (a per-step
    tensor the model keeps), then a much longer batch whose forward fails at its ``failing_layers``-th
    512 MiB layer: those layers' saved activations are alive because the pass had not finished."""
    t = Trace(0)
    weights(t)
    for _ in range(8):
        saved = forward(t, TRAIN_CALL, 64 * MiB)
        t.alloc(kept_each, under(TRAIN_CALL, 30))
        backward(t, saved)
    for _ in range(failing_layers):
        t.alloc(512 * MiB, under(TRAIN_CALL, 30))
    return oom(t, TRAIN_CALL)


def test_the_failing_pass_is_not_part_of_what_a_site_kept() -> None:
    """The layers' line kept 8 × 16 MiB over eight steps; the failing pass holds 12 × 512 MiB there. What the
    site kept across steps is the 128 MiB (it was read as 6.1 GiB kept over nine steps): too small to have
    decided an OOM of a pass this size."""
    d, ev = diagnose_snapshot(
        normalise(_small_keep_then_a_longer_pass(kept_each=16 * MiB, failing_layers=12))
    )
    site = next(s for s in ev.survivors if s.site.line == 30)
    assert site.stats.bytes == 8 * 16 * MiB and site.stats.count == 8
    assert site.cycles == 7
    assert d.verdict != "tensor_leak", d.headline


def test_a_site_that_kept_much_is_still_a_leak_beside_the_failing_pass() -> None:
    d, ev = diagnose_snapshot(
        normalise(_small_keep_then_a_longer_pass(kept_each=768 * MiB, failing_layers=2))
    )
    site = next(s for s in ev.survivors if s.site.line == 30)
    assert site.stats.bytes == 8 * 768 * MiB
    assert d.verdict == "tensor_leak" and d.leak_site is not None and d.leak_site["line"] == 30
