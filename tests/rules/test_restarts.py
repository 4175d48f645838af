"""A timeline whose step count starts again: an attempt restarted from a checkpoint in the same process
(a retry loop, a trainer that reloads and goes on). When live memory after the same steps is much higher
the second time, what the earlier attempt held (its model, optimizer state, outputs) was never freed;
when it is the same, the restart kept nothing. A count that merely restarts every epoch reads the same way:
equal floors say nothing, higher ones say something of the epoch before was kept.

The bundles are the collector's shape (docs/bundle.md) with the OOM message and no snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import tensor_leak, workload_too_large
from rules.base import LIKELY, POSSIBLE, STRONG
from tests.rules.test_timelines import bundle
from triage.pipeline import diagnose_bundle
from triage.units import GiB


def attempts(floors: list[float], *, back_to: int = 250, length: int = 300) -> list[dict[str, Any]]:
    """One run of steps per floor (GiB after each step); each after the first starts again at ``back_to``."""
    out: list[dict[str, Any]] = []
    for k, floor in enumerate(floors):
        first = 0 if k == 0 else back_to
        for step in range(first, first + length):
            out.append(
                {
                    "step": step,
                    "allocated_bytes": int(floor * GiB),
                    "peak_allocated_bytes": int((floor + 38) * GiB),
                    "batch_size": 8,
                }
            )
    return out


def incident(floors: list[float], *, again: bool, alloc: float) -> dict[str, Any]:
    b = bundle(attempts(floors), req=3.1, alloc=alloc, ru=1.2)
    if again:  # the OOM came in yet another attempt, at a step below the last sample's
        b["workload"]["step"] = b["timeline"][-1]["step"] - 49
    return b


@pytest.mark.parametrize(("again", "score"), [(True, STRONG), (False, LIKELY)])
def test_an_attempt_that_kept_the_one_before(again: bool, score: float) -> None:
    d, ev = diagnose_bundle(incident([15.8, 33.2], again=again, alloc=74.0))
    assert ev.restart_growth is not None and ev.restart_growth[:2] == (299, 250)
    assert ev.restart_kept_bytes is not None and ev.restart_kept_bytes > 17 * GiB
    assert ev.restarted_again is again
    assert len(ev.steps) == 300  # the trend is the last attempt's own
    f = tensor_leak.evaluate(ev)
    assert f is not None and f.score == pytest.approx(score)
    assert "started again" in f.facts[0]
    wl = workload_too_large.evaluate(ev)
    assert wl is not None and wl.score <= POSSIBLE
    assert d.verdict == "tensor_leak"


def test_an_attempt_that_kept_nothing() -> None:
    d, ev = diagnose_bundle(incident([15.8, 15.8], again=True, alloc=74.0))
    assert ev.restart_growth is not None and ev.restart_kept_bytes is None
    f = tensor_leak.evaluate(ev)
    assert f is None or not any("started again" in s for s in f.facts)
    assert d.verdict != "tensor_leak"


def test_steps_that_only_go_forward_are_one_attempt() -> None:
    _, ev = diagnose_bundle(bundle(attempts([15.8]), req=3.1, alloc=74.0, ru=1.2))
    assert ev.restart_growth is None and len(ev.steps) == 300
