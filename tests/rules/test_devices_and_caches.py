"""Two allocator behaviours that make surviving blocks look like a leak when they are not the cause:

- one process on two GPUs (a model split across cuda:0 and cuda:1): each device is its own memory with
  its own trace, so a site is read per device, and blocks kept on one GPU cannot have made room on the
  other;
- a cache that evicts (least recently used, one entry per key): its blocks outlive the steps that made
  them, but its count of live blocks stops rising while it keeps allocating and freeing.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import tensor_leak
from tests.rules.rawsnap import ACT, KEEP, Trace
from triage.pipeline import diagnose_snapshot
from triage.snapshot.loader import normalise

MiB = 1 << 20
WEIGHTS = [{"filename": "/w/train.py", "line": 30, "name": "main"}]


def _two_gpus(leak_device: int) -> dict[str, Any]:
    """12 steps on each GPU (cuda:1 runs one more activation per step: its trace is longer), a 64 MiB
    tensor kept every step on ``leak_device``, and the OOM on cuda:1."""
    gpus = [Trace(0), Trace(1)]
    for t in gpus:
        for _ in range(3):
            t.alloc(512 * MiB, WEIGHTS)  # the same line loads each half of the model
    for _ in range(12):
        for t in gpus:
            t.step(4 + t.device, 64 * MiB if t.device == leak_device else None)
    gpus[1].entries.append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": gpus[0].segments() + gpus[1].segments(), "device_traces": [t.entries for t in gpus]}


@pytest.mark.parametrize(("leak_device", "leak_verdict"), [(1, True), (0, False)])
def test_a_leak_counts_only_on_the_gpu_that_ran_out(leak_device: int, leak_verdict: bool) -> None:
    """The same code allocates on both GPUs (one site, two devices, traces of different lengths: replaying
    it once mixed the two traces' entry indices and crashed). Kept on cuda:1, where the OOM is: a leak.
    Kept on cuda:0: it could not have made room on cuda:1, and is not this OOM's cause."""
    snap = normalise(_two_gpus(leak_device), source="test", shared_frames=False)
    d, ev = diagnose_snapshot(snap)
    sites = [s for s in ev.sites if s.site.line == 99]
    assert [sorted(s.devices) for s in sites] == [[leak_device]]
    assert sorted(min(s.devices) for s in ev.sites if s.site.line == 30) == [0, 1]
    assert (d.verdict == "tensor_leak") is leak_verdict
    assert bool(d.leak_site and d.leak_site["line"] == 99) is leak_verdict


def _keyed_cache(capacity: int | None, steps: int = 24) -> dict[str, Any]:
    """Each step looks up a key (one hot, eight cycling) in a cache of ``capacity`` entries (least recently
    used evicted),
    building a 64 MiB entry on a miss; ``capacity=None``: a dict keyed by step that never evicts (a leak)."""
    t = Trace(0)
    cache: dict[int, int] = {}
    for k in range(steps):
        # key 0 is hot (every other step): the oldest entry stays while newer ones are evicted
        key = (0 if k % 2 == 0 else 1 + (k // 2) % 8) if capacity is not None else k
        if key in cache:
            cache[key] = cache.pop(key)  # most recently used
            t.step(4, None)
            continue
        made = [t.alloc(256 * MiB, ACT) for _ in range(4)]
        cache[key] = t.alloc(64 * MiB, KEEP)
        if capacity is not None and len(cache) > capacity:
            t.free(cache.pop(next(iter(cache))))
        for a in reversed(made):
            t.free(a)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


@pytest.mark.parametrize(("capacity", "leak_verdict"), [(4, False), (None, True)])
def test_a_cache_that_evicts_is_not_a_leak(capacity: int | None, leak_verdict: bool) -> None:
    """An LRU cache of 4 entries turns over (its survivors are not the oldest blocks, so it does not look
    like a FIFO): its live count reached 4 early and stayed there. Without eviction the count keeps
    rising: a leak."""
    snap = normalise(_keyed_cache(capacity), source="test", shared_frames=False)
    d, ev = diagnose_snapshot(snap)
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert any("a cache that evicts" in s for s in f.facts) is not leak_verdict
    assert (d.verdict == "tensor_leak") is leak_verdict


def _fifo_or_late_leak(late: bool, steps: int = 20) -> dict[str, Any]:
    """``late``: the line's tensor is dropped at the end of every step for 11 steps, then kept at every step
    (a logging callback turned on after the first evaluation). Otherwise the line fills a queue of 9 and
    evicts its oldest entry from then on (a FIFO of recent outputs)."""
    t = Trace(0)
    queue: list[int] = []
    for k in range(steps):
        made = [t.alloc(256 * MiB, ACT) for _ in range(4)]
        out = t.alloc(64 * MiB, KEEP)
        if late:
            if k < steps - 9:
                t.free(out)
        else:
            queue.append(out)
            if len(queue) > 9:
                t.free(queue.pop(0))
        for a in reversed(made):
            t.free(a)
    t.entries.append(
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": ACT}
    )
    return {"segments": t.segments(), "device_traces": [t.entries]}


@pytest.mark.parametrize("late", [True, False])
def test_a_leak_that_began_late_is_not_a_cache_that_evicted(late: bool) -> None:
    """Both end with the line's 9 newest tensors alive and its older ones freed before the first of them
    was made. The FIFO freed an old entry each time it kept a new one, while the 9 were alive; the late
    leak freed its earlier tensors in their own steps, before it kept any."""
    snap = normalise(_fifo_or_late_leak(late), source="test", shared_frames=False)
    _, ev = diagnose_snapshot(snap)
    kept = next(s for s in ev.survivors if s.stats.site.line == 99)
    assert kept.stats.count == 9 and kept.cycles >= 8
    assert kept.evicted_like_a_cache is not late
