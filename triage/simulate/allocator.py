"""A model of torch's ``CUDACachingAllocator`` for one device (standard library only).

It follows the arithmetic of ``c10/cuda/CUDACachingAllocator.cpp`` (SNAPSHOT_FORMAT §3):

- request rounding: < 512 B -> 512, else up to a multiple of 512;
- pools: a rounded size <= 1 MiB goes to the small pool, else to the large pool;
- segment size on a cache miss: <= 1 MiB -> 2 MiB, < 10 MiB -> 20 MiB, else rounded up to 2 MiB;
- best fit among the cached free blocks of the same stream and pool (``max_split_size`` refuses
  oversize blocks for smaller requests and much larger blocks for oversize requests);
- split when the remainder is >= 512 B (small pool, or expandable segments) or > 1 MiB (large pool,
  request below ``max_split_size``); the allocated part keeps the lower address;
- a freed block merges with its free neighbours;
- on a device-allocation failure: release oversize cached blocks (``max_split_size`` only), then
  every cached unsplit segment (``segment_free`` entries, ``num_alloc_retries`` += 1), retry, then
  record the ``oom`` trace entry, ``num_ooms`` += 1, call the observer and raise the torch 2.2+
  message (§4.3);
- a per-process fraction cap rejects when reserved + segment > cap, without asking the device;
- expandable segments: one virtual range per (stream, pool) growing by 2 MiB (small) / 20 MiB
  (large) pages with ``segment_map``/``segment_unmap`` entries, reported as one ``is_expandable``
  segment per mapped range.

The device is modelled as ``total_bytes`` minus the memory of other processes and this process's
non-PyTorch overhead (CUDA context); what remains is what ``cudaMalloc`` can hand out.

:meth:`CachingAllocator.snapshot` returns torch 2.13's ``_snapshot()`` dict (or the torch 2.0
layout with ``legacy=True``); :meth:`CachingAllocator.memory_stats` uses ``torch.cuda.memory_stats()``
key names. Frame lists passed to :meth:`malloc`/:meth:`free` are stored by reference, so a caller that
reuses frame dicts and frame lists gets the sharing real pickles have.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Iterable
from typing import Any

from triage.units import GiB, MiB, format_bytes

MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1 * MiB  # kSmallSize: largest "small" allocation
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size for small allocations
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for allocations in (1 MiB, 10 MiB)
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge

Frame = dict[str, Any]
FrameList = list[Frame]

# The one empty frame list every "no stack" place refers to (never mutated).
EMPTY_FRAMES: FrameList = []

DOCS_URL = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"
NVML_ASSERT_MESSAGE = (
    'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":1127, '
    "please report a bug to PyTorch. "
)
_POWER2_KEYS = [str(1 << i) for i in range(16)]
_STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_POOL_NAMES = ("all", "small_pool", "large_pool")


def round_size(size: int) -> int:
    """The allocator's request rounding (no ``roundup_power2_divisions``)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """Pool choice for a rounded size: small pool when <= 1 MiB."""
    return rounded <= SMALL_SIZE


