"""A snapshot taken after the OOM: the failing step's tensors are freed, their blocks look like holes.

Users dump snapshots in ``except torch.OutOfMemoryError:`` handlers, and a crash-time capture comes after
the exception unwound the step. On an H200 (tests/gpu, the fragmentation incident) the blocks freed by the
unwinding merged into a 17 GiB hole beside a 12.9 GiB request that had failed for want of one: read as is,
"the cache could have served it" ruled fragmentation out. The evidence undoes the trace's entries after
the ``oom`` entry; these tests pin that on a small allocator state built by hand.

At the OOM (two 4 GiB segments of the large pool, nothing free on the device, a 1.5 GiB request):
  S1: [weights 1 GiB][free 512 MiB][act 1 GiB][free 512 MiB][act 1 GiB]
  S2: [free 1 GiB][kept 1 GiB][free 1 GiB][kept 1 GiB]
3 GiB free in the cache, no block of 1.5 GiB: fragmentation. After the unwinding S1 is
[weights 1 GiB][free 3 GiB].
"""

from __future__ import annotations

from typing import Any

from rules import fragmentation
from triage.engine import diagnose
from triage.evidence import build_evidence
from triage.snapshot.loader import normalise
from triage.units import GiB, MiB

S1, S2 = 0x7F00_0000_0000, 0x7F10_0000_0000
W = [{"filename": "/w/train.py", "line": 20, "name": "main"}]
ACT = [{"filename": "/w/model.py", "line": 12, "name": "forward"}]
KEEP = [{"filename": "/w/train.py", "line": 40, "name": "train_step"}]
REQUEST = 1536 * MiB


def _block(addr: int, size: int, frames: list[dict[str, Any]] | None) -> dict[str, Any]:
    state = "inactive" if frames is None else "active_allocated"
    return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames or []}


def _segment(addr: int, blocks: list[tuple[int, list[dict[str, Any]] | None]]) -> dict[str, Any]:
    out, a = [], addr
    for size, frames in blocks:
        out.append(_block(a, size, frames))
        a += size
    used = sum(b["size"] for b in out if b["state"] != "inactive")
    return {
        "device": 0,
        "address": addr,
        "total_size": a - addr,
        "allocated_size": used,
        "active_size": used,
        "requested_size": used,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": out,
    }


def _entry(action: str, addr: int, size: int, frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames or []}


def _free(addr: int, size: int) -> list[dict[str, Any]]:
    return [_entry("free_requested", addr, size), _entry("free_completed", addr, size)]


H = 512 * MiB
A1, A2 = S1 + GiB + H, S1 + 2 * GiB + 2 * H  # the failing step's activations
K1, K2 = S2 + GiB, S2 + 3 * GiB  # kept across steps


def _trace_to_the_oom() -> list[dict[str, Any]]:
    t = [_entry("segment_alloc", S1, 4 * GiB), _entry("segment_alloc", S2, 4 * GiB)]
    t += [_entry("alloc", S1, GiB, W)]
    t += [
        _entry("alloc", S2, GiB, ACT),
        _entry("alloc", K1, GiB, KEEP),
        _entry("alloc", S2 + 2 * GiB, GiB, ACT),
    ]
    t += [_entry("alloc", K2, GiB, KEEP), *_free(S2, GiB), *_free(S2 + 2 * GiB, GiB)]
    t += [_entry("alloc", S1 + GiB, H, ACT), _entry("alloc", A1, GiB, ACT), _entry("alloc", A1 + GiB, H, ACT)]
    t += [_entry("alloc", A2, GiB, ACT), *_free(S1 + GiB, H), *_free(A1 + GiB, H)]
    t.append(
        {"action": "oom", "addr": 0, "size": REQUEST, "stream": 0, "device_free": 2 * MiB, "frames": ACT}
    )
    return t


def _at_oom_segments() -> list[dict[str, Any]]:
    return [
        _segment(S1, [(GiB, W), (H, None), (GiB, ACT), (H, None), (GiB, ACT)]),
        _segment(S2, [(GiB, None), (GiB, KEEP), (GiB, None), (GiB, KEEP)]),
    ]


def _after_segments() -> list[dict[str, Any]]:
    return [_segment(S1, [(GiB, W), (3 * GiB, None)]), _at_oom_segments()[1]]


MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
    "8.50 GiB of which 2.00 MiB is free. Including non-PyTorch memory, this process has 8.49 GiB memory in use. "
    "Of the allocated memory 5.00 GiB is allocated by PyTorch, and 3.00 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _evidence(segments: list[dict[str, Any]], trace: list[dict[str, Any]], text: str | None = None) -> Any:
    raw = {"segments": segments, "device_traces": [trace]}
    return build_evidence(normalise(raw, source="test", shared_frames=False), text)


def test_a_snapshot_taken_at_the_oom_shows_fragmentation() -> None:
    ev = _evidence(_at_oom_segments(), _trace_to_the_oom())
    assert ev.largest_free_block_bytes == GiB and ev.free_in_pool_bytes == 3 * GiB
    assert ev.allocated_bytes == 5 * GiB and ev.reserved_bytes == 8 * GiB
    assert not any("rolled back" in n for n in ev.notes)
    assert fragmentation.evaluate(ev) is not None


