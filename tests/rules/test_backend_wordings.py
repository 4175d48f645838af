"""Wordings of the OOM that real jobs print beside the caching allocator's own message: the
``cudaMallocAsync`` backend's figures, torch 1.x's ``cached; 0 bytes inactive)`` ending, an inference
server's word after the traceback that its shard never started, and the memory an old-format message
shows held outside the job's allocator when it prints no process lines.

Each reading is pinned on both sides: the text that changes the answer, and the nearby one where it does
not. The texts follow the shapes these programs print (torch's CUDAMallocAsyncAllocator.cpp, TGI's
launcher); the numbers are made up and consistent.
"""

from __future__ import annotations

import pytest

from rules.other_process import held_elsewhere
from triage.messages import parse_messages
from triage.pipeline import diagnose_text
from triage.units import GiB, MiB


def b(value: float, unit: int) -> int:
    return round(value * unit)


def async_message(
    limit: str = "17179869184.00 GiB", total: str = "22.00 GiB", free: str = "11.06 MiB"
) -> str:
    return (
        "    param = param.to(device)\n"
        "torch.cuda.OutOfMemoryError: Allocation on device 1 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 21.37 GiB\n"
        "Requested               : 288.00 MiB\n"
        f"Device limit            : {total}\n"
        f"Free (according to CUDA): {free}\n"
        "PyTorch limit (set by user-supplied memory fraction)\n"
        f"                        : {limit}\n"
    )


def test_the_async_backend_figures_are_read() -> None:
    [m] = parse_messages(async_message())
    assert (m.kind, m.format, m.device_index) == ("cuda_oom", "async", 1)
    assert m.exception_type == "torch.cuda.OutOfMemoryError"
    assert m.allocated_bytes == m.reserved_bytes == b(21.37, GiB)
    assert m.reserved_unallocated_bytes == 0
    assert m.requested_bytes == b(288, MiB)
    assert m.total_bytes == b(22.0, GiB)
    assert m.free_bytes == b(11.06, MiB)
    assert m.allowed_bytes is None  # 2^64 - 1 bytes: no fraction was set
    assert "Free (according to CUDA): 11.06 MiB" in m.text


def test_an_async_limit_that_was_set_is_a_fraction_cap() -> None:
    # the backend refuses before it asks CUDA: the device still had most of its memory free
    text = async_message(limit="21.40 GiB", total="79.10 GiB", free="57.03 GiB")
    [m] = parse_messages(text)
    assert m.allowed_bytes == b(21.40, GiB)
    d, _ = diagnose_text(text)
    assert d.verdict == "gpu_quota"


def test_the_async_first_line_alone_is_still_an_oom() -> None:
    [m] = parse_messages(
        "RuntimeError: Allocation on device 0 would exceed allowed memory. (out of memory)\n"
    )
    assert (m.format, m.total_bytes, m.requested_bytes) == ("async", None, None)


SHARD_TAIL = (
    " rank=0\n"
    "Error: ShardCannotStart\n"
    "2024-03-02T08:11:40.120511Z ERROR text_generation_launcher: Shard 0 failed to start\n"
    "2024-03-02T08:11:40.120537Z  INFO text_generation_launcher: Shutting down shards\n"
)
OLD_NEAR_FULL = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 172.00 MiB (GPU 0; 21.99 GiB total "
    "capacity; 21.41 GiB already allocated; 61.06 MiB free; 21.46 GiB reserved in total by PyTorch) If reserved "
    "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
    "Memory Management and PYTORCH_CUDA_ALLOC_CONF\n"
)


def test_a_shard_that_never_started_ran_no_step() -> None:
    d, ev = diagnose_text(OLD_NEAR_FULL + SHARD_TAIL)
    assert ev.setup_call == "ShardCannotStart" and ev.step == 0
    assert d.verdict == "workload_too_large"
    assert "tensor_leak" not in d.candidates


