"""Two readings of the collector's step samples beside a snapshot.

- The steps prove a leak, the trace is too short to show a site's blocks crossing steps, and no one line
  holds the growth: three lines of one loss function each keep a tensor per step (its intermediates, held
  by the graph of a running total). Together, called from one line, they hold what live memory grew by:
  that caller is named.
- Steps of varying size (lengths padded per batch) and holes in the cache: a step a little larger than
  every one before it still fails on the holes.

Bundles are the collector's (tests/rules/rawsnap.py), snapshots as torch writes them.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import fragmentation
from rules.base import POSSIBLE
from tests.rules.rawsnap import MiB, Trace, bundle, one_block_segment, segment_with_hole
from triage.pipeline import diagnose_bundle

GIB = 1024 * MiB
TRAIN = {"filename": "/w/train.py", "line": 142, "name": "train_step"}
MAIN = {"filename": "/w/train.py", "line": 313, "name": "main"}
ACT = [{"filename": "/w/model.py", "line": 30, "name": "forward"}, TRAIN, MAIN]


def kl_line(no: int) -> list[dict[str, Any]]:
    return [{"filename": "/w/losses.py", "line": no, "name": "kl"}, TRAIN, MAIN]


def kept_by_one_caller(*, lines: tuple[int, ...]) -> dict[str, Any]:
    """20 sampled steps, live memory growing 768 MiB a step; at the OOM, 20 blocks of 768 MiB split over
    ``lines`` of losses.py, all older than the trace, which holds only the failing step's activations."""
    segments = []
    addr = 1 << 40
    for k in range(20):
        addr += 1 << 32
        segments.append(one_block_segment(0, addr, 768 * MiB, kl_line(lines[k % len(lines)])))
    addr += 1 << 32
    segments.append(
        one_block_segment(0, addr, 8 * GIB, [{"filename": "/w/train.py", "line": 90, "name": "main"}])
    )
    t = Trace(0)
    for _ in range(4):
        t.alloc(512 * MiB, ACT)
    t.oom(1024 * MiB, ACT)
    raw = {"segments": segments + t.segments(), "device_traces": [t.entries]}
    timeline = [
        {
            "step": k + 1,
            "allocated_bytes": 8 * GIB + k * 768 * MiB,
            "peak_allocated_bytes": 10 * GIB + k * 768 * MiB,
        }
        for k in range(20)
    ]
    return bundle(raw, step=21, timeline=timeline, batch_size=4)


def test_lines_one_caller_runs_that_together_hold_the_growth_name_the_caller() -> None:
    d, _ = diagnose_bundle(kept_by_one_caller(lines=(22, 23, 24)))
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == ("/w/train.py", 142)
    assert any("all called from train.py:142 in train_step" in e.fact for e in d.evidence)


def test_one_line_that_holds_the_growth_is_named_itself() -> None:
    d, _ = diagnose_bundle(kept_by_one_caller(lines=(22,)))
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == ("/w/losses.py", 22)


def varying_steps(*, last_peak_gib: float) -> dict[str, Any]:
    """30 steps whose peaks vary with the batch's padded length (20 to ``last_peak_gib`` GiB, flat between
    steps), then a step that fails on a 2 GiB request while 6 GiB sits free in holes of 1 GiB: the job
    held 40 GiB, the device has 1 GiB free."""
    segments = []
    addr = 1 << 40
    for _ in range(6):
        addr += 1 << 33
        segments.append(segment_with_hole(0, addr, 5 * GIB, 1 * GIB, ACT))
    addr += 1 << 33
    segments.append(one_block_segment(0, addr, 10 * GIB, ACT))
    t = Trace(0)
    t.oom(2 * GIB, ACT, device_free=1 * GIB)
    raw = {"segments": segments, "device_traces": [t.entries]}
    peaks = [20 + (last_peak_gib - 20) * ((k * 7) % 30) / 29 for k in range(30)]
    timeline = [
        {"step": k + 1, "allocated_bytes": 12 * GIB, "peak_allocated_bytes": int(p * GIB)}
        for k, p in enumerate(peaks)
    ]
    b = bundle(raw, step=31, timeline=timeline, batch_size=8)
    b["device"]["free_bytes"] = 1 * GIB
    return b


@pytest.mark.parametrize("last_peak_gib", [41, 44])
def test_a_step_a_little_above_varying_earlier_ones_is_still_decided_by_the_holes(
    last_peak_gib: float,
) -> None:
    """The failing step wanted 42 GiB (40 held, 2 asked). Earlier peaks from 20 GiB up to 41 or 44 GiB: a
    varying workload fails on its holes at a step a little larger than any before as often as at one no
    larger (capping the holes there cost fragmentation cases of the scenario set their verdict), so only a
    step far above the earlier ones, or above them by more than they ever varied, leaves it undecided."""
    d, ev = diagnose_bundle(varying_steps(last_peak_gib=last_peak_gib))
    assert ev.needed_bytes == 42 * GIB
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score > POSSIBLE
    assert d.verdict == "fragmentation", d.headline


