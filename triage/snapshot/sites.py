"""Live memory by allocation site: active blocks grouped by their innermost user-code frame.

A block's stack comes from the block itself (2.1+: ``frames``; 2.0: ``history[0].frames``), else
from the trace entry that allocated it when the trace still holds that entry. Ages come from the
trace: the entry index and ``time_us`` of each surviving block's allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triage.snapshot.frames import UNKNOWN_SITE, FrameClassifier, Site
from triage.snapshot.model import ACTIVE_ALLOCATED, Snapshot
from triage.snapshot.timeline import DeviceTimeline


@dataclass
class SiteStats:
    site: Site
    bytes: int = 0
    requested_bytes: int = 0
    count: int = 0
    sizes: dict[int, int] = field(default_factory=dict, repr=False)  # live blocks by block size
    devices: set[int] = field(default_factory=set)
    # surviving blocks whose allocation is in the trace
    traced: int = 0
    first_index: int | None = None
    last_index: int | None = None
    first_time_us: int | None = None
    last_time_us: int | None = None
    # allocations made at this site anywhere in the trace (surviving or not)
    allocs_in_trace: int = 0
    trace_entries: int = 0
    stack: list[dict[str, Any]] = field(default_factory=list, repr=False)
    alloc_indices: list[int] = field(default_factory=list, repr=False)

    @property
    def index_spread(self) -> float:
        """The fraction of the trace between the first and the last surviving allocation (0..1)."""
        if self.first_index is None or self.last_index is None or self.trace_entries <= 1:
            return 0.0
        return (self.last_index - self.first_index) / (self.trace_entries - 1)

    def to_dict(self, classifier: FrameClassifier | None = None) -> dict[str, Any]:
        stack = (classifier or FrameClassifier()).user_stack(self.stack, limit=16)
        return {
            "site": self.site.to_dict() | {"kind": self.site.kind, "label": self.site.label},
            "bytes": self.bytes,
            "requested_bytes": self.requested_bytes,
            "blocks": self.count,
            "devices": sorted(self.devices),
            "traced_blocks": self.traced,
            "first_index": self.first_index,
            "last_index": self.last_index,
            "first_time_us": self.first_time_us,
            "last_time_us": self.last_time_us,
            "allocs_in_trace": self.allocs_in_trace,
            "stack": stack,
        }


def live_sites(
    snapshot: Snapshot,
    timelines: list[DeviceTimeline],
    classifier: FrameClassifier | None = None,
) -> list[SiteStats]:
    """Every allocation site with live (``active_allocated``) memory, largest first: one entry per site
    and device (each device is its own memory, and its trace its own sequence of entry indices)."""
    cls = classifier or FrameClassifier()
    by_dev = {t.device: t for t in timelines}
    stats: dict[tuple[Site, int], SiteStats] = {}
    for seg in snapshot.segments:
        tl = by_dev.get(seg.device)
        live_idx = tl.live_alloc_index if tl is not None else {}
        raw = tl.raw if tl is not None else []
        for b in seg.blocks:
            if b.state != ACTIVE_ALLOCATED:
                continue
            frames = b.frames
            idx = live_idx.get(b.address)
            entry = raw[idx] if idx is not None else None
            if not frames and entry is not None:
                frames = entry.get("frames") or []
            site = cls.site(frames) if frames else UNKNOWN_SITE
            st = stats.get((site, seg.device))
            if st is None:
                st = stats[(site, seg.device)] = SiteStats(site=site, stack=frames)
                st.trace_entries = tl.entries if tl is not None else 0
            st.bytes += b.size
            st.requested_bytes += b.requested_size
            st.count += 1
            st.sizes[b.size] = st.sizes.get(b.size, 0) + 1
            st.devices.add(seg.device)
            if idx is not None and entry is not None:
                st.traced += 1
                st.alloc_indices.append(idx)
                if st.first_index is None or idx < st.first_index:
                    st.first_index = idx
                if st.last_index is None or idx > st.last_index:
                    st.last_index = idx
                t = entry.get("time_us")
                if isinstance(t, int):
                    if st.first_time_us is None or t < st.first_time_us:
                        st.first_time_us = t
                    if st.last_time_us is None or t > st.last_time_us:
                        st.last_time_us = t
    # allocations per site over the whole trace (stacks are shared objects: classify each once)
    for tl in timelines:
        for key, count in tl.alloc_count_by_stack.items():
            site = cls.site(tl.stacks[key])
            st = stats.get((site, tl.device))
            if st is not None:
                st.allocs_in_trace += count
    for st in stats.values():
        st.alloc_indices.sort()
    return sorted(stats.values(), key=lambda s: (-s.bytes, s.site.label, min(s.devices)))