def test_the_same_oom_without_the_launchers_word_stays_open() -> None:
    d, ev = diagnose_text(OLD_NEAR_FULL + " rank=0\n2024-03-02T08:11:40Z INFO serving on :80\n")
    assert ev.setup_call is None
    assert d.verdict == "inconclusive"
    assert {"tensor_leak", "workload_too_large"} <= set(d.candidates)


def test_an_async_oom_while_a_shard_loads() -> None:
    d, ev = diagnose_text(async_message() + SHARD_TAIL)
    assert ev.step == 0
    assert d.verdict == "workload_too_large"


def test_the_inactive_ending_of_torch_1x() -> None:
    text = (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 2; 10.92 GiB total capacity; "
        "1.91 GiB already allocated; 12.44 MiB free; 61.29 MiB cached; 0 bytes inactive)"
    )
    [m] = parse_messages(text)
    assert m.format == "pre-2.1-cached"
    assert m.cached_bytes == b(61.29, MiB)
    assert m.reserved_bytes == b(1.91, GiB) + b(61.29, MiB)


def old_message(total: float, reserved: float, free_mib: float, request_mib: float = 512.0) -> str:
    allocated = reserved - 0.05
    return (
        f"RuntimeError: CUDA out of memory. Tried to allocate {request_mib:.2f} MiB (GPU 0; {total:.2f} GiB "
        f"total capacity; {allocated:.2f} GiB already allocated; {free_mib:.2f} MiB free; {reserved:.2f} GiB "
        "reserved in total by PyTorch)"
    )


@pytest.mark.parametrize(
    ("total", "reserved", "neighbour"),
    [
        (44.35, 27.90, True),  # 16 GiB elsewhere: 37% of the device
        (79.15, 55.60, True),  # 23 GiB elsewhere: 29%
        (23.65, 14.80, True),  # 8.5 GiB elsewhere: 36%, just over the least
        (79.15, 71.90, False),  # 7 GiB elsewhere: NVLS buffers, a second library's pool, …
        (23.65, 16.30, False),  # 7 GiB: 31% of the device, under the least
        (44.35, 34.30, False),  # 9.7 GiB: 22% of the device
    ],
)
def test_memory_held_outside_the_allocator_without_process_lines(
    total: float, reserved: float, neighbour: bool
) -> None:
    d, ev = diagnose_text(old_message(total, reserved, free_mib=300.0))
    outside = ev.non_pytorch_bytes
    assert outside is not None
    assert held_elsewhere(outside, b(total, GiB)) is neighbour
    if neighbour:
        assert d.verdict == "other_process" and d.owner == "platform"
    else:
        assert d.verdict == "inconclusive"
        assert "other_process" in d.candidates


def own_line_message(lines: str) -> str:
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.46 GiB. GPU 0 has a total capacity of "
        f"139.81 GiB of which 3.02 GiB is free. {lines}Of the allocated memory 119.21 GiB is allocated by "
        "PyTorch, and 14.04 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
        "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def test_the_only_line_that_can_hold_the_reservation_is_the_job() -> None:
    """In a container torch prints the failing process as "Process PID". NVML lists every process on the
    device, the job's among them: with one line holding at least the job's 133.25 GiB reservation, that
    line is the job, even 3.4 GiB above it (NCCL buffers, workspaces on a large GPU)."""
    _, ev = diagnose_text(own_line_message("Process 3373672 has 136.69 GiB memory in use. "))
    assert [p.own for p in ev.processes] == [True]
    assert ev.other_process_bytes == 0
    _, ev = diagnose_text(
        own_line_message(
            "Process 3373672 has 136.69 GiB memory in use. Process 88 has 0.08 GiB memory in use. "
        )
    )
    assert [p.own for p in ev.processes] == [True, False]


def test_two_lines_either_of_which_could_be_the_job_stay_unassigned() -> None:
    text = own_line_message(
        "Process 11 has 136.69 GiB memory in use. Process 12 has 137.00 GiB memory in use. "
    )
    _, ev = diagnose_text(text.replace("139.81 GiB", "279.62 GiB"))
    assert not any(p.own for p in ev.processes)
