"""The caching-allocator model: arithmetic on both sides of each threshold, invariants, trace replay,
OOM messages, expandable segments, snapshot layouts."""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

import pytest

from triage.simulate.allocator import (
    EMPTY_FRAMES,
    CachingAllocator,
    SimulatedOOM,
    allocation_size,
    format_size,
    round_size,
)
from triage.units import GiB, KiB, MiB

# --------------------------------------------------------------------------- helpers

_SIZE = r"(\d+ bytes|\d+\.\d\d (?:KiB|MiB|GiB))"
OOM_RE = re.compile(
    r"CUDA out of memory\. Tried to allocate "
    + _SIZE
    + r"\. GPU (\d+) has a total capacity of "
    + _SIZE
    + r" of which "
    + _SIZE
    + r" is free\. "
    r"((?:(?:Process \d+|Including non-PyTorch memory, this process) has " + _SIZE + r" memory in use\. )*)"
    r"(?:" + _SIZE + r" allowed; )?"
    r"Of the allocated memory "
    + _SIZE
    + r" is allocated by PyTorch, and "
    + _SIZE
    + r" is reserved by PyTorch but unallocated\. If reserved but unallocated memory is large try setting "
    r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation\.  See documentation for "
    r"Memory Management  \(https://pytorch\.org/docs/stable/notes/cuda\.html#environment-variables\)$"
)
PROC_RE = re.compile(
    r"(?:Process (\d+)|Including non-PyTorch memory, this process) has " + _SIZE + " memory in use"
)
_UNIT = {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}


def parse_size(text: str) -> float:
    num, unit = text.split()
    return float(num) * _UNIT[unit]


def close(text: str, value: int) -> bool:
    """A printed size matches a byte count (two decimals of its unit)."""
    unit = text.split()[1]
    return abs(parse_size(text) - value) <= 0.005 * _UNIT[unit] + 1e-9


def parse_oom(message: str) -> dict[str, Any]:
    m = OOM_RE.match(message)
    assert m, message
    alloc, dev, total, free, procs, _pused, allowed, allocated, unalloc = m.groups()
    return {
        "alloc": alloc,
        "device": int(dev),
        "total": total,
        "free": free,
        "procs": [(pid, used) for pid, used in PROC_RE.findall(procs)],
        "allowed": allowed,
        "allocated": allocated,
        "unallocated": unalloc,
    }


def segments(a: CachingAllocator) -> list[dict[str, Any]]:
    return list(a.snapshot()["segments"])


def check_invariants(a: CachingAllocator) -> None:
    snap = a.snapshot()
    segs = snap["segments"]
    assert [s["address"] for s in segs] == sorted(s["address"] for s in segs)
    reserved = allocated = requested = 0
    for s in segs:
        assert s["total_size"] == sum(b["size"] for b in s["blocks"])
        addr = s["address"]
        for b in s["blocks"]:
            assert b["address"] == addr  # contiguous
            addr += b["size"]
            if b["state"] == "inactive":
                assert b["frames"] == []
        alloc_here = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        assert s["allocated_size"] == alloc_here == s["active_size"]
        assert s["requested_size"] == sum(
            b["requested_size"] for b in s["blocks"] if b["state"] == "active_allocated"
        )
        reserved += s["total_size"]
        allocated += alloc_here
        requested += s["requested_size"]
        # no two adjacent free blocks (they merge), except across an unmapped boundary
        states = [b["state"] for b in s["blocks"]]
        assert all(not (x == y == "inactive") for x, y in itertools.pairwise(states))
    st = a.memory_stats()
    assert st["reserved_bytes.all.current"] == reserved == a.reserved
    assert st["allocated_bytes.all.current"] == allocated == a.allocated_bytes
    assert st["active_bytes.all.current"] == allocated
    assert st["requested_bytes.all.current"] == requested
    assert st["allocation.all.current"] == sum(
        1 for s in segs for b in s["blocks"] if b["state"] == "active_allocated"
    )
    for name in ("allocated_bytes", "reserved_bytes", "allocation", "segment", "inactive_split_bytes"):
        assert (
            st[f"{name}.all.current"] == st[f"{name}.small_pool.current"] + st[f"{name}.large_pool.current"]
        )
        assert st[f"{name}.all.peak"] >= st[f"{name}.all.current"]
    inactive_split = [
        b for s in segs for b in s["blocks"] if b["state"] == "inactive" and len(s["blocks"]) > 1
    ]
    if not any(s["is_expandable"] for s in segs):
        assert st["inactive_split.all.current"] == len(inactive_split)
        assert st["inactive_split_bytes.all.current"] == sum(b["size"] for b in inactive_split)


