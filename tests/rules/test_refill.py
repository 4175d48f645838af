"""A store of per-batch tensors bounded in count (the last N features, a window of outputs) fills over
its first N steps and then holds flat: its entries are replaced one for one. When the batch grows, each
new entry is larger than the one it replaces, so live memory climbs again, for up to N steps and by at
most the store's size times the batch's ratio less one. That climb is the same bounded store re-filling,
not a leak; a store that never held flat at the old size, or a climb beyond what the larger entries
explain, still is one.
"""

from __future__ import annotations

from triage.evidence import StepSample, _trend_of
from triage.pipeline import diagnose_bundle
from triage.simulate.scenarios import run_scenario

MiB = 1 << 20


def samples(levels_mib: list[float], batches: list[int]) -> list[StepSample]:
    return [
        StepSample(
            step=k, allocated_bytes=int(v * MiB), peak_allocated_bytes=int(v * MiB) + 4096 * MiB, batch_size=b
        )
        for k, (v, b) in enumerate(zip(levels_mib, batches, strict=True))
    ]


FILL = [1000 + 500 * k for k in range(8)]  # 8 entries of 500 MiB at batch 64


def test_flat_then_refilling_after_the_batch_grew_is_bounded() -> None:
    levels = [*FILL, 4500.2, 4500.0, 4500.3, 4500.1, 5800, 6500, 7100]  # batch 64 -> 128 at the 13th
    t = _trend_of(samples(levels, [64] * 12 + [128] * 3))
    assert t is not None and t.refilled and t.plateaued


def test_no_flat_stretch_before_the_batch_grew_is_not_a_refill() -> None:
    levels = [*FILL, 5000, 5500, 6000, 6500, 7800, 8500, 9100]  # grew every step at batch 64
    t = _trend_of(samples(levels, [64] * 12 + [128] * 3))
    assert t is not None and not t.refilled and not t.plateaued


def test_climb_beyond_what_larger_entries_explain_is_not_a_refill() -> None:
    # the store held 3500 MiB at batch 64; at batch 80 its entries are 1.25x: it can grow by 875 MiB
    levels = [*FILL, 4500.2, 4500.0, 4500.3, 4500.1, 5800, 6700, 7600]
    assert _trend_of(samples(levels, [64] * 12 + [80] * 3)).refilled is False  # type: ignore[union-attr]
    levels = [*FILL, 4500.2, 4500.0, 4500.3, 4500.1, 5000, 5300, 5500]
    assert _trend_of(samples(levels, [64] * 12 + [80] * 3)).refilled is True  # type: ignore[union-attr]


def test_bounded_cache_whose_batch_ramped_is_not_called_a_leak() -> None:
    """The simulator's cache of the last 9 feature tensors, flat for 6 steps at batch 78, then batch 205:
    live memory climbs again as larger entries replace smaller ones, and the step at 205 does not fit."""
    case = run_scenario("bounded_cache", 42)
    d, ev = diagnose_bundle(case.bundle)
    assert ev.trend is not None and ev.trend.refilled
    assert d.verdict == "workload_too_large"
    assert (
        d.max_batch_size is not None
        and abs(d.max_batch_size - case.truth["max_batch_size"]) <= 0.1 * case.truth["max_batch_size"]
    )
