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
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import itemgetter, methodcaller, mul
from typing import Any

from triage.errors import NotASnapshot
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
    # entry index of every alloc, in order
    alloc_indices: list[int] = field(repr=False, default_factory=list)
    action_column: list[Any] = field(repr=False, default_factory=list)
    size_column: list[Any] = field(repr=False, default_factory=list)
    _volumes: array[int] | None = field(repr=False, default=None)

    @property
    def volumes(self) -> array[int]:
        """Bytes allocated (Σ alloc sizes) up to and including each entry; computed on first use."""
        if self._volumes is None:
            self._volumes = array(
                "q",
                accumulate(map(mul, map(_VOLUME_SIGN.get, self.action_column, repeat(0)), self.size_column)),
            )
        return self._volumes

    def level_at(self, index: int) -> int:
        return self.levels[index] + self.start_allocated

    def min_level_between(self, lo: int, hi: int) -> int:
        """Lowest allocated level after entries lo..hi-1 (bytes)."""
        if hi <= lo:
            return self.level_at(lo)
        return min(self.levels[lo:hi]) + self.start_allocated

    def max_level_between(self, lo: int, hi: int) -> int:
        """Highest allocated level after entries lo..hi-1 (bytes)."""
        if hi <= lo:
            return self.level_at(lo)
        return max(self.levels[lo:hi]) + self.start_allocated

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


_SEG_UP = frozenset({"segment_alloc", "segment_map"})
_SEG_DOWN = frozenset({"segment_free", "segment_unmap"})
_ALLOC_SIGN = {"alloc": 1, "free_requested": -1}
_VOLUME_SIGN = {"alloc": 1}
_RESERVE_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def _reserved_at(index: int, seg_idx: list[int], res_steps: list[int]) -> int:
    """Reserved bytes (relative to the start) after entry ``index``, from the sparse segment events."""
    k = bisect_right(seg_idx, index)
    return res_steps[k - 1] if k else 0


def _column(entries: list[RawEntry], key: str, default: Any) -> list[Any]:
    """One field of every entry: itemgetter at C speed, dict.get where some entry lacks it (``oom``)."""
    try:
        return list(map(itemgetter(key), entries))
    except KeyError:
        return list(map(methodcaller("get", key, default), entries))


