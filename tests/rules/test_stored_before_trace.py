"""Blocks an evaluation loop stored outside the model before the allocator's trace began: the collector's
steps were flat, the OOM came in the loop, far above what the steps peaked at, and the trace (a short
history) reaches back only into the call under way. The stored blocks are older than the trace, beyond the
floor the last step left, and made at one user line outside any call of the model: kept since the steps.
Without the trace reaching back, a store the job means to keep looks the same: a lead, not a verdict, and
no longer a batch too large.

The traces are built as torch records them (see tests/rules/test_eval_loops.py); the bundle is the
collector's, with its per-step samples.
"""

from __future__ import annotations

from typing import Any

from rules import tensor_leak, workload_too_large
from rules.base import LEAD
from tests.rules.test_eval_loops import KEEP, incident
from triage.evidence import stored_since_steps
from triage.pipeline import diagnose_bundle


def short_history(b: dict[str, Any], keep_last: int = 40) -> dict[str, Any]:
    """The same incident with a trace that kept only its last entries (history_max_entries)."""
    traces = b["snapshot"]["device_traces"]
    traces[0] = traces[0][-keep_last:]
    return b


def test_a_store_older_than_the_trace_is_a_lead_and_not_a_batch_too_large() -> None:
    d, ev = diagnose_bundle(short_history(incident(evals=30)))
    stored = stored_since_steps(ev)
    assert stored is not None
    site, n, _ = stored
    assert site.line == KEEP[0]["line"] and 20 <= n < 30  # the last few are in the trace
    leak = tensor_leak.evaluate(ev)
    assert leak is not None and leak.score == LEAD
    assert leak.leak_site is not None and leak.leak_site["line"] == KEEP[0]["line"]
    wl = workload_too_large.evaluate(ev)
    assert wl is not None and wl.score <= LEAD
    assert d.verdict == "inconclusive" and "tensor_leak" in d.candidates


def test_without_the_store_nothing_older_than_the_trace_is_beyond_the_floor() -> None:
    _, ev = diagnose_bundle(short_history(incident(evals=30, keep=False)))
    assert stored_since_steps(ev) is None
    leak = tensor_leak.evaluate(ev)
    assert leak is None or not any("before the trace began" in s for s in leak.facts)


def test_calls_kept_since_before_a_short_trace_count_with_those_it_shows() -> None:
    """A validation loop keeping its graphs, and a trace that reaches back only to its last three calls:
    the five before them are live blocks made under the same line before the trace began, and count with
    the three the trace shows as calls kept (without them, the three alone are too little of the moment)."""
    from tests.rules.test_kept_calls import EVAL_CALL, LAYERS, eval_after_training
    from triage.evidence import kept_graphs
    from triage.pipeline import diagnose_snapshot
    from triage.snapshot.loader import normalise
    from triage.units import MiB

    raw = eval_after_training(steps=5, evals=8)
    entries = raw["device_traces"][0]
    calls = [
        i
        for i, e in enumerate(entries)
        if e.get("action") == "alloc"
        and e.get("frames")
        and any(f.get("line") == EVAL_CALL["line"] for f in e["frames"])
    ]
    first_of_sixth = calls[
        5 * 2 * LAYERS
    ]  # the sixth call's first (a saved activation and a temporary a layer)
    raw["device_traces"][0] = entries[first_of_sixth:]
    _, ev = diagnose_snapshot(normalise(raw))
    kc = ev.kept_calls
    assert kc is not None and kc.calls == 3 and kc.freed_before == 0  # the sixth to the eighth
    got = kept_graphs(ev, unproven=True)
    assert got is not None
    assert got[0].older_bytes == 5 * LAYERS * 128 * MiB
    assert got[0].kept_bytes == got[0].bytes + got[0].older_bytes
