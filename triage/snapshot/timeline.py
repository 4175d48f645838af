"""Replaying ``device_traces``: memory over time, the peak, the OOM, and a consistency check.

The trace is a ring buffer of the last ``max_entries`` events, so it usually starts mid-run. We
know the *final* state exactly (the segments), so the level before the first recorded event is the
final level minus the net change over the trace. Allocated memory is counted in requested bytes
(what ``alloc`` and ``free_*`` entries carry) and drops at ``free_requested`` (the block stops being
``active_allocated`` then); reserved memory moves with ``segment_alloc``/``segment_free`` and, for
expandable segments, ``segment_map``/``segment_unmap``.

One pass over the entries, no per-entry objects: a 1,000,000-entry trace is walked in place.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from triage.snapshot.model import ACTIVE_ALLOCATED, RawEntry, Snapshot, TraceEntry

MAX_POINTS = 600


@dataclass(slots=True)
class TimelinePoint:
    index: int
    time_us: int | None
    allocated: int
    reserved: int


@dataclass(slots=True)
class Consistency:
    checked_blocks: int = 0
    mismatched_blocks: int = 0
    checked_segments: int = 0
    mismatched_segments: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatched_blocks == 0 and self.mismatched_segments == 0 and not self.notes

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_blocks": self.checked_blocks,
            "mismatched_blocks": self.mismatched_blocks,
            "checked_segments": self.checked_segments,
            "mismatched_segments": self.mismatched_segments,
            "notes": self.notes,
        }


@dataclass
class DeviceTimeline:
    device: int
    entries: int
    has_time: bool
    start_allocated: int
    start_reserved: int
    end_allocated: int
    end_reserved: int
    points: list[TimelinePoint]
    peak_allocated: int
    peak_allocated_index: int
    peak_reserved: int
    peak_reserved_index: int
    first_time_us: int | None
    last_time_us: int | None
    oom: TraceEntry | None
    oom_count: int
    actions: dict[str, int]
    consistency: Consistency
    # allocations recorded in the trace that are still live at the end: address -> entry index
    live_alloc_index: dict[int, int] = field(repr=False, default_factory=dict)
    # how often each stack (by frames-list identity) allocated in the trace
    alloc_count_by_stack: Counter[int] = field(repr=False, default_factory=Counter)
    stacks: dict[int, list[dict[str, Any]]] = field(repr=False, default_factory=dict)
    raw: list[RawEntry] = field(repr=False, default_factory=list)
    # allocated level after each entry, relative to the start (add start_allocated for bytes)
    levels: array[int] = field(repr=False, default_factory=lambda: array("q"))
    # bytes allocated (Σ alloc sizes) up to and including each entry
    volumes: array[int] = field(repr=False, default_factory=lambda: array("q"))

    def level_at(self, index: int) -> int:
        return self.levels[index] + self.start_allocated

    def min_level_between(self, lo: int, hi: int) -> int:
        """Lowest allocated level after entries lo..hi-1 (bytes)."""
        if hi <= lo:
            return self.level_at(lo)
        return min(self.levels[lo:hi]) + self.start_allocated

    def to_dict(self) -> dict[str, Any]:
        oom = None
        if self.oom is not None:
            oom = {
                "index": self.oom.index,
                "size": self.oom.size,
                "device_free": self.oom.device_free,
                "time_us": self.oom.time_us,
                "stream": self.oom.stream,
            }
        return {
            "device": self.device,
            "entries": self.entries,
            "has_time": self.has_time,
            "start_allocated_bytes": self.start_allocated,
            "start_reserved_bytes": self.start_reserved,
            "peak_allocated_bytes": self.peak_allocated,
            "peak_allocated_index": self.peak_allocated_index,
            "peak_reserved_bytes": self.peak_reserved,
            "peak_reserved_index": self.peak_reserved_index,
            "first_time_us": self.first_time_us,
            "last_time_us": self.last_time_us,
            "oom": oom,
            "oom_count": self.oom_count,
            "actions": self.actions,
            "consistency": self.consistency.to_dict(),
            "points": [[p.index, p.time_us, p.allocated, p.reserved] for p in self.points],
        }


def _final_levels(snapshot: Snapshot, device: int) -> tuple[int, int, dict[int, int], set[int]]:
    allocated = reserved = 0
    active: dict[int, int] = {}
    seg_addrs: set[int] = set()
    for seg in snapshot.segments:
        if seg.device != device:
            continue
        reserved += seg.total_size
        seg_addrs.add(seg.address)
        for b in seg.blocks:
            if b.state == ACTIVE_ALLOCATED:
                allocated += b.requested_size
                active[b.address] = b.requested_size
    return allocated, reserved, active, seg_addrs


def replay_device(snapshot: Snapshot, device: int, max_points: int = MAX_POINTS) -> DeviceTimeline:
    entries = snapshot.device_traces[device] if device < len(snapshot.device_traces) else []
    n = len(entries)
    final_alloc, final_res, active, seg_addrs = _final_levels(snapshot, device)

    # one pass: levels relative to the (unknown) start, the live set, stacks, actions, peaks
    stride = max(1, n // max_points)
    cur_a = cur_r = 0
    peak_a = peak_r = 0
    peak_a_i = peak_r_i = -1
    live: dict[int, int] = {}
    live_size: dict[int, int] = {}
    freed_unmatched: set[int] = set()
    seg_live: set[int] = set()
    seg_freed: set[int] = set()
    counts: Counter[str] = Counter()
    by_stack: Counter[int] = Counter()
    stacks: dict[int, list[dict[str, Any]]] = {}
    rel_points: list[tuple[int, int | None, int, int]] = []
    oom_index = -1
    oom_count = 0
    last = n - 1
    levels: array[int] = array("q")
    volumes: array[int] = array("q")
    push = levels.append
    push_vol = volumes.append
    vol = 0
    for i, e in enumerate(entries):
        action = e.get("action")
        counts[str(action)] += 1
        if action == "alloc":
            size = e.get("size", 0)
            addr = e.get("addr", 0)
            cur_a += size
            vol += size
            if cur_a > peak_a:
                peak_a, peak_a_i = cur_a, i
            live[addr] = i
            live_size[addr] = size
            freed_unmatched.discard(addr)
            fr = e.get("frames")
            if fr:
                k = id(fr)
                by_stack[k] += 1
                if k not in stacks:
                    stacks[k] = fr
        elif action == "free_requested":
            addr = e.get("addr", 0)
            cur_a -= e.get("size", 0)
            if live.pop(addr, None) is None:
                freed_unmatched.add(addr)
            live_size.pop(addr, None)
        elif action == "segment_alloc" or action == "segment_map":
            cur_r += e.get("size", 0)
            if cur_r > peak_r:
                peak_r, peak_r_i = cur_r, i
            if action == "segment_alloc":
                a = e.get("addr", 0)
                seg_live.add(a)
                seg_freed.discard(a)
        elif action == "segment_free" or action == "segment_unmap":
            cur_r -= e.get("size", 0)
            if action == "segment_free":
                a = e.get("addr", 0)
                seg_live.discard(a)
                seg_freed.add(a)
        elif action == "oom":
            oom_index = i
            oom_count += 1
            rel_points.append((i, e.get("time_us"), cur_a, cur_r))
            push(cur_a)
            push_vol(vol)
            continue
        push(cur_a)
        push_vol(vol)
        if i % stride == 0 or i == last:
            rel_points.append((i, e.get("time_us"), cur_a, cur_r))

    start_alloc = final_alloc - cur_a
    start_res = final_res - cur_r
    peak_a += start_alloc
    peak_r += start_res
    points = [TimelinePoint(i, t, a + start_alloc, r + start_res) for i, t, a, r in rel_points]
    has_time = False
    first_t: int | None = None
    last_t: int | None = None
    if n:
        t0 = entries[0].get("time_us")
        t1 = entries[-1].get("time_us")
        has_time = isinstance(t0, int) and isinstance(t1, int)
        if has_time:
            first_t, last_t = t0, t1

    # consistency: what the trace says is live at the end must be what the segments show
    cons = Consistency()
    for addr, size in live_size.items():
        cons.checked_blocks += 1
        if active.get(addr) != size:
            cons.mismatched_blocks += 1
    for addr in freed_unmatched:
        if addr in live:
            continue
        cons.checked_blocks += 1
        if addr in active:
            cons.mismatched_blocks += 1
    expandable = any(s.is_expandable for s in snapshot.segments if s.device == device)
    if not expandable:
        for addr in seg_live:
            cons.checked_segments += 1
            if addr not in seg_addrs:
                cons.mismatched_segments += 1
        for addr in seg_freed:
            cons.checked_segments += 1
            if addr in seg_addrs:
                cons.mismatched_segments += 1
    if n and start_alloc < 0:
        cons.notes.append(
            f"replaying the trace backwards from the final state gives a negative starting allocation ({start_alloc} bytes)"
        )
    if n and start_res < 0:
        cons.notes.append(
            f"replaying the trace backwards from the final state gives a negative starting reservation ({start_res} bytes)"
        )

    oom = TraceEntry.of(oom_index, entries[oom_index]) if oom_index >= 0 else None
    return DeviceTimeline(
        device=device,
        entries=n,
        has_time=has_time,
        start_allocated=start_alloc,
        start_reserved=start_res,
        end_allocated=final_alloc,
        end_reserved=final_res,
        points=points,
        peak_allocated=peak_a,
        peak_allocated_index=peak_a_i,
        peak_reserved=peak_r,
        peak_reserved_index=peak_r_i,
        first_time_us=first_t,
        last_time_us=last_t,
        oom=oom,
        oom_count=oom_count,
        actions=dict(counts),
        consistency=cons,
        live_alloc_index=live,
        alloc_count_by_stack=by_stack,
        stacks=stacks,
        raw=entries,
        levels=levels,
        volumes=volumes,
    )


def replay(snapshot: Snapshot, max_points: int = MAX_POINTS) -> list[DeviceTimeline]:
    """One timeline per device that has segments or trace entries."""
    return [replay_device(snapshot, d, max_points) for d in snapshot.devices]
