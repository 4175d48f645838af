"""A snapshot alone, whose trace holds only the failing step: one user line holding thousands of live blocks
of exactly one size, none made in the trace, a tenth of live memory or more, is the same small tensor kept
again and again (a per-token loss appended to a history). Without the steps it stays a lead, named; blocks
of many sizes from one line (optimizer state, one per parameter) or a few hundred are not a pile.

Snapshots are torch's raw layout (tests/rules/rawsnap.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import tensor_leak
from rules.base import LEAD
from tests.rules.rawsnap import ACT, MiB, Trace, one_block_segment
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

HISTORY = [{"filename": "/w/train.py", "line": 133, "name": "train_step"}]
WEIGHTS = [{"filename": "/w/train.py", "line": 40, "name": "main"}]


def piled(sizes: list[int]) -> dict[str, Any]:
    t = Trace(0)
    for _ in range(8):
        t.alloc(256 * MiB, ACT)
    t.oom(1024 * MiB, ACT)
    segments = t.segments()
    addr = 1 << 46
    for size in sizes:
        addr += 1 << 21
        segments.append(one_block_segment(0, addr, size, HISTORY))
    segments.append(one_block_segment(0, addr + (1 << 32), 6 * 1024 * MiB, WEIGHTS))
    return {"segments": segments, "device_traces": [t.entries]}


@pytest.mark.parametrize(
    ("sizes", "pile"),
    [
        ([512 * 1024] * 3000, True),  # 1.5 GiB of one 512 KiB tensor
        ([(256 + 64 * (k % 7)) * 1024 for k in range(3000)], False),  # one per parameter, many sizes
        ([2 * MiB] * 700, False),  # a few hundred: a layer count, a batch of samples
    ],
)
def test_thousands_of_one_small_tensor_are_a_lead(sizes: list[int], pile: bool) -> None:
    d, ev = diagnose_snapshot(normalise(piled(sizes)))
    f = tensor_leak.evaluate(ev)
    assert f is not None
    if pile:
        assert f.score == LEAD and f.leak_site == {
            "filename": "/w/train.py",
            "line": 133,
            "name": "train_step",
        }
        assert any("3000 blocks of exactly 512.0 KiB" in s for s in f.facts)
        assert d.verdict == "inconclusive" and "tensor_leak" in d.candidates
    else:
        assert f.score < LEAD and f.leak_site is None