def allocation_size(rounded: int) -> int:
    """Segment size ``cudaMalloc`` is asked for on a cache miss ("Tried to allocate" shows this)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


format_size = format_bytes  # c10's format_size, one definition in triage.units


def oom_message(
    *,
    alloc_size: int,
    device: int,
    total_bytes: int,
    free_bytes: int,
    processes: Iterable[tuple[int, int, bool]] = (),
    allowed_bytes: int | None = None,
    allocated_bytes: int,
    reserved_bytes: int,
    private_pool_bytes: int = 0,
) -> str:
    """torch 2.2+ ``OutOfMemoryError`` text (SNAPSHOT_FORMAT §4.3).

    ``processes`` are NVML's ``(pid, used_bytes, is_self)``; ``is_self`` prints the
    "Including non-PyTorch memory, this process" form (NVML pid == getpid()).
    """
    proc_info = ""
    for pid, used, is_self in processes:
        who = "Including non-PyTorch memory, this process" if is_self else f"Process {pid}"
        proc_info += f"{who} has {format_size(used)} memory in use. "
    allowed_info = f"{format_size(allowed_bytes)} allowed; " if allowed_bytes is not None else ""
    private = (
        f"with {format_size(private_pool_bytes)} allocated in private pools (e.g., CUDA Graphs), "
        if private_pool_bytes
        else ""
    )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU {device} has a total "
        f"capacity of {format_size(total_bytes)} of which {format_size(free_bytes)} is free. "
        f"{proc_info}{allowed_info}Of the allocated memory "
        f"{format_size(allocated_bytes + private_pool_bytes)} is allocated by PyTorch, {private}and "
        f"{format_size(reserved_bytes - allocated_bytes - private_pool_bytes)} is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        f"for Memory Management  ({DOCS_URL})"
    )


class SimulatedOOM(RuntimeError):
    """What ``torch.OutOfMemoryError`` would carry: the message and the observer's four ints."""

    def __init__(
        self,
        message: str,
        *,
        device: int,
        requested_size: int,
        rounded_size: int,
        alloc_size: int,
        total_or_cap: int,
        device_free: int,
        stream: int,
        observer: tuple[int, int, int, int] | None,
        frames: FrameList,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.device = device
        self.requested_size = requested_size
        self.rounded_size = rounded_size
        self.alloc_size = alloc_size
        self.total_or_cap = total_or_cap
        self.device_free = device_free
        self.stream = stream
        self.observer = observer
        self.frames = frames


class _Seg:
    __slots__ = ("addr", "expandable", "frames", "head", "page", "size", "small", "stream")

    def __init__(
        self, addr: int, size: int, stream: int, small: bool, frames: FrameList, expandable: bool
    ) -> None:
        self.addr = addr
        self.size = size  # cudaMalloc'd bytes, or the virtual size of an expandable segment
        self.stream = stream
        self.small = small
        self.frames = frames
        self.expandable = expandable
        self.page = SMALL_BUFFER if small else LARGE_BUFFER
        self.head: _Block | None = None


class _Block:
    __slots__ = ("addr", "allocated", "frames", "mapped", "next", "prev", "requested", "seg", "size")

    def __init__(self, addr: int, size: int, seg: _Seg, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.seg = seg
        self.requested = 0
        self.allocated = False
        self.mapped = mapped
        self.frames: FrameList = EMPTY_FRAMES
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _VASpace:
    """Device virtual addresses: top-down first fit over 2 MiB-aligned ranges, like cudaMalloc."""

    def __init__(self, base: int, size: int) -> None:
        self._free: list[list[int]] = [[base, size]]  # sorted [start, size]

    def alloc(self, size: int) -> int:
        for i in range(len(self._free) - 1, -1, -1):
            start, n = self._free[i]
            if n >= size:
                addr = start + n - size
                if n == size:
                    del self._free[i]
                else:
                    self._free[i][1] = n - size
                return addr
        raise MemoryError("virtual address space exhausted")

    def free(self, addr: int, size: int) -> None:
        starts = [r[0] for r in self._free]
        i = bisect.bisect_left(starts, addr)
        self._free.insert(i, [addr, size])
        if i + 1 < len(self._free) and addr + size == self._free[i + 1][0]:
            self._free[i][1] += self._free[i + 1][1]
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == addr:
            self._free[i - 1][1] += self._free[i][1]
            del self._free[i]


class CachingAllocator:
    """torch's CUDA caching allocator for one device, with history recording and snapshots."""

    def __init__(
        self,
        device: int = 0,
        total_bytes: int = 80 * GiB,
        *,
        other_process_bytes: int = 0,
        other_processes: list[dict[str, Any]] | None = None,
        fraction_cap_bytes: int | None = None,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
        record_history: bool = True,
        max_entries: int | None = None,
        record_frames: bool = True,
        start_time_us: int | None = None,
        rng: random.Random | None = None,
        seed: int = 0,
        device_name: str = "NVIDIA A100-SXM4-80GB",
        context_bytes: int = 500 * MiB,
        pid: int | None = None,
        own_process_label: str = "pid",
        nvml_lists_processes: bool = True,
        num_devices: int = 1,
        nvml_fails: bool = False,
        alloc_conf: str | None = None,
    ) -> None:
        if max_split_size is not None and max_split_size < LARGE_BUFFER:
            raise ValueError("max_split_size must be at least 20 MiB (torch's lower bound)")
        if not 0 <= device < num_devices:
            raise ValueError("device must be below num_devices")
        self.rng = rng if rng is not None else random.Random(seed)
        self.device = device
        self.num_devices = num_devices
        self.device_name = device_name
        self.total_bytes = total_bytes
        self.context_bytes = context_bytes
        self.pid = pid if pid is not None else self.rng.randrange(1000, 4_000_000)
        self.own_process_label = own_process_label
        self.nvml_lists_processes = nvml_lists_processes
        # Other processes on the device, as NVML lists them: {pid, used_bytes, name, visible}.
        self.other_processes: list[dict[str, Any]] = [dict(p) for p in (other_processes or [])]
        if other_process_bytes and not self.other_processes:
            self.other_processes.append(
                {
                    "pid": self.rng.randrange(1000, 4_000_000),
                    "used_bytes": other_process_bytes,
                    "name": "python3",
                }
            )
        self.fraction_cap_bytes = fraction_cap_bytes
        self.expandable_segments = expandable_segments
        self.max_split_size = max_split_size
        self.record_history = record_history
        self.record_frames = record_frames and record_history
        self.max_entries = max_entries
        self.nvml_fails = nvml_fails
        self.alloc_conf = alloc_conf
        self.now_us = (
            start_time_us
            if start_time_us is not None
            else 1_767_225_600_000_000 + self.rng.randrange(0, 180 * 86_400) * 1_000_000
        )
        self._trace: deque[dict[str, Any]] | list[dict[str, Any]] = (
            deque(maxlen=max_entries) if max_entries is not None else []
        )
        base = 0x7F00_0000_0000 + self.rng.randrange(0, 4096) * 64 * GiB // 64
        base -= base % (2 * MiB)
        self._va = _VASpace(base, 16384 * GiB)
        self._segments: dict[int, _Seg] = {}
        self._allocated: dict[int, _Block] = {}
        self._pools: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self._free: dict[int, _Block] = {}
        self._unmapped: dict[tuple[int, bool], list[_Block]] = {}
        self._stats: dict[str, list[list[int]]] = {
            name: [[0, 0, 0, 0] for _ in range(3)] for name in _STAT_NAMES
        }
        self.reserved = 0
        self.allocated_bytes = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_oom_rejections = 0
        self.last_oom: SimulatedOOM | None = None
        # Optional record of every device-allocation attempt (scenario calibration), and a caller tag.
        self.device_alloc_log: list[dict[str, Any]] | None = None
        self.tag: Any = None

    # ----------------------------------------------------------------- device
    @property
    def other_process_bytes(self) -> int:
        return sum(int(p["used_bytes"]) for p in self.other_processes)

    @property
    def capacity_bytes(self) -> int:
        """What this process's cudaMalloc could ever get: total - neighbours - own overhead."""
        return self.total_bytes - self.other_process_bytes - self.context_bytes

    def device_free_bytes(self) -> int:
        """What ``cudaMemGetInfo`` reports free now."""
        return max(0, self.capacity_bytes - self.reserved)

    def nvml_processes(self) -> list[dict[str, Any]]:
        """NVML's compute-process list for the device, sorted by pid (this process included)."""
        if not self.nvml_lists_processes:
            return []
        procs: list[dict[str, Any]] = [
            {
                "pid": self.pid,
                "used_bytes": self.reserved + self.context_bytes,
                "name": "python",
                "self": True,
            }
        ]
        for p in self.other_processes:
            if p.get("visible", True):
                procs.append(
                    {
                        "pid": int(p["pid"]),
                        "used_bytes": int(p["used_bytes"]),
                        "name": p.get("name", "python3"),
                        "self": False,
                    }
                )
        procs.sort(key=lambda p: int(p["pid"]))
        return procs

    def advance(self, us: int) -> None:
        """Let time pass (kernels running between allocator calls)."""
        self.now_us += max(0, int(us))

    # ----------------------------------------------------------------- stats
    def _inc(self, name: str, small: bool, n: int) -> None:
        arr = self._stats[name]
        for s in (arr[0], arr[1 if small else 2]):
            s[0] += n
            s[2] += n
            if s[0] > s[1]:
                s[1] = s[0]

    def _dec(self, name: str, small: bool, n: int) -> None:
        arr = self._stats[name]
        for s in (arr[0], arr[1 if small else 2]):
            s[0] -= n
            s[3] += n

    def _isplit_add(self, b: _Block) -> None:
        if b.mapped and not b.allocated and (b.prev is not None or b.next is not None):
            self._inc("inactive_split", b.seg.small, 1)
            self._inc("inactive_split_bytes", b.seg.small, b.size)

    def _isplit_sub(self, b: _Block) -> None:
        if b.mapped and not b.allocated and (b.prev is not None or b.next is not None):
            self._dec("inactive_split", b.seg.small, 1)
            self._dec("inactive_split_bytes", b.seg.small, b.size)

    def reset_peak_stats(self) -> None:
        for arr in self._stats.values():
            for s in arr:
                s[1] = s[0]

    def memory_stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()`` for this device (flattened keys, sorted)."""
        out: dict[str, int] = {}
        for name, arr in self._stats.items():
            for pool, s in zip(_POOL_NAMES, arr, strict=True):
                out[f"{name}.{pool}.current"] = s[0]
                out[f"{name}.{pool}.peak"] = s[1]
                out[f"{name}.{pool}.allocated"] = s[2]
                out[f"{name}.{pool}.freed"] = s[3]
        for k in ("current", "peak", "allocated", "freed"):
            out[f"oversize_allocations.{k}"] = 0
            out[f"oversize_segments.{k}"] = 0
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_sync_all_streams"] = 0
        out["max_split_size"] = self.max_split_size if self.max_split_size is not None else -1
        return dict(sorted(out.items()))

    def stat(self, key: str) -> int:
        """One ``memory_stats()`` value, e.g. ``allocated_bytes.all.peak``."""
        name, pool, field = key.split(".")
        return self._stats[name][_POOL_NAMES.index(pool)][
            ("current", "peak", "allocated", "freed").index(field)
        ]

    # ----------------------------------------------------------------- trace
    def _ctx(self, frames: FrameList | None) -> FrameList:
        if not self.record_frames or frames is None:
            return EMPTY_FRAMES
        return frames

    def _tick(self) -> None:
        self.now_us += 1 + (self.rng.getrandbits(3))

    def _record(self, action: str, addr: int, size: int, stream: int, frames: FrameList) -> None:
        if not self.record_history:
            return
        key = "device_free" if action == "oom" else "addr"
        self._trace.append(
            {
                "action": action,
                key: addr,
                "size": size,
                "stream": stream,
                "time_us": self.now_us,
                "frames": frames,
                "compile_context": "N/A",
                "user_metadata": "",
            }
        )

    @property
    def trace(self) -> list[dict[str, Any]]:
        return list(self._trace)

    # ----------------------------------------------------------------- pools
    def _pool_add(self, b: _Block) -> None:
        key = (b.seg.stream, b.seg.small)
        lst = self._pools.get(key)
        if lst is None:
            lst = self._pools[key] = []
        bisect.insort(lst, (b.size, b.addr))
        self._free[b.addr] = b

    def _pool_remove(self, b: _Block) -> None:
        lst = self._pools[(b.seg.stream, b.seg.small)]
        i = bisect.bisect_left(lst, (b.size, b.addr))
        if i >= len(lst) or lst[i] != (b.size, b.addr):  # pragma: no cover - invariant
            raise AssertionError("free block missing from its pool")
        del lst[i]
        del self._free[b.addr]

    def _should_split(self, b: _Block, size: int) -> bool:
        remaining = b.size - size
        if b.seg.small or self.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        below_max = self.max_split_size is None or size < self.max_split_size
        return below_max and remaining > SMALL_SIZE

    def _get_free_block(self, stream: int, small: bool, size: int) -> _Block | None:
        lst = self._pools.get((stream, small))
        if not lst:
            return None
        i = bisect.bisect_left(lst, (size, -1))
        if i >= len(lst):
            return None
        b = self._free[lst[i][1]]
        if b.seg.expandable and self.expandable_segments:
            # best fit counts an expandable block as the size it can grow to
            def grow(x: _Block) -> int:
                nxt = x.next
                return x.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

            j = i + 1
            while b.seg.expandable and j < len(lst):
                nb = self._free[lst[j][1]]
                if grow(nb) < grow(b):
                    b = nb
                    j += 1
                else:
                    break
        mss = self.max_split_size
        if mss is not None:
            if size < mss and b.size >= mss:
                return None
            if size >= mss and b.size >= size + LARGE_BUFFER:
                return None
        self._pool_remove(b)
        return b

    # ----------------------------------------------------------------- malloc
    def malloc(self, size: int, frames: FrameList | None = None, stream: int = 0) -> int:
        """Allocate ``size`` bytes; returns the block address or raises :class:`SimulatedOOM`."""
        if size < 0:
            raise ValueError("negative size")
        ctx = self._ctx(frames)
        self._tick()
        rounded = round_size(size)
        small = is_small(rounded)
        alloc_size = allocation_size(rounded)
        block = self._get_free_block(stream, small, rounded)
        if block is None:
            block = self._alloc_block(stream, small, rounded, alloc_size, ctx, retry=False)
            if block is None and self._release_available_cached_blocks(stream, small, rounded, ctx):
                block = self._alloc_block(stream, small, rounded, alloc_size, ctx, retry=False)
            if block is None:
                self._release_cached_blocks(ctx)
                block = self._alloc_block(stream, small, rounded, alloc_size, ctx, retry=True)
            if block is None:
                self._raise_oom(stream, size, rounded, alloc_size, ctx)
        assert block is not None
        return self._alloc_found_block(block, size, rounded, ctx)

    def _alloc_found_block(self, b: _Block, orig: int, size: int, frames: FrameList) -> int:
        seg = b.seg
        self._isplit_sub(b)
        if self._should_split(b, size):
            rem = _Block(b.addr + size, b.size - size, seg)
            rem.prev = b
            rem.next = b.next
            if b.next is not None:
                b.next.prev = rem
            b.next = rem
            b.size = size
            self._pool_add(rem)
            self._isplit_add(rem)
        b.allocated = True
        b.requested = orig
        b.frames = frames
        self._allocated[b.addr] = b
        self.allocated_bytes += b.size
        small = seg.small
        self._inc("allocation", small, 1)
        self._inc("allocated_bytes", small, b.size)
        self._inc("active", small, 1)
        self._inc("active_bytes", small, b.size)
        self._inc("requested_bytes", small, orig)
        self._record("alloc", b.addr, orig, seg.stream, frames)
        return b.addr

    def _alloc_block(
        self, stream: int, small: bool, size: int, alloc_size: int, frames: FrameList, *, retry: bool
    ) -> _Block | None:
        if retry:
            self.num_alloc_retries += 1
        if self.device_alloc_log is not None:
            self.device_alloc_log.append(self._alloc_event(stream, small, size, alloc_size, retry))
        cap = self.fraction_cap_bytes
        if cap is not None and self.reserved + alloc_size > cap:
            self.num_oom_rejections += 1
            return None
        if self.expandable_segments:
            return self._try_allocate_expandable(stream, small, size, frames)
        if alloc_size > self.device_free_bytes():
            return None
        addr = self._va.alloc(alloc_size)
        seg = _Seg(addr, alloc_size, stream, small, frames, expandable=False)
        b = _Block(addr, alloc_size, seg)
        seg.head = b
        self._segments[addr] = seg
        self.reserved += alloc_size
        self.num_device_alloc += 1
        self._inc("segment", small, 1)
        self._inc("reserved_bytes", small, alloc_size)
        self._record("segment_alloc", addr, alloc_size, stream, frames)
        return b

    def _alloc_event(
        self, stream: int, small: bool, size: int, alloc_size: int, retry: bool
    ) -> dict[str, Any]:
        unsplit = 0
        largest_other = largest_same = largest_other_stream = largest_large_same = 0
        for (s, sm), lst in self._pools.items():
            for bsize, addr in lst:
                b = self._free[addr]
                if b.prev is None and b.next is None and not b.seg.expandable:
                    unsplit += bsize
            if lst:
                top = lst[-1][0]
                if (s, sm) == (stream, small):
                    largest_same = max(largest_same, top)
                else:
                    largest_other = max(largest_other, top)
                if s != stream:
                    largest_other_stream = max(largest_other_stream, top)
                elif not sm:
                    largest_large_same = max(largest_large_same, top)
        return {
            "index": len(self.device_alloc_log or ()),
            "tag": self.tag,
            "reserved": self.reserved,
            "allocated": self.allocated_bytes,
            "size": size,
            "alloc_size": alloc_size,
            "small": small,
            "stream": stream,
            "retry": retry,
            "unsplit_free": unsplit,
            "largest_free_same": largest_same,
            "largest_free_other": largest_other,
            "largest_free_other_stream": largest_other_stream,
            "largest_free_large_same_stream": largest_large_same,
        }

    def _release_block(self, b: _Block, frames: FrameList) -> None:
        """cudaFree a whole cached segment."""
        seg = b.seg
        self._pool_remove(b)
        del self._segments[seg.addr]
        self._va.free(seg.addr, seg.size)
        self.reserved -= seg.size
        self.num_device_free += 1
        self._dec("segment", seg.small, 1)
        self._dec("reserved_bytes", seg.small, seg.size)
        self._record("segment_free", seg.addr, seg.size, seg.stream, frames or seg.frames)

    def _release_available_cached_blocks(
        self, stream: int, small: bool, size: int, frames: FrameList
    ) -> bool:
        """With ``max_split_size``: free oversize cached segments, largest first."""
        mss = self.max_split_size
        if mss is None:
            return False
        lst = self._pools.get((stream, small))
        if not lst:
            return False
        key = max(size, mss)
        i = bisect.bisect_left(lst, (key, -1))
        if i < len(lst) and not self._free[lst[i][1]].seg.expandable:
            self._release_block(self._free[lst[i][1]], frames)
            return True
        released = 0
        j = i - 1
        while j >= 0 and released < key:
            b = self._free[lst[j][1]]
            if b.size < mss:
                break
            if not b.seg.expandable and b.prev is None and b.next is None:
                released += b.size
                self._release_block(b, frames)
            j -= 1
        return released >= key

    def _release_cached_blocks(self, frames: FrameList) -> None:
        """``release_cached_blocks``: free every cached unsplit segment, unmap free expandable pages."""
        for small in (False, True):
            to_unmap: list[_Block] = []
            for key in sorted(k for k in self._pools if k[1] == small):
                for _size, addr in list(self._pools[key]):
                    b = self._free[addr]
                    if b.seg.expandable:
                        to_unmap.append(b)
                    elif b.prev is None and b.next is None:
                        self._release_block(b, frames)
            for b in to_unmap:
                self._unmap_block(b, frames)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``."""
        self._tick()
        self._release_cached_blocks(EMPTY_FRAMES)

    def _raise_oom(self, stream: int, orig: int, rounded: int, alloc_size: int, frames: FrameList) -> None:
        free = self.device_free_bytes()
        cap = self.fraction_cap_bytes
        total_or_cap = cap if cap is not None else self.total_bytes

        def oom(message: str, observer: tuple[int, int, int, int] | None) -> SimulatedOOM:
            self.last_oom = SimulatedOOM(
                message,
                device=self.device,
                requested_size=orig,
                rounded_size=rounded,
                alloc_size=alloc_size,
                total_or_cap=total_or_cap,
                device_free=free,
                stream=stream,
                observer=observer,
                frames=frames,
            )
            return self.last_oom

        if self.nvml_fails:
            raise oom(NVML_ASSERT_MESSAGE, None)
        self._record("oom", free, rounded, stream, frames)
        self.num_ooms += 1
        procs = [
            (p["pid"], p["used_bytes"], p["self"] and self.own_process_label == "self")
            for p in self.nvml_processes()
        ]
        msg = oom_message(
            alloc_size=alloc_size,
            device=self.device,
            total_bytes=self.total_bytes,
            free_bytes=free,
            processes=procs,
            allowed_bytes=cap,
            allocated_bytes=self.allocated_bytes,
            reserved_bytes=self.reserved,
        )
        raise oom(msg, (self.device, alloc_size, total_or_cap, free))

    # ----------------------------------------------------------------- free
    def free(self, addr: int, frames: FrameList | None = None) -> None:
        """Free the block at ``addr`` (``free_requested`` then ``free_completed``)."""
        b = self._allocated.pop(addr, None)
        if b is None:
            raise ValueError(f"free of unknown address {addr:#x}")
        ctx = self._ctx(frames)
        self._tick()
        seg = b.seg
        small = seg.small
        self._record("free_requested", addr, b.requested, seg.stream, ctx)
        self._record("free_completed", addr, b.requested, seg.stream, ctx)
        self.allocated_bytes -= b.size
        self._dec("allocation", small, 1)
        self._dec("allocated_bytes", small, b.size)
        self._dec("active", small, 1)
        self._dec("active_bytes", small, b.size)
        self._dec("requested_bytes", small, b.requested)
        b.allocated = False
        b.frames = EMPTY_FRAMES
        self._merge_free(b)
        self._pool_add(b)
        self._isplit_add(b)

    def _merge_free(self, b: _Block) -> None:
        """Absorb free neighbours with the same mapping state (b is not in the pool)."""
        p = b.prev
        if p is not None and not p.allocated and p.mapped == b.mapped:
            if p.mapped:
                self._isplit_sub(p)
                self._pool_remove(p)
            else:
                self._unmapped_remove(p)
            b.addr = p.addr
            b.size += p.size
            b.prev = p.prev
            if b.prev is not None:
                b.prev.next = b
            else:
                b.seg.head = b
        n = b.next
        if n is not None and not n.allocated and n.mapped == b.mapped:
            if n.mapped:
                self._isplit_sub(n)
                self._pool_remove(n)
            else:
                self._unmapped_remove(n)
            b.size += n.size
            b.next = n.next
            if b.next is not None:
                b.next.prev = b

    # ----------------------------------------------------------------- expandable segments
    def _unmapped_add(self, b: _Block) -> None:
        self._unmapped.setdefault((b.seg.stream, b.seg.small), []).append(b)

    def _unmapped_remove(self, b: _Block) -> None:
        self._unmapped[(b.seg.stream, b.seg.small)].remove(b)

    def _find_expandable_block(self, stream: int, small: bool, size: int) -> _Block:
        def allocatable(x: _Block | None) -> bool:
            return x is not None and not x.allocated

        def has_space(x: _Block | None) -> bool:
            n = 0
            while n < size and x is not None and allocatable(x):
                n += x.size
                x = x.next
            return n >= size

        for c in sorted(self._unmapped.get((stream, small), []), key=lambda x: (x.size, x.addr)):
            cand = c.prev if allocatable(c.prev) else c
            if has_space(cand):
                assert cand is not None
                return cand
        page = SMALL_BUFFER if small else LARGE_BUFFER
        va = self.total_bytes + self.total_bytes // 8
        va = page * ((va + page - 1) // page)
        addr = self._va.alloc(va)
        seg = _Seg(addr, va, stream, small, EMPTY_FRAMES, expandable=True)
        b = _Block(addr, va, seg, mapped=False)
        seg.head = b
        self._segments[addr] = seg
        self._unmapped_add(b)
        return b

    def _map_block(self, to_map: _Block, size: int, frames: FrameList) -> _Block | None:
        seg = to_map.seg
        size = seg.page * ((size + seg.page - 1) // seg.page)
        size = min(size, to_map.size)
        if size > self.device_free_bytes():
            return None
        self._unmapped_remove(to_map)
        if to_map.size > size:
            rest = _Block(to_map.addr + size, to_map.size - size, seg, mapped=False)
            rest.prev = to_map
            rest.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            to_map.size = size
            self._unmapped_add(rest)
        to_map.mapped = True
        addr = to_map.addr
        if seg.frames is EMPTY_FRAMES:
            seg.frames = frames
        self._merge_free(to_map)
        self._pool_add(to_map)
        self._isplit_add(to_map)
        self.reserved += size
        self.num_device_alloc += 1
        self._inc("reserved_bytes", seg.small, size)
        self._record("segment_map", addr, size, seg.stream, frames)
        return to_map

    def _try_allocate_expandable(
        self, stream: int, small: bool, size: int, frames: FrameList
    ) -> _Block | None:
        cand: _Block | None = self._find_expandable_block(stream, small, size)
        assert cand is not None
        if not cand.mapped:
            cand = self._map_block(cand, min(cand.size, size), frames)
            if cand is None:
                return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None and not nxt.mapped
            mapped = self._map_block(nxt, min(size - cand.size, nxt.size), frames)
            if mapped is None:
                return None
            cand = mapped
        # out of the pool but still counted as inactive split: _alloc_found_block settles that
        self._pool_remove(cand)
        return cand

    def _unmap_block(self, b: _Block, frames: FrameList) -> None:
        seg = b.seg
        page = seg.page
        off = b.addr - seg.addr
        begin = seg.addr + page * ((off + page - 1) // page)
        end = seg.addr + page * ((off + b.size) // page)
        if end <= begin:
            return
        self._isplit_sub(b)
        self._pool_remove(b)
        before = begin - b.addr
        after = b.addr + b.size - end
        mid = b
        if before > 0:
            head = _Block(b.addr, before, seg)
            head.prev = b.prev
            if b.prev is not None:
                b.prev.next = head
            else:
                seg.head = head
            head.next = b
            b.prev = head
            b.addr = begin
            b.size -= before
        if after > 0:
            tail = _Block(end, after, seg)
            tail.next = b.next
            if b.next is not None:
                b.next.prev = tail
            tail.prev = b
            b.next = tail
            b.size -= after
        mid.mapped = False
        mid.requested = 0
        if before > 0 and mid.prev is not None:
            self._pool_add(mid.prev)
            self._isplit_add(mid.prev)
        if after > 0 and mid.next is not None:
            self._pool_add(mid.next)
            self._isplit_add(mid.next)
        self._merge_free(mid)
        self._unmapped_add(mid)
        self.reserved -= end - begin
        self.num_device_free += 1
        self._dec("reserved_bytes", seg.small, end - begin)
        self._record("segment_unmap", begin, end - begin, seg.stream, frames or seg.frames)
        if mid.prev is None and mid.next is None:  # the whole range is unmapped: give back the VA
            self._unmapped_remove(mid)
            del self._segments[seg.addr]
            self._va.free(seg.addr, seg.size)

    # ----------------------------------------------------------------- introspection
    def live_blocks(self) -> dict[int, tuple[int, int]]:
        """address -> (size, requested_size) of every allocated block."""
        return {a: (b.size, b.requested) for a, b in self._allocated.items()}

    def largest_free_block(self, stream: int | None = None) -> int:
        best = 0
        for (s, _small), lst in self._pools.items():
            if lst and (stream is None or s == stream):
                best = max(best, lst[-1][0])
        return best

    def frames_of(self, addr: int) -> FrameList:
        return self._allocated[addr].frames

    # ----------------------------------------------------------------- snapshot
    def _segment_runs(self) -> list[tuple[_Seg, list[_Block]]]:
        runs: list[tuple[_Seg, list[_Block]]] = []
        for seg in self._segments.values():
            b = seg.head
            cur: list[_Block] = []
            while b is not None:
                if b.mapped:
                    cur.append(b)
                elif cur:
                    runs.append((seg, cur))
                    cur = []
                b = b.next
            if cur:
                runs.append((seg, cur))
        runs.sort(key=lambda r: r[1][0].addr)
        return runs

    def allocator_settings(self) -> dict[str, Any]:
        conf = self.alloc_conf
        if conf is None:
            parts = []
            if self.expandable_segments:
                parts.append("expandable_segments:True")
            if self.max_split_size is not None:
                parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
            conf = ",".join(parts)
        return {
            "PYTORCH_CUDA_ALLOC_CONF": conf,
            "max_split_size": self.max_split_size if self.max_split_size is not None else -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": self.expandable_segments,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {k: 0 for k in _POWER2_KEYS},
        }

    def snapshot(self, legacy: bool = False) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()`` (torch 2.13), or torch 2.0's layout with ``legacy``."""
        segments: list[dict[str, Any]] = []
        for seg, blocks in self._segment_runs():
            out_blocks: list[dict[str, Any]] = []
            allocated = requested = total = 0
            for b in blocks:
                total += b.size
                state = "active_allocated" if b.allocated else "inactive"
                if b.allocated:
                    allocated += b.size
                    requested += b.requested
                if legacy:
                    lb: dict[str, Any] = {"size": b.size, "requested_size": b.requested, "state": state}
                    if b.allocated:
                        lb["history"] = [{"addr": b.addr, "real_size": b.requested, "frames": b.frames}]
                    out_blocks.append(lb)
                else:
                    out_blocks.append(
                        {
                            "address": b.addr,
                            "size": b.size,
                            "requested_size": b.requested,
                            "state": state,
                            "frames": b.frames if b.allocated else EMPTY_FRAMES,
                        }
                    )
            d: dict[str, Any] = {
                "device": self.device,
                "address": blocks[0].addr,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": seg.stream,
                "segment_type": "small" if seg.small else "large",
            }
            if not legacy:
                d["segment_pool_id"] = (0, 0)
                d["is_expandable"] = seg.expandable
                d["frames"] = seg.frames if self.record_frames else EMPTY_FRAMES
            d["blocks"] = out_blocks
            segments.append(d)
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.num_devices)]
        if legacy:
            traces[self.device] = [
                {k: v for k, v in e.items() if k not in ("time_us", "compile_context", "user_metadata")}
                for e in self._trace
            ]
            return {"segments": segments, "device_traces": traces}
        traces[self.device] = list(self._trace)
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": self.allocator_settings(),
            "external_annotations": [],
        }
