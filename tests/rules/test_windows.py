"""A window that turns over: the loop keeps the last N tensors (``deque(maxlen=N)``, a list trimmed from
the front). Until it is full it grows like a leak; once full, every new block pushes out the oldest. A
trace shorter than the window shows the site's blocks all alive (none of those it made was freed), but
as each came in, a block older than the trace was freed from the same line (the deque's append drops it),
one for one — the allocator's own record that the pile does not grow.

Traces built as torch records them: a free carries the stack where the tensor died.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tests.rules.rawsnap import ACT, KEEP, MiB, Trace, bundle
from triage.evidence import turning_window
from triage.pipeline import diagnose_bundle, diagnose_snapshot
from triage.snapshot.loader import normalise

OTHER = [{"filename": "/w/train.py", "line": 150, "name": "train_step"}]


def run(
    *, steps: int = 16, window: int | None = 10, traced: int = 6, burst: bool = False
) -> tuple[dict[str, Any], int]:
    """``steps`` steps of four activations and one kept block; the trace holds the last ``traced``. With
    ``burst``, blocks from before the trace (another line's) are all freed at once in its first step."""
    t = Trace(0)
    kept: deque[int] = deque()
    old = [t.alloc(64 * MiB, OTHER) for _ in range(traced)] if burst else []
    start = 0
    for k in range(steps):
        if k == steps - traced:
            start = len(t.entries)
            for a in old:
                t.free(a)
        kept.append(t.step(4, (40 + 8 * (k % 3)) * MiB) or 0)
        if window is not None and len(kept) > window:
            t.free(kept.popleft())
    t.alloc(256 * MiB, ACT)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 512 * MiB, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": t.segments(), "device_traces": [t.entries[start:]]}, start


def test_a_full_window_turning_over_is_not_a_leak() -> None:
    raw, _ = run()
    d, ev = diagnose_snapshot(normalise(raw))
    sv = next(s for s in ev.survivors if s.stats.site.line == KEEP[0]["line"])
    assert (sv.stats.count, sv.stats.traced, sv.freed_at_site) == (10, 6, 0)
    assert sv.replacing is not None and sv.replacing[0][1] == KEEP[0]["line"] and sv.replacing[1] == 5
    assert turning_window(ev) is sv
    assert d.verdict != "tensor_leak", d.headline
    assert any("a window that turns over" in e.fact for e in d.evidence)


def test_the_same_site_that_never_lets_go_is_a_leak() -> None:
    raw, _ = run(window=None)
    d, ev = diagnose_snapshot(normalise(raw))
    assert all(s.replacing is None for s in ev.survivors)
    assert d.verdict == "tensor_leak", d.headline


def test_older_blocks_freed_all_at_once_by_another_line_do_not_bound_the_site() -> None:
    """The previous step's leftovers freed at the trace's start (a burst, not one per step) are not a
    window's turnover."""
    raw, _ = run(window=None, burst=True)
    d, ev = diagnose_snapshot(normalise(raw))
    assert turning_window(ev) is None
    assert d.verdict == "tensor_leak", d.headline


def _bundle(raw: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    timeline = [
        {"step": k, "allocated_bytes": v, "peak_allocated_bytes": v + 1024 * MiB}
        for k, v in enumerate(levels)
    ]
    return bundle(raw, step=len(levels), timeline=timeline, batch_size=8)


def test_steps_that_stopped_growing_when_the_window_filled_agree() -> None:
    """The samples grew by one block a step for 24 steps, then stayed level for the last six (too few to
    read as a plateau by themselves) while the trace shows the window turning over."""
    raw, _ = run(steps=30, window=24)
    levels = [1024 * MiB + min(k, 24) * 48 * MiB for k in range(30)]
    d, ev = diagnose_bundle(_bundle(raw, levels))
    assert ev.trend is not None and not ev.trend.plateaued
    assert turning_window(ev) is not None
    assert d.verdict != "tensor_leak", d.headline
    assert any("stopped growing when it began" in e.fact for e in d.evidence)


def test_steps_still_growing_while_the_window_turns_over_keep_the_leak() -> None:
    """The window turns over, but live memory per step kept rising at the same pace: something else
    grows, and the trend still convicts."""
    raw, _ = run(steps=30, window=24)
    levels = [1024 * MiB + k * 48 * MiB for k in range(30)]
    d, ev = diagnose_bundle(_bundle(raw, levels))
    assert turning_window(ev) is None
    assert d.verdict == "tensor_leak", d.headline