def replay_device(snapshot: Snapshot, device: int, max_points: int = MAX_POINTS) -> DeviceTimeline:
    """Replay one device's trace. Column-wise: each pass is a C-level map/accumulate over the entries."""
    entries = snapshot.device_traces[device] if device < len(snapshot.device_traces) else []
    n = len(entries)
    final_alloc, final_res, active, seg_addrs = _final_levels(snapshot, device)

    def odd(what: str) -> NotASnapshot:
        return NotASnapshot(f"{snapshot.source or 'snapshot'}: a trace entry of device {device} has {what}")

    actions = _column(entries, "action", None)
    sizes = _column(entries, "size", 0)
    try:
        counts = Counter(actions)
    except TypeError:
        raise odd("an odd action")
    if not all(map(isinstance, counts, repeat(str))):
        raise odd("an odd action")
    try:
        # signed sizes per action, as C-level map chains (no Python frame per entry)
        levels = array("q", accumulate(map(mul, map(_ALLOC_SIGN.get, actions, repeat(0)), sizes)))
        # reserved memory moves only at segment events (a few hundred): keep it sparse
        seg_idx = [
            i
            for a in (*_SEG_UP, *_SEG_DOWN)
            if a in counts
            for i in compress(range(n), map(a.__eq__, actions))
        ]
        seg_idx.sort()
        res_steps = list(accumulate(_RESERVE_SIGN[actions[i]] * sizes[i] for i in seg_idx))
    except (TypeError, OverflowError):
        raise odd("a non-integer size")

    cur_a = levels[-1] if n else 0
    cur_r = res_steps[-1] if res_steps else 0
    start_alloc = final_alloc - cur_a
    start_res = final_res - cur_r

    # peaks (relative to the start; the start itself counts)
    peak_a_rel, peak_a_i = (max(levels), 0) if n else (0, -1)
    if n:
        peak_a_i = levels.index(peak_a_rel)
        if peak_a_rel <= 0:
            peak_a_rel, peak_a_i = 0, -1
    peak_r_rel, peak_r_i = 0, -1
    if n:
        top = max(res_steps, default=0)
        if top > 0:
            peak_r_rel, peak_r_i = top, seg_idx[res_steps.index(top)]

    # the live set and what ended freed, from the last alloc / free per address
    alloc_idx = list(compress(range(n), map("alloc".__eq__, actions)))
    free_idx = list(compress(range(n), map("free_requested".__eq__, actions)))
    addrs = _column(entries, "addr", 0)
    if not set(map(type, addrs)) <= {int}:
        raise odd("an odd address")
    last_alloc = dict(zip(map(addrs.__getitem__, alloc_idx), alloc_idx, strict=True))
    last_free = dict(zip(map(addrs.__getitem__, free_idx), free_idx, strict=True))
    live = {a: i for a, i in last_alloc.items() if last_free.get(a, -1) < i}
    ended_freed = [a for a, i in last_free.items() if last_alloc.get(a, -1) < i]

    frames_of = list(map(methodcaller("get", "frames"), map(entries.__getitem__, alloc_idx)))
    by_stack: Counter[int] = Counter(map(id, filter(None, frames_of)))
    stacks: dict[int, list[dict[str, Any]]] = {id(f): f for f in frames_of if f}
    if not all(map(isinstance, stacks.values(), repeat(list))):
        raise odd("odd frames")

    oom_indices = [i for i, a in enumerate(actions) if a == "oom"] if "oom" in counts else []
    oom_index = oom_indices[-1] if oom_indices else -1
    stride = max(1, n // max_points)
    idx = sorted({*range(0, n, stride), *([n - 1] if n else []), *oom_indices})
    points = [
        TimelinePoint(
            i,
            entries[i].get("time_us"),
            levels[i] + start_alloc,
            _reserved_at(i, seg_idx, res_steps) + start_res,
        )
        for i in idx
    ]
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
    for addr, i in live.items():
        cons.checked_blocks += 1
        if active.get(addr) != sizes[i]:
            cons.mismatched_blocks += 1
    for addr in ended_freed:
        cons.checked_blocks += 1
        if addr in active:
            cons.mismatched_blocks += 1
    expandable = any(s.is_expandable for s in snapshot.segments if s.device == device)
    if not expandable and (counts.get("segment_alloc") or counts.get("segment_free")):
        seg_alloc_idx = list(compress(range(n), map("segment_alloc".__eq__, actions)))
        seg_free_idx = list(compress(range(n), map("segment_free".__eq__, actions)))
        seg_last_alloc = dict(
            zip(_column(list(map(entries.__getitem__, seg_alloc_idx)), "addr", 0), seg_alloc_idx, strict=True)
        )
        seg_last_free = dict(
            zip(_column(list(map(entries.__getitem__, seg_free_idx)), "addr", 0), seg_free_idx, strict=True)
        )
        for addr, i in seg_last_alloc.items():
            cons.checked_segments += 1
            if (seg_last_free.get(addr, -1) < i) != (addr in seg_addrs):
                cons.mismatched_segments += 1
        for addr in seg_last_free:
            if addr in seg_last_alloc:
                continue
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
        peak_allocated=peak_a_rel + start_alloc,
        peak_allocated_index=peak_a_i,
        peak_reserved=peak_r_rel + start_res,
        peak_reserved_index=peak_r_i,
        first_time_us=first_t,
        last_time_us=last_t,
        oom=oom,
        oom_count=len(oom_indices),
        actions={str(k): v for k, v in counts.items()},
        consistency=cons,
        live_alloc_index=live,
        alloc_count_by_stack=by_stack,
        alloc_indices=alloc_idx,
        stacks=stacks,
        raw=entries,
        levels=levels,
        action_column=actions,
        size_column=sizes,
    )


def replay(snapshot: Snapshot, max_points: int = MAX_POINTS) -> list[DeviceTimeline]:
    """One timeline per device that has segments or trace entries."""
    return [replay_device(snapshot, d, max_points) for d in snapshot.devices]