METRIC = [{"filename": "/w/metrics.py", "line": 36, "name": "update"}, TRAIN, MAIN]


def concatenated_state(*, replaced: bool) -> dict[str, Any]:
    """30 sampled steps, live memory growing 64 MiB a step; a trace of the last step only: a metric's state
    re-made 64 MiB larger by ``torch.cat`` (with ``replaced``, the older, smaller state freed at once)."""
    older = 1 << 41
    segments = [
        one_block_segment(0, 1 << 40, 6 * GIB, [{"filename": "/w/train.py", "line": 90, "name": "main"}])
    ]
    t = Trace(0)
    acts = [t.alloc(256 * MiB, ACT) for _ in range(4)]
    state = 30 * 64 * MiB
    t.alloc(state, METRIC)
    if replaced:
        for action in ("free_requested", "free_completed"):
            t.entries.append({"action": action, "addr": older, "size": state - 64 * MiB, "stream": 0})
    else:
        segments.append(one_block_segment(0, older, state - 64 * MiB, []))
    for a in acts:
        t.free(a)
    t.oom(1024 * MiB, ACT)
    raw = {"segments": segments + t.segments(), "device_traces": [t.entries]}
    timeline = [
        {
            "step": k + 1,
            "allocated_bytes": 6 * GIB + k * 64 * MiB,
            "peak_allocated_bytes": 7 * GIB + k * 64 * MiB,
        }
        for k in range(30)
    ]
    return bundle(raw, step=31, timeline=timeline, batch_size=4)


@pytest.mark.parametrize("replaced", [True, False])
def test_a_state_re_made_once_in_a_short_trace_is_named_when_it_replaced_an_older_one(replaced: bool) -> None:
    d, _ = diagnose_bundle(concatenated_state(replaced=replaced))
    assert d.verdict == "tensor_leak", d.headline
    named = d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == (
        "/w/metrics.py",
        36,
    )
    assert named is replaced


LOGITS = [{"filename": "/w/trainer_ext.py", "line": 48, "name": "compute_loss"}, MAIN]


def kept_per_step(*, step: int, kept: int, at: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A bundle without step samples at ``step``: ``kept`` logits blocks of 126 MiB at one line (``at``'s
    stack, else the loss's), older than a trace of the failing step alone, whose activations (of several
    sizes) come from the same line."""
    frames = at or LOGITS
    segments = [
        one_block_segment(0, 1 << 40, 8 * GIB, [{"filename": "/w/train.py", "line": 90, "name": "main"}])
    ]
    addr = 1 << 41
    for _ in range(kept):
        addr += 1 << 30
        segments.append(one_block_segment(0, addr, 126 * MiB, frames))
    t = Trace(0)
    for k in range(6):
        t.alloc((40 + 8 * k) * MiB, frames)
    t.oom(250 * MiB, frames)
    raw = {"segments": segments + t.segments(), "device_traces": [t.entries]}
    return bundle(raw, step=step, timeline=[], batch_size=4)


@pytest.mark.parametrize(("step", "named"), [(236, True), (240, True), (900, False), (12, False)])
def test_as_many_blocks_of_one_size_at_one_line_as_steps_run_is_one_kept_per_step(
    step: int, named: bool
) -> None:
    """236 blocks of the logits' size at the line that computes the loss, at step 236 (or 240): one kept
    per step. At step 900 or step 12 the count does not follow the steps: the snapshot alone decides nothing."""
    d, _ = diagnose_bundle(kept_per_step(step=step, kept=236))
    assert (d.verdict == "tensor_leak") is named, d.headline
    if named:
        assert d.leak_site is not None and d.leak_site["line"] == 48
        assert any("one kept at every step" in e.fact for e in d.evidence)


def test_weights_made_while_the_model_was_built_are_not_one_kept_per_step() -> None:
    """A transformer's layers give many weights of one size (96 MLP matrices of 112 MiB for 32 layers): made
    in the model's ``__init__``, they are weights, whatever the step count happens to be."""
    built = [{"filename": "/w/reward.py", "line": 95, "name": "__init__"}, MAIN]
    d, _ = diagnose_bundle(kept_per_step(step=236, kept=236, at=built))
    assert not any("one kept at every step" in e.fact for e in d.evidence)
    assert d.verdict != "tensor_leak", d.headline
