"""A request that is the latest of a run of allocations from its own line that only grew: a tensor re-made
larger at every call, as ``DynamicCache.update`` does with ``torch.cat`` for each layer at each generated
token. Each new, longer cache replaces the old one, and the old one's block is left as a hole a little too
small for the next; the allocator fails with memory free in the cache. Whether the generation would have
fitted packed depends on how many tokens were still to come, which the record does not hold: the holes
decide nothing on their own.

Traces built as torch records them (tests/rules/test_kept_calls.py: module-call frames inside the forward).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.rawsnap import MiB, Trace, free_segment
from tests.rules.test_kept_calls import line, under, weights
from triage.evidence import growing_request
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

GIB = 1024 * MiB
GENERATE = line(57, "handle")  # `out = model.generate(**inputs)`
LAYERS = 4


def generation(*, tokens: int, grow: bool = True) -> dict[str, Any]:
    """``tokens`` decoding steps; per layer the cache is rebuilt one token longer (2 MiB a token) and the old
    one freed. The OOM is the next layer's rebuild; 40 holes of 60 MiB are cached beside it."""
    t = Trace(0)
    weights(t)
    cache = [t.alloc(64 * MiB, under(GENERATE, 447)) for _ in range(LAYERS)]
    size = 64 * MiB
    for _ in range(tokens):
        size += 2 * MiB if grow else 0
        for k in range(LAYERS):
            new = t.alloc(size, under(GENERATE, 447))
            t.free(cache[k])
            cache[k] = new
    t.entries.append(
        {
            "action": "oom",
            "addr": 0,
            "size": size + (2 * MiB if grow else 0),
            "stream": 0,
            "device_free": 0,
            "frames": under(GENERATE, 447),
        }
    )
    holes = [free_segment(0, (9 << 40) + k * (1 << 30), 60 * MiB) for k in range(40)]
    return {"segments": t.segments() + holes, "device_traces": [t.entries]}


def message(raw: dict[str, Any]) -> str:
    reserved = sum(seg["total_size"] for seg in raw["segments"])
    allocated = sum(seg["allocated_size"] for seg in raw["segments"])
    req = raw["device_traces"][0][-1]["size"]
    gib = 1 << 30
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req / MiB:.2f} MiB. GPU 0 has a total "
        f"capacity of {(reserved + 300 * MiB) / gib:.2f} GiB of which 0 bytes is free. Including non-PyTorch "
        f"memory, this process has {(reserved + 300 * MiB) / gib:.2f} GiB memory in use. Of the allocated memory "
        f"{allocated / gib:.2f} GiB is allocated by PyTorch, and {(reserved - allocated) / MiB:.2f} MiB is "
        "reserved by PyTorch but unallocated."
    )


def test_a_cache_grown_token_by_token_leaves_the_holes_undecided() -> None:
    raw = generation(tokens=12)
    d, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    grow = growing_request(ev)
    assert grow is not None and grow[0] >= 8 and grow[1] < grow[2]
    assert ev.largest_free_block_bytes is not None and ev.largest_free_block_bytes < (ev.request_bytes or 0)
    scores = {f["rule"]: f["score"] for f in d.details["findings"]}
    assert scores["fragmentation"] <= 0.55
    assert d.verdict == "inconclusive", d.headline
    assert any("only grew" in e.fact for e in d.evidence)


@pytest.mark.parametrize("tokens", [1, 12])
def test_no_run_of_growth_no_question(tokens: int) -> None:
    """Grown once only (after the first token), or a cache of one size rebuilt in place: the request is not
    the front of a growth."""
    raw = generation(tokens=tokens, grow=tokens == 1)
    _, ev = diagnose_snapshot(normalise(raw), message=message(raw))
    assert growing_request(ev) is None


BANK = [{"filename": "/w/memory_bank.py", "line": 33, "name": "push"}, *under(GENERATE, 90)[-2:]]


@pytest.mark.parametrize("trimmed", [False, True])
def test_one_block_concatenated_onto_itself_every_step_is_the_leak_site(trimmed: bool) -> None:
    """``self.bank = torch.cat([self.bank, k])`` every step, never trimmed: one live block, re-made 6 MiB
    larger each step and the old one freed. The steps prove the growth; the trace (the last 20 steps) shows
    the one line whose block is all of it. Trimmed to a fixed size, the block stops growing: no site."""
    from tests.rules.rawsnap import ACT, bundle
    from triage.pipeline import diagnose_bundle

    t = Trace(0)
    bank = t.alloc(2048 * MiB, BANK)
    start = 0
    steps = 60
    for k in range(steps):
        if k == steps - 20:
            start = len(t.entries)
        t.step(3, None)
        size = 2048 * MiB + (0 if trimmed else (k + 1) * 6 * MiB)
        new = t.alloc(size, BANK)
        t.free(bank)
        bank = new
    t.alloc(256 * MiB, ACT)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 512 * MiB, "stream": 0, "device_free": 0, "frames": ACT}
    )
    raw = {"segments": t.segments(), "device_traces": [t.entries[start:]]}
    grow = 0 if trimmed else 6 * MiB
    timeline = [
        {
            "step": k,
            "allocated_bytes": 2048 * MiB + k * grow,
            "peak_allocated_bytes": 2048 * MiB + k * grow + GIB,
        }
        for k in range(steps)
    ]
    d, _ = diagnose_bundle(bundle(raw, step=steps, timeline=timeline))
    if trimmed:
        assert d.verdict != "tensor_leak" or d.leak_site is None
        return
    assert d.verdict == "tensor_leak", d.headline
    assert d.leak_site is not None and d.leak_site["line"] == 33
    assert any("concatenated onto itself" in e.fact for e in d.evidence)