def replay(trace: list[dict[str, Any]]) -> tuple[dict[int, int], dict[int, int]]:
    """Active blocks (address -> requested size) and mapped memory (start -> size) from a full trace."""
    active: dict[int, int] = {}
    mapped: dict[int, int] = {}
    for e in trace:
        act = e["action"]
        if act == "alloc":
            assert e["addr"] not in active
            active[e["addr"]] = e["size"]
        elif act == "free_completed":
            assert active.pop(e["addr"]) == e["size"]
        elif act in ("segment_alloc", "segment_map"):
            start, size = e["addr"], e["size"]
            assert all(start + size <= a or a + n <= start for a, n in mapped.items())
            before = next((a for a, n in mapped.items() if a + n == start), None)
            if before is not None:  # keep mapped ranges coalesced
                mapped[before] += size
                start = before
            else:
                mapped[start] = size
            after = mapped.pop(start + mapped[start], None)
            if after is not None:
                mapped[start] += after
        elif act in ("segment_free", "segment_unmap"):
            start, size = e["addr"], e["size"]
            hit = [a for a, n in mapped.items() if a <= start and start + size <= a + n]
            assert len(hit) == 1, e
            a0 = hit[0]
            n0 = mapped.pop(a0)
            if start > a0:
                mapped[a0] = start - a0
            if start + size < a0 + n0:
                mapped[start + size] = a0 + n0 - start - size
    return active, mapped


def check_replay(a: CachingAllocator) -> None:
    check_snapshot_replay(a.snapshot(), a.device)


