"""An OOM with the device's memory mostly free: the job's own memory did not run out.

torch reads the device's free memory for its message (and the trace's ``oom`` entry) after the allocator has
released every cached segment it could and retried ``cudaMalloc``. When that reading would hold a fresh
segment for the request many times over, and the job held a small share of what it could, no step of the job
was too large and no leak filled the device: something outside its tensors refused the allocation (a cap the
input does not print, a neighbour that freed its memory just after, the host's memory). A free figure a
little above the request is not this: drivers refuse allocations near the free total, and that is still a
step too large for what was left.

Messages follow the templates of SNAPSHOT_FORMAT.md §4 (pre-2.1 and 2.2+).
"""

from __future__ import annotations

import pytest

from triage.pipeline import diagnose_text

PRE_2_1 = (
    "RuntimeError: CUDA out of memory. Tried to allocate {req} (GPU 0; 15.78 GiB total capacity; {alloc} already "
    "allocated; {free} free; {res} reserved in total by PyTorch)\n"
)
MSG_2_2 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of "
    "23.65 GiB of which {free} is free. Including non-PyTorch memory, this process has {mine} memory in use. "
    "{allowed}Of the allocated memory {alloc} is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch "
    "but unallocated.\n"
)


def test_a_small_request_with_most_of_the_device_free_is_not_the_jobs_memory() -> None:
    d, ev = diagnose_text(
        PRE_2_1.format(req="24.00 MiB", alloc="310.25 MiB", free="13.90 GiB", res="332.00 MiB")
    )
    assert ev.device_had_room
    assert d.verdict == "inconclusive"
    assert d.candidates == ["gpu_quota"], d.candidates
    assert any("did not run out" in e.fact for e in d.evidence)


@pytest.mark.parametrize(
    ("req", "free", "alloc", "mine", "room"),
    [
        ("64.00 MiB", "17.10 GiB", "1.20 GiB", "1.74 GiB", True),
        # free a little above the request: the driver's refusal near its free total, a step too large
        ("6.00 GiB", "7.10 GiB", "1.20 GiB", "1.74 GiB", False),
        # plenty free, but the job held most of what it could: not this case
        ("64.00 MiB", "9.10 GiB", "13.60 GiB", "14.04 GiB", False),
    ],
)
def test_both_sides_of_the_room(req: str, free: str, alloc: str, mine: str, room: bool) -> None:
    d, ev = diagnose_text(MSG_2_2.format(req=req, free=free, alloc=alloc, mine=mine, allowed=""))
    assert ev.device_had_room is room
    assert ("workload_too_large" in d.candidates or d.verdict == "workload_too_large") is not room


def test_a_cap_the_message_prints_decides_instead() -> None:
    """With the fraction cap printed, the free memory is explained: the cap refused it (gpu_quota's own
    reading), not an unknown."""
    text = MSG_2_2.format(
        req="64.00 MiB",
        free="17.10 GiB",
        alloc="5.90 GiB",
        mine="6.00 GiB",
        allowed="6.00 GiB allowed; ",
    )
    d, ev = diagnose_text(text)
    assert ev.fraction_cap_bytes
    assert not ev.device_had_room
    assert d.verdict == "gpu_quota", d.headline
