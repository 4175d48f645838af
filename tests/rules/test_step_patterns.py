"""Two readings of the collector's step samples:

- two rises alone, of the same size, far apart, with the run ending before a third was due: the same
  tensors kept at each of two evaluations (a validation loop's outputs never cleared), the OOM coming in
  the third: a staircase, not a cache that filled and levelled off. Uneven rises, or a long flat run after
  the second, still level off;
- a small rise at every sampled step, and one user line holding a block of that size for each of them or
  more (the run went on longer than the samples reach back): that line is the leak's, and a rise that small
  is not also called flat.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.rawsnap import MiB, Trace, bundle, one_block_segment
from triage.evidence import StepSample, _trend_of
from triage.pipeline import diagnose_bundle

GIB = 1024 * MiB


def trend_of(levels_gib: list[float]) -> Any:
    return _trend_of(
        [
            StepSample(
                step=k, allocated_bytes=int(v * GIB), peak_allocated_bytes=int((v + 12) * GIB), batch_size=16
            )
            for k, v in enumerate(levels_gib)
        ]
    )


@pytest.mark.parametrize(
    ("levels", "pair"),
    [
        ([4.0] * 50 + [13.75] * 50 + [23.5] * 50, True),  # kept at two evaluations, the OOM in the third
        ([4.0] * 50 + [13.75] * 50 + [16.0] * 50, False),  # uneven: a cache filling in bursts
        (
            [4.0] * 20 + [13.75] * 20 + [23.5] * 100,
            False,
        ),  # long flat since: the third was due and never came
    ],
)
def test_two_equal_rises_apart_are_a_staircase(levels: list[float], pair: bool) -> None:
    t = trend_of(levels)
    assert t.regular_pair is pair
    assert t.staircase is pair and t.plateaued is not pair


TRAIN = [{"filename": "/srv/jobs/metrics.py", "line": 57, "name": "update"}]
ACT = [{"filename": "/srv/jobs/model.py", "line": 30, "name": "forward"}]


def slow_leak(*, kept_blocks: int, block: int) -> dict[str, Any]:
    """4096 sampled steps, live memory up by 192 KiB at each; ``kept_blocks`` blocks of ``block`` bytes
    alive at metrics.py:57 (older than the trace), which holds the failing step's activations."""
    t = Trace(0)
    for _ in range(6):
        t.alloc(512 * MiB, ACT)
    t.oom(2 * GIB, ACT)
    segments = t.segments()
    addr = 1 << 46
    for _ in range(kept_blocks):
        addr += 1 << 21
        segments.append(one_block_segment(0, addr, block, TRAIN))
    segments.append(
        one_block_segment(
            0, addr + (1 << 30), 6 * GIB, [{"filename": "/srv/jobs/train.py", "line": 20, "name": "main"}]
        )
    )
    per_step = 192 * 1024
    timeline = [
        {
            "step": 11000 + k,
            "allocated_bytes": 5 * GIB + k * per_step,
            "peak_allocated_bytes": 9 * GIB + k * per_step,
            "batch_size": 32,
        }
        for k in range(4096)
    ]
    raw = {"segments": segments, "device_traces": [t.entries]}
    return bundle(raw, step=15096, timeline=timeline, batch_size=32)


def test_a_block_kept_every_step_since_before_the_samples_is_named() -> None:
    d, _ = diagnose_bundle(slow_leak(kept_blocks=15000, block=192 * 1024))
    assert d.verdict == "tensor_leak"
    assert d.leak_site is not None and (d.leak_site["filename"], d.leak_site["line"]) == (
        "/srv/jobs/metrics.py",
        57,
    )
    facts = [e.fact for e in d.evidence if e.rule == "tensor_leak"]
    assert any("1 for each step" in f and "more steps than the samples reach back" in f for f in facts)
    assert not any("stayed flat" in f for f in facts)


def test_blocks_of_another_size_than_the_steps_grew_by_are_not_named() -> None:
    d, _ = diagnose_bundle(slow_leak(kept_blocks=15000, block=2 * 1024 * 1024))
    assert d.leak_site is None or d.leak_site["line"] != 57