def check_snapshot_replay(snap: dict[str, Any], device: int) -> None:
    """Replaying the trace gives exactly the snapshot's active blocks and mapped segment bytes."""
    active, mapped = replay(snap["device_traces"][device])
    want = {
        b["address"]: b["requested_size"]
        for s in snap["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    }
    assert active == want
    assert sum(mapped.values()) == sum(s["total_size"] for s in snap["segments"])


def alloc(**kw: Any) -> CachingAllocator:
    kw.setdefault("total_bytes", 4 * GiB)
    kw.setdefault("context_bytes", 0)
    kw.setdefault("seed", 7)
    return CachingAllocator(**kw)


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("size", "rounded"),
    [(0, 512), (1, 512), (511, 512), (512, 512), (513, 1024), (1024, 1024), (1025, 1536), (MiB, MiB)],
)
def test_round_size(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [
        (512, 2 * MiB),
        (MiB, 2 * MiB),
        (MiB + 512, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),
        (10 * MiB + 512, 12 * MiB),
        (21 * MiB, 22 * MiB),
    ],
)
def test_allocation_size(rounded: int, segment: int) -> None:
    assert allocation_size(rounded) == segment


def test_pool_boundary_is_one_mib() -> None:
    a = alloc()
    a.malloc(MiB)  # exactly 1 MiB: small pool
    a.malloc(MiB + 1)  # rounds to 1 MiB + 512: large pool, 20 MiB segment
    segs = segments(a)
    kinds = sorted((s["segment_type"], s["total_size"]) for s in segs)
    assert kinds == [("large", 20 * MiB), ("small", 2 * MiB)]
    st = a.memory_stats()
    assert st["allocated_bytes.small_pool.current"] == MiB
    assert st["allocated_bytes.large_pool.current"] == MiB + 512
    check_invariants(a)


def test_small_pool_split_threshold() -> None:
    a = alloc()
    x = a.malloc(MiB)  # 2 MiB segment, remainder 1 MiB >= 512: split
    y = a.malloc(MiB - 512)  # fits in the remainder, leaves 512: split
    z = a.malloc(1)  # takes the last 512 bytes: no remainder
    (seg,) = segments(a)
    assert [b["size"] for b in seg["blocks"]] == [MiB, MiB - 512, 512]
    assert [b["address"] for b in seg["blocks"]] == [x, y, z]
    assert a.memory_stats()["segment.all.current"] == 1
    check_invariants(a)


def test_large_pool_split_threshold() -> None:
    a = alloc()
    a.malloc(19 * MiB)  # 20 MiB segment, remainder exactly 1 MiB: not > 1 MiB, no split
    a.malloc(19 * MiB - 512)  # 20 MiB segment, remainder 1 MiB + 512 > 1 MiB: split
    segs = sorted(segments(a), key=lambda s: s["blocks"][0]["requested_size"])
    assert [b["size"] for b in segs[0]["blocks"]] == [19 * MiB - 512, MiB + 512]
    assert [b["size"] for b in segs[1]["blocks"]] == [20 * MiB]
    assert segs[1]["blocks"][0]["requested_size"] == 19 * MiB
    check_invariants(a)


@pytest.mark.parametrize(("size", "segment"), [(10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB)])
def test_segment_size_boundary_at_ten_mib(size: int, segment: int) -> None:
    a = alloc()
    a.malloc(size)  # < 10 MiB: a 20 MiB segment; >= 10 MiB: exactly its (2 MiB-rounded) size
    assert [s["total_size"] for s in segments(a)] == [segment]


def test_merge_and_cache_and_empty_cache() -> None:
    a = alloc()
    x = a.malloc(4 * MiB)
    y = a.malloc(4 * MiB)
    z = a.malloc(4 * MiB)
    (seg,) = segments(a)
    assert len(seg["blocks"]) == 4  # three tensors and the 8 MiB remainder
    a.free(y)
    assert [b["state"][:6] for b in segments(a)[0]["blocks"]] == ["active", "inacti", "active", "inacti"]
    a.free(x)  # merges with the free neighbour
    assert [b["size"] for b in segments(a)[0]["blocks"]] == [8 * MiB, 4 * MiB, 8 * MiB]
    a.free(z)  # everything merges back into one cached block
    (seg,) = segments(a)
    assert [b["size"] for b in seg["blocks"]] == [20 * MiB]
    assert a.reserved == 20 * MiB
    check_invariants(a)
    a.empty_cache()
    assert segments(a) == []
    assert a.trace[-1]["action"] == "segment_free"
    assert a.trace[-1]["size"] == 20 * MiB
    check_replay(a)


def test_best_fit_and_streams() -> None:
    a = alloc()
    big = a.malloc(40 * MiB)
    small = a.malloc(12 * MiB)
    a.malloc(12 * MiB)  # keeps segments apart
    a.free(big)
    a.free(small)
    x = a.malloc(11 * MiB)  # best fit: the 12 MiB block, not the 40 MiB one
    assert x == small
    s1 = a.malloc(30 * MiB, stream=7)  # a cached stream-0 block is never used for another stream
    seg = next(s for s in segments(a) if any(b["address"] == s1 for b in s["blocks"]))
    assert seg["stream"] == 7
    assert a.largest_free_block(stream=0) == 40 * MiB
    check_invariants(a)


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    a = alloc(max_split_size=64 * MiB)
    big = a.malloc(100 * MiB)
    a.free(big)
    x = a.malloc(30 * MiB)  # would fit the cached 100 MiB block, but that one is oversize
    assert x != big
    y = a.malloc(100 * MiB)  # an oversize request reuses the oversize block, unsplit
    assert y == big
    assert a.allocator_settings()["max_split_size"] == 64 * MiB
    assert "max_split_size_mb:64" in a.allocator_settings()["PYTORCH_CUDA_ALLOC_CONF"]
    check_invariants(a)


def test_format_size_boundaries() -> None:
    assert format_size(1024) == "1024 bytes"
    assert format_size(1025) == "1.00 KiB"
    assert format_size(MiB) == "1024.00 KiB"
    assert format_size(MiB + 1) == "1.00 MiB"
    assert format_size(GiB) == "1024.00 MiB"
    assert format_size(79 * GiB + GiB // 10) == "79.10 GiB"


# --------------------------------------------------------------------------- OOM


def test_oom_releases_cache_retries_then_raises() -> None:
    neighbour = {"pid": 4242, "used_bytes": 1 * GiB, "name": "python3"}
    a = alloc(total_bytes=2 * GiB, context_bytes=100 * MiB, other_processes=[neighbour], pid=31337)
    keep = a.malloc(300 * MiB)
    t = a.malloc(200 * MiB)
    a.free(t)  # a cached unsplit segment: released before the OOM
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(700 * MiB)
    exc = info.value
    actions = [e["action"] for e in a.trace]
    assert actions[-2:] == ["segment_free", "oom"]
    oom = a.trace[-1]
    assert "addr" not in oom
    assert oom["size"] == 700 * MiB
    assert oom["device_free"] == 2 * GiB - 100 * MiB - GiB - 300 * MiB
    st = a.memory_stats()
    assert st["num_alloc_retries"] == 1
    assert st["num_ooms"] == 1
    assert exc.observer == (0, 700 * MiB, 2 * GiB, oom["device_free"])
    p = parse_oom(exc.message)
    assert p["alloc"] == format_size(700 * MiB)
    assert close(p["total"], 2 * GiB)
    assert close(p["free"], oom["device_free"])
    assert p["procs"] == [("4242", "1024.00 MiB"), ("31337", "400.00 MiB")]
    assert p["allowed"] is None
    assert close(p["allocated"], 300 * MiB)
    assert p["unallocated"] == "0 bytes"
    assert keep in a.live_blocks()
    check_invariants(a)
    check_replay(a)


def test_oom_message_shows_segment_size_and_self_line() -> None:
    a = alloc(total_bytes=64 * MiB, context_bytes=0, own_process_label="self", device=3, num_devices=4)
    a.malloc(50 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(3 * MiB)  # a 3 MiB tensor asks for a 20 MiB segment
    p = parse_oom(info.value.message)
    assert p["alloc"] == "20.00 MiB"
    assert p["device"] == 3
    assert info.value.message.count("Including non-PyTorch memory, this process has 50.00 MiB") == 1
    snap = a.snapshot()
    assert len(snap["device_traces"]) == 4
    assert snap["device_traces"][3][-1]["size"] == 3 * MiB
    assert all(not t for i, t in enumerate(snap["device_traces"]) if i != 3)


def test_fraction_cap_rejects_without_asking_the_device() -> None:
    a = alloc(total_bytes=8 * GiB, fraction_cap_bytes=1 * GiB)
    a.malloc(900 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(200 * MiB)
    exc = info.value
    p = parse_oom(exc.message)
    assert p["allowed"] == "1024.00 MiB"
    assert close(p["free"], 8 * GiB - 900 * MiB)  # the device itself has plenty
    assert exc.observer == (0, 200 * MiB, 1 * GiB, 8 * GiB - 900 * MiB)
    assert a.num_oom_rejections >= 1


def test_nvml_failure_raises_the_assert_and_records_no_oom() -> None:
    a = alloc(total_bytes=64 * MiB, nvml_fails=True)
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(100 * MiB)
    assert info.value.message.startswith("NVML_SUCCESS == r INTERNAL ASSERT FAILED")
    assert info.value.observer is None
    assert all(e["action"] != "oom" for e in a.trace)
    assert a.num_ooms == 0


# --------------------------------------------------------------------------- expandable segments


def test_expandable_segments_map_and_unmap_pages() -> None:
    a = alloc(total_bytes=1 * GiB, expandable_segments=True)
    x = a.malloc(30 * MiB)
    y = a.malloc(5 * MiB)
    z = a.malloc(50 * MiB)
    maps = [e["size"] for e in a.trace if e["action"] == "segment_map"]
    assert maps == [40 * MiB, 60 * MiB]  # 20 MiB pages, mapped on demand
    (seg,) = segments(a)
    assert seg["is_expandable"] and seg["total_size"] == 100 * MiB
    assert a.allocator_settings()["expandable_segments"] is True
    a.free(x)
    a.free(y)
    a.empty_cache()  # the first page is entirely free: unmapped; the range splits in two segments?
    unmaps = [e for e in a.trace if e["action"] == "segment_unmap"]
    assert [e["size"] for e in unmaps] == [20 * MiB]
    assert a.reserved == 80 * MiB
    check_invariants(a)
    big = a.malloc(200 * MiB)  # grows the tail
    assert big > z
    check_invariants(a)
    check_replay(a)


def test_expandable_segment_oom() -> None:
    a = alloc(total_bytes=256 * MiB, expandable_segments=True)
    a.malloc(100 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        a.malloc(200 * MiB)
    assert parse_oom(info.value.message)["alloc"] == "200.00 MiB"
    check_invariants(a)
    check_replay(a)


# --------------------------------------------------------------------------- random operations


@pytest.mark.parametrize("expandable", [False, True])
def test_random_operations_keep_invariants_and_replay(expandable: bool) -> None:
    rng = random.Random(11 + expandable)
    a = alloc(total_bytes=3 * GiB, expandable_segments=expandable, seed=5)
    live: list[int] = []
    frames = [{"name": "f", "filename": "/workspace/train.py", "line": 1}]
    for i in range(1500):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice(
                [rng.randrange(1, 4096), rng.randrange(1, 2 * MiB), rng.randrange(MiB, 96 * MiB)]
            )
            try:
                live.append(a.malloc(size, frames, stream=rng.choice([0, 0, 0, 99])))
            except SimulatedOOM:
                pass
        if i % 250 == 0:
            a.empty_cache() if rng.random() < 0.5 else None
            check_invariants(a)
    check_invariants(a)
    check_replay(a)
    assert set(a.live_blocks()) == set(live)


# --------------------------------------------------------------------------- snapshot layout


def test_snapshot_format_and_sharing() -> None:
    stack = [{"name": "forward", "filename": "/workspace/model.py", "line": 12}]
    a = alloc(max_entries=5)
    addrs = [a.malloc(1000, stack) for _ in range(4)]
    a.free(addrs[0], stack)
    snap = a.snapshot()
    assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    seg = snap["segments"][0]
    assert list(seg) == [
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
    ]
    assert seg["segment_pool_id"] == (0, 0)
    assert set(seg["blocks"][1]) == {"address", "size", "requested_size", "state", "frames"}
    trace = snap["device_traces"][0]
    assert len(trace) == 5  # the ring keeps the last max_entries events
    assert [e["action"] for e in trace][-2:] == ["free_requested", "free_completed"]
    e = trace[-1]
    assert list(e) == [
        "action",
        "addr",
        "size",
        "stream",
        "time_us",
        "frames",
        "compile_context",
        "user_metadata",
    ]
    assert e["size"] == 1000 and e["compile_context"] == "N/A" and e["user_metadata"] == ""
    assert all(x["frames"] is stack for x in trace)  # shared, never copied
    assert [x["time_us"] for x in trace] == sorted(x["time_us"] for x in trace)
    settings = snap["allocator_settings"]
    for key in (
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "expandable_segments",
        "roundup_power2_divisions",
    ):
        assert key in settings


def test_no_frames_and_no_history() -> None:
    a = alloc(record_frames=False)
    x = a.malloc(100, [{"name": "f", "filename": "/x.py", "line": 1}])
    snap = a.snapshot()
    assert all(e["frames"] is EMPTY_FRAMES for e in snap["device_traces"][0])
    assert snap["segments"][0]["blocks"][0]["frames"] == []
    b = alloc(record_history=False)
    b.malloc(100, [{"name": "f", "filename": "/x.py", "line": 1}])
    assert b.snapshot()["device_traces"] == [[]]
    assert x


def test_legacy_snapshot_layout() -> None:
    stack = [{"name": "forward", "filename": "/workspace/model.py", "line": 12}]
    a = alloc()
    x = a.malloc(3000, stack)
    a.malloc(5000, stack)
    a.free(x)
    snap = a.snapshot(legacy=True)
    assert set(snap) == {"segments", "device_traces"}
    seg = snap["segments"][0]
    assert "segment_pool_id" not in seg and "frames" not in seg
    blocks = seg["blocks"]
    assert "address" not in blocks[0]
    active = [b for b in blocks if b["state"] == "active_allocated"]
    assert active[0]["history"][0]["real_size"] == 5000
    assert active[0]["history"][0]["frames"] is stack
    assert all("time_us" not in e for e in snap["device_traces"][0])