def test_a_snapshot_taken_after_the_unwinding_is_rolled_back_to_the_oom() -> None:
    trace = _trace_to_the_oom() + _free(A1, GiB) + _free(A2, GiB)
    ev = _evidence(_after_segments(), trace)
    assert ev.largest_free_block_bytes == GiB and ev.free_in_pool_bytes == 3 * GiB
    assert ev.allocated_bytes == 5 * GiB and ev.reserved_bytes == 8 * GiB
    assert any("rolled back" in n and "2.0 GiB" in n for n in ev.notes)
    assert fragmentation.evaluate(ev) is not None
    # `triage replay snapshot --message`: the same Diagnosis as from a snapshot taken at the OOM
    late = diagnose(_evidence(_after_segments(), trace, MESSAGE))
    at = diagnose(_evidence(_at_oom_segments(), _trace_to_the_oom(), MESSAGE))
    assert (late.verdict, late.candidates, late.details["findings"]) == (
        at.verdict,
        at.candidates,
        at.details["findings"],
    )
    assert late.candidates[0] == "fragmentation"
    # a trace that missed the frees cannot bring it back: the message's numbers stand, the holes do not
    ev = _evidence(_after_segments(), _trace_to_the_oom(), MESSAGE)
    assert ev.largest_free_block_bytes is None and any("taken after the OOM" in n for n in ev.notes)
    assert diagnose(ev).verdict != "fragmentation"


def test_without_the_entries_after_the_oom_the_hole_is_taken_as_it_is() -> None:
    """The other side: a trace that does not record the frees leaves the 3 GiB hole, which could have
    served the request, so fragmentation is not what stopped it."""
    ev = _evidence(_after_segments(), _trace_to_the_oom())
    assert ev.largest_free_block_bytes == 3 * GiB
    assert fragmentation.evaluate(ev) is None


def test_allocations_and_segments_after_the_oom_are_undone_too() -> None:
    """After the OOM the handler freed the activations, emptied the cache (S2's free blocks cannot go: the
    segment still holds kept tensors), allocated 2 GiB in a new segment and 256 MiB inside S1's new hole."""
    s3 = 0x7F20_0000_0000
    trace = _trace_to_the_oom() + _free(A1, GiB) + _free(A2, GiB)
    trace += [_entry("segment_alloc", s3, 2 * GiB), _entry("alloc", s3, 2 * GiB, ACT)]
    trace += [_entry("alloc", S1 + GiB, 256 * MiB, ACT)]
    segments = [
        _segment(S1, [(GiB, W), (256 * MiB, ACT), (3 * GiB - 256 * MiB, None)]),
        _at_oom_segments()[1],
        {**_segment(s3, [(2 * GiB, ACT)]), "address": s3},
    ]
    ev = _evidence(segments, trace)
    assert ev.largest_free_block_bytes == GiB and ev.free_in_pool_bytes == 3 * GiB
    assert ev.allocated_bytes == 5 * GiB and ev.reserved_bytes == 8 * GiB
    assert fragmentation.evaluate(ev) is not None


def test_a_segment_released_after_the_oom_existed_at_it() -> None:
    """The handler called empty_cache(): a whole free segment went back to CUDA after the OOM. It was
    there, and free, when the request failed."""
    s3 = 0x7F20_0000_0000
    before = [_entry("segment_alloc", s3, GiB)]
    trace = before + _trace_to_the_oom() + [_entry("segment_free", s3, GiB)]
    ev = _evidence(_at_oom_segments(), trace)
    assert ev.reserved_bytes == 9 * GiB and ev.free_in_pool_bytes == 4 * GiB
    assert ev.largest_free_block_bytes == GiB


def test_a_late_snapshot_without_a_trace_gives_way_to_the_message() -> None:
    """No trace to roll back (history off, or the OOM not in the ring): the snapshot's allocated bytes
    (3 GiB) disagree with the message's (5 GiB, printed at the OOM), so its holes are not the request's."""
    ev = _evidence(_after_segments(), [], MESSAGE)
    assert ev.allocated_bytes == 5 * GiB and ev.reserved_bytes == 8 * GiB
    assert ev.largest_free_block_bytes is None and ev.free_in_pool_bytes is None
    assert any("taken after the OOM" in n for n in ev.notes)
    f = fragmentation.evaluate(ev)
    assert f is not None and "largest_free_block_bytes" not in f.values  # from the message's numbers alone


def test_a_snapshot_that_agrees_with_the_message_keeps_its_holes() -> None:
    ev = _evidence(_at_oom_segments(), [], MESSAGE)
    assert ev.largest_free_block_bytes == GiB and ev.free_in_pool_bytes == 3 * GiB
    assert not any("taken after the OOM" in n for n in ev.notes)
    f = fragmentation.evaluate(ev)
    assert f is not None and f.values["largest_free_block_bytes"] == GiB
