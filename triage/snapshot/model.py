"""The normalised snapshot model, one shape for every era of `torch.cuda.memory._snapshot()`.

Eras (see the project's SNAPSHOT_FORMAT notes):
- ``legacy``: torch 2.0, blocks carry ``history: [{addr, real_size, frames}]`` and no ``address``;
- ``v2``: torch 2.1+, blocks carry ``address``/``frames``; traces may lack ``time_us``;
- ``v2025``: adds ``allocator_settings`` and ``external_annotations``;
- ``segments-only``: the list returned by ``torch.cuda.memory_snapshot()``.

Frames stay the shared dicts the loader produced (one object per distinct frame, as in the pickle's
memo), and trace entries stay the loader's dicts: a 1,000,000-entry trace is walked, never copied.
Accessors fill in what older eras leave out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RawFrame = dict[str, Any]
RawEntry = dict[str, Any]

ACTIONS = frozenset(
    {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
    }
)


def frame_fields(fr: RawFrame) -> tuple[str, str, int]:
    """(name, filename, line) of a frame, each of its own type: an untrusted file may put anything there,
    and what is not a string (or a line number) reads as unknown (``"??"``, 0)."""
    name, filename, line = fr.get("name"), fr.get("filename"), fr.get("line")
    return (
        name if isinstance(name, str) else "??",
        filename if isinstance(filename, str) else "??",
        line if isinstance(line, int) and not isinstance(line, bool) else 0,
    )


ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"


@dataclass(slots=True)
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    frames: list[RawFrame]
    segment: Segment | None = field(default=None, repr=False)

    @property
    def allocated(self) -> bool:
        return self.state == ACTIVE_ALLOCATED

    @property
    def active(self) -> bool:
        return self.state != INACTIVE


@dataclass(slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str
    pool_id: tuple[int, int]
    is_expandable: bool
    frames: list[RawFrame]
    blocks: list[Block]

    @property
    def pool(self) -> str:
        """`small`/`large` for the default pool, `private` for CUDA-graph / MemPool pools."""
        if self.pool_id != (0, 0):
            return "private"
        return self.segment_type


@dataclass(slots=True)
class TraceEntry:
    """A typed view of one trace entry (built on demand; the trace itself stays raw)."""

    index: int
    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None
    device_free: int | None
    frames: list[RawFrame]

    @classmethod
    def of(cls, index: int, e: RawEntry) -> TraceEntry:
        return cls(
            index=index,
            action=e.get("action", ""),
            addr=e.get("addr", 0),
            size=e.get("size", 0),
            stream=e.get("stream", 0),
            time_us=e.get("time_us"),
            device_free=e.get("device_free"),
            frames=e.get("frames") or [],
        )


@dataclass(slots=True)
class Snapshot:
    segments: list[Segment]
    device_traces: list[list[RawEntry]]
    allocator_settings: dict[str, Any]
    external_annotations: list[dict[str, Any]]
    era: str
    source: str = ""

    @property
    def devices(self) -> list[int]:
        devs = {s.device for s in self.segments}
        devs.update(i for i, t in enumerate(self.device_traces) if t)
        return sorted(devs)

    @property
    def trace_entries(self) -> int:
        return sum(len(t) for t in self.device_traces)

    @property
    def expandable_segments(self) -> bool:
        """Whether expandable segments are on: from the settings, else from the segments themselves."""
        value = self.allocator_settings.get("expandable_segments")
        if isinstance(value, bool):
            return value
        conf = str(self.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF", ""))
        if "expandable_segments:true" in conf.replace(" ", "").lower():
            return True
        return any(s.is_expandable for s in self.segments)

    def blocks(self) -> list[Block]:
        return [b for s in self.segments for b in s.blocks]
