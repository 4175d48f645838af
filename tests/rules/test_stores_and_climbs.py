"""What a snapshot alone (``triage replay``, no collector samples) says about a site whose blocks pile up.

- A store that turns over is not a pile that keeps adding: an inference server's per-request caches, made at
  one line, while older ones (made before the trace began) are freed now and again as requests finish. The
  frees of older blocks carry no stack of their making, so they are read by size (within the range the site
  makes) and by when (in different gaps between the site's own blocks).
- A leak's count climbs through the trace; the last step under way allocates at the site and frees again,
  or runs its layers, before the OOM. Neither is "filled and stopped" nor "a cache that evicts": that needs
  as long a quiet spell as the site's own pace, and a count held for most of the trace.
- Calls of the model kept with their graphs in a loop named for evaluation (``evaluate``) are a leak even
  when the trace does not reach back into the steps before them: such a loop runs no backward. Under a
  training step's name the same calls may be one step's micro-batches, summed for one backward.

Traces are built as torch records them (``device_traces`` entries, frames innermost first); frees of
blocks older than the trace carry no frames, as a trace that records only allocation stacks writes them.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import tensor_leak
from rules.base import LEAD, LIKELY
from tests.rules.rawsnap import MiB, Trace, one_block_segment
from triage.evidence import accumulating_site, store_turnover
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

LAYERS = 16
ADMIT = [
    {
        "filename": "/usr/lib/python3.11/site-packages/transformers/cache_utils.py",
        "line": 1087,
        "name": "__init__",
    },
    {"filename": "/srv/llm/engine.py", "line": 152, "name": "admit"},
    {"filename": "/srv/llm/engine.py", "line": 207, "name": "step"},
]
DECODE = [
    {"filename": "/srv/llm/model.py", "line": 88, "name": "forward"},
    {"filename": "/srv/llm/engine.py", "line": 230, "name": "decode"},
]


def serving(*, finish: bool) -> dict[str, Any]:
    """Six requests admitted before the trace began (their caches older than it), then eight admitted in
    it, each a cache block per layer, sized by its prompt; decode steps between them. With ``finish``, the
    older requests finish two at a time between admissions (twice) and their caches are freed."""
    t = Trace(0)
    older: list[tuple[int, int]] = []  # (address, size) of the caches made before the trace
    addr = 1 << 44
    for r in range(6):
        for _ in range(LAYERS):
            addr += 1 << 30
            older.append((addr, (12 + 2 * r) * MiB))
    live_older = dict(older)
    for r in range(8):
        for _ in range(LAYERS):
            t.alloc((10 + 3 * r) * MiB, ADMIT)
        for _ in range(4):
            tmp = t.alloc(64 * MiB, DECODE)
            t.free(tmp)
        if finish and r in (2, 5):
            for a, size in older[: 2 * LAYERS]:
                if a in live_older:
                    for action in ("free_requested", "free_completed"):
                        t.entries.append({"action": action, "addr": a, "size": size, "stream": 0})
                    del live_older[a]
            older = older[2 * LAYERS :]
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 640 * MiB, "stream": 0, "device_free": 0, "frames": DECODE}
    )
    segments = t.segments() + [one_block_segment(0, a, s, ADMIT) for a, s in live_older.items()]
    return {"segments": segments, "device_traces": [t.entries]}


def admit_survivor(ev: Any) -> Any:
    return next(s for s in ev.survivors if s.stats.site.line == 152)


def test_a_store_whose_older_entries_are_freed_as_new_ones_come_turns_over() -> None:
    d, ev = diagnose_snapshot(normalise(serving(finish=True)))
    sv = admit_survivor(ev)
    assert sv.accumulating  # by its own allocations alone: older blocks live, none of its own freed
    got = store_turnover(ev, sv)
    assert got is not None and got[0] == 4 * LAYERS  # two pairs of requests finished in the trace
    assert accumulating_site(ev) is None
    assert d.verdict != "tensor_leak", d.headline


def test_the_same_store_that_never_lets_an_entry_go_keeps_adding() -> None:
    _, ev = diagnose_snapshot(normalise(serving(finish=False)))
    sv = admit_survivor(ev)
    assert store_turnover(ev, sv) is None
    assert accumulating_site(ev) is sv
    f = tensor_leak.evaluate(ev)
    assert f is not None and f.score >= LEAD and f.leak_site is not None and f.leak_site["line"] == 152


KEEP = [{"filename": "/w/train.py", "line": 57, "name": "validation_step"}]
LAYER = [{"filename": "/w/model.py", "line": 30, "name": "forward"}]
TMP = [{"filename": "/w/train.py", "line": 57, "name": "validation_step"}]


def climbing(*, steps: int, temporaries: int, tail_layers: int) -> dict[str, Any]:
    """Each step: its layers' activations, then at the keeping line ``temporaries`` tensors made and freed
    and one kept (a metric's state appended to a list); the activations freed. Then the next step's first
    ``tail_layers`` layers, each a temporary that comes and goes, and the OOM."""
    t = Trace(0)
    for _ in range(steps):
        acts = [t.alloc(256 * MiB, LAYER) for _ in range(4)]
        for _ in range(temporaries):
            t.free(t.alloc(608 * MiB, TMP))
        t.alloc(608 * MiB, KEEP)
        for a in reversed(acts):
            t.free(a)
    for _ in range(tail_layers):
        a = t.alloc(256 * MiB, LAYER)
        b = t.alloc(64 * MiB, LAYER)
        t.free(b)
        if tail_layers % 2:
            t.free(a)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 512 * MiB, "stream": 0, "device_free": 0, "frames": LAYER}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


@pytest.mark.parametrize("tail_layers", [9, 12])
def test_a_leak_whose_last_step_runs_its_layers_before_the_oom_has_not_stopped(tail_layers: int) -> None:
    """The layers of the step under way swing live memory up and down: in a short window those read as
    cycles, but the window is shorter than three of the site's own gaps, so they are not quiet steps."""
    d, ev = diagnose_snapshot(normalise(climbing(steps=20, temporaries=0, tail_layers=tail_layers)))
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert not any("more steps without a new one" in s for s in f.facts)
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == 57


def test_a_count_that_climbed_through_the_trace_is_not_a_cache_that_evicts() -> None:
    """Each step makes and frees three tensors at the keeping line before it keeps one: by the end the
    site has made far more than it holds, and freed them, but its count climbed to the end."""
    d, ev = diagnose_snapshot(normalise(climbing(steps=12, temporaries=3, tail_layers=0)))
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert not any("a cache that evicts" in s for s in f.facts)
    assert d.verdict == "tensor_leak", d.headline


def kept_in(name: str) -> dict[str, Any]:
    """Calls of the model kept with their graphs, and a trace that begins with the first of them: nothing
    shows whether the line held as many at every step."""
    from tests.rules.test_kept_calls import eval_after_training, line

    raw = eval_after_training(steps=0, evals=6, call=line(95, name))
    return raw


@pytest.mark.parametrize(("name", "verdict"), [("evaluate", "tensor_leak"), ("train_step", "inconclusive")])
def test_calls_kept_in_a_loop_named_for_evaluation_run_no_backward(name: str, verdict: str) -> None:
    d, ev = diagnose_snapshot(normalise(kept_in(name)))
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert f.score == (LIKELY if name == "evaluate" else LEAD)
    assert not any("peaked at 0 B" in s for s in f.facts)
    assert d.verdict == verdict, d.headline
    if verdict == "tensor_leak":
        assert d.leak_site is not None and d.leak_site["line"] == 95
