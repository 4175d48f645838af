"""Exact memory accounting of a snapshot, per device and pool.

Definitions (the Diagnosis ``summary`` of DESIGN.md):
- reserved  = Σ segment ``total_size``
- allocated = Σ ``size`` of ``active_allocated`` blocks (rounded sizes, what the allocator hands out)
- requested = Σ ``requested_size`` of ``active_allocated`` blocks (legacy: ``history[0].real_size``);
  this is what torch's ``_memory_viz stats`` prints as ``total_allocated``
- active    = allocated + Σ ``size`` of ``active_pending_free`` blocks
- free_in_reserved = reserved − allocated; largest_free_block = the largest ``inactive`` block
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from triage.snapshot.model import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE, Snapshot


@dataclass(slots=True)
class Totals:
    reserved_bytes: int = 0
    allocated_bytes: int = 0
    requested_bytes: int = 0
    active_bytes: int = 0
    largest_free_block_bytes: int = 0
    segments: int = 0
    blocks: int = 0
    expandable_segments: int = 0
    private_pool_segments: int = 0
    private_pool_bytes: int = 0

    @property
    def free_in_reserved_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes

    def to_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["free_in_reserved_bytes"] = self.free_in_reserved_bytes
        return d


@dataclass(slots=True)
class Accounting:
    total: Totals
    by_device: dict[int, Totals] = field(default_factory=dict)
    by_pool: dict[tuple[int, str], Totals] = field(default_factory=dict)
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    expandable_segments_on: bool = False
    trace_entries: int = 0

    def summary(self) -> dict[str, int]:
        """The integer ``summary`` object of the Diagnosis (all devices)."""
        t = self.total
        return {
            "reserved_bytes": t.reserved_bytes,
            "allocated_bytes": t.allocated_bytes,
            "requested_bytes": t.requested_bytes,
            "active_bytes": t.active_bytes,
            "free_in_reserved_bytes": t.free_in_reserved_bytes,
            "largest_free_block_bytes": t.largest_free_block_bytes,
            "segments": t.segments,
            "blocks": t.blocks,
            "trace_entries": self.trace_entries,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.to_dict(),
            "by_device": {str(k): v.to_dict() for k, v in sorted(self.by_device.items())},
            "by_pool": {f"{d}/{p}": v.to_dict() for (d, p), v in sorted(self.by_pool.items())},
            "expandable_segments_on": self.expandable_segments_on,
            "allocator_settings": self.allocator_settings,
        }


def account(snapshot: Snapshot) -> Accounting:
    total = Totals()
    by_device: dict[int, Totals] = {}
    by_pool: dict[tuple[int, str], Totals] = {}
    for seg in snapshot.segments:
        dev = by_device.get(seg.device)
        if dev is None:
            dev = by_device[seg.device] = Totals()
        key = (seg.device, seg.pool)
        pool = by_pool.get(key)
        if pool is None:
            pool = by_pool[key] = Totals()
        reserved = seg.total_size
        allocated = requested = pending = largest = 0
        for b in seg.blocks:
            state = b.state
            if state == ACTIVE_ALLOCATED:
                allocated += b.size
                requested += b.requested_size
            elif state == ACTIVE_PENDING_FREE:
                pending += b.size
            elif state == INACTIVE and b.size > largest:
                largest = b.size
        nblocks = len(seg.blocks)
        private = seg.pool_id != (0, 0)
        for t in (total, dev, pool):
            t.reserved_bytes += reserved
            t.allocated_bytes += allocated
            t.requested_bytes += requested
            t.active_bytes += allocated + pending
            t.segments += 1
            t.blocks += nblocks
            if largest > t.largest_free_block_bytes:
                t.largest_free_block_bytes = largest
            if seg.is_expandable:
                t.expandable_segments += 1
            if private:
                t.private_pool_segments += 1
                t.private_pool_bytes += reserved
    return Accounting(
        total=total,
        by_device=by_device,
        by_pool=by_pool,
        allocator_settings=dict(snapshot.allocator_settings),
        expandable_segments_on=snapshot.expandable_segments,
        trace_entries=snapshot.trace_entries,
    )
