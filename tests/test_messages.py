"""triage.messages: every OOM / shm / host-OOM message format, inside real-looking logs.

The CUDA examples are the real messages quoted in SNAPSHOT_FORMAT.md §4 (and real ones from public issues);
expected sizes are computed here the way torch printed them: round(value * unit).
"""

from __future__ import annotations

import random

import pytest

from triage.messages import (
    DEDUPE_WINDOW_LINES,
    OomMessage,
    ProcessUsage,
    non_pytorch_bytes,
    parse_message,
    parse_messages,
    split_processes,
)

KiB, MiB, GiB = 2**10, 2**20, 2**30


def b(value: float, unit: int) -> int:
    return round(value * unit)


def one(text: str) -> OomMessage:
    found = parse_messages(text)
    assert len(found) == 1, found
    return found[0]


# Real messages (SNAPSHOT_FORMAT.md §4 and public issues)
PRE21 = (
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity; 30.29 GiB already "
    "allocated; 3.75 MiB free; 30.40 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
    "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
    "and PYTORCH_CUDA_ALLOC_CONF"
)
CACHED = (
    "CUDA out of memory. Tried to allocate 1024.00 MiB (GPU 0; 15.90 GiB total capacity; 14.25 GiB already "
    "allocated; 991.56 MiB free; 607.00 KiB cached)"
)
V21 = (
    "CUDA out of memory. Tried to allocate 448.00 MiB. GPU 1 has a total capacty of 79.10 GiB of which "
    "364.31 MiB is free. Process 175080 has 1.46 GiB memory in use. Process 175356 has 77.26 GiB memory in "
    "use. Of the allocated memory 72.12 GiB is allocated by PyTorch, and 3.78 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
V22 = (
    "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 47.53 GiB of which 896.00 "
    "KiB is free. Process 1686436 has 47.51 GiB memory in use. Of the allocated memory 47.00 GiB is allocated "
    "by PyTorch, with 46.22 GiB allocated in private pools (e.g., CUDA Graphs), and 149.10 MiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
V22_THIS = (
    "CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of 83.05 GiB of which "
    "140.38 MiB is free. Including non-PyTorch memory, this process has 23.33 GiB memory in use. Of the "
    "allocated memory 21.92 GiB is allocated by PyTorch, with 104.00 MiB allocated in private pools (e.g., "
    "CUDA Graphs), and 797.79 MiB is reserved by PyTorch but unallocated."
)
HAMI = (
    "[HAMI-core ERROR (pid:25 thread=139892685178688 allocator.c:53)]: Device 0 OOM 27147995136 / 25757220864"
)


# ------------------------------------------------------------------------------------ CUDA formats


def test_pre_21_real_example() -> None:
    m = one("RuntimeError: " + PRE21)
    assert (m.kind, m.format, m.exception_type, m.line_no, m.rank) == (
        "cuda_oom",
        "pre-2.1",
        "RuntimeError",
        1,
        None,
    )
    assert m.text == PRE21
    assert m.device_index == 4
    assert m.requested_bytes == 20971520 == b(20.00, MiB)
    assert m.total_bytes == b(31.75, GiB)
    assert m.allocated_bytes == b(30.29, GiB) == 32523639849
    assert m.free_bytes == b(3.75, MiB)
    assert m.reserved_bytes == b(30.40, GiB)
    assert m.reserved_unallocated_bytes == b(30.40, GiB) - b(30.29, GiB)
    assert m.allowed_bytes is None and m.cached_bytes is None and m.private_pool_bytes is None
    assert m.processes == [] and m.fraction_rejected is False
    assert non_pytorch_bytes(m) == b(31.75, GiB) - b(3.75, MiB) - b(30.40, GiB)


def test_pre_21_with_allowed_cap() -> None:
    text = (
        "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 14.76 GiB total capacity; "
        "1.23 GiB already allocated; 12.50 GiB free; 2.00 GiB allowed; 1.50 GiB reserved in total by PyTorch)"
    )
    m = one(text)
    assert m.format == "pre-2.1"
    assert m.allowed_bytes == 2 * GiB
    assert (m.total_bytes, m.allocated_bytes, m.free_bytes, m.reserved_bytes) == (
        b(14.76, GiB),
        b(1.23, GiB),
        b(12.5, GiB),
        b(1.5, GiB),
    )
    assert m.requested_bytes == 512 * MiB


def test_very_old_cached_format() -> None:
    m = one("RuntimeError: " + CACHED)
    assert m.format == "pre-2.1-cached"
    assert m.requested_bytes == 1024 * MiB
    assert m.total_bytes == b(15.90, GiB)
    assert m.allocated_bytes == b(14.25, GiB)
    assert m.free_bytes == b(991.56, MiB)
    # torch ≤ 1.3 documents "cached" as memory held by the allocator but not allocated
    assert m.cached_bytes == m.reserved_unallocated_bytes == 607 * KiB
    assert m.reserved_bytes == b(14.25, GiB) + 607 * KiB


def test_21_capacty_typo_with_process_lines() -> None:
    m = one("torch.cuda.OutOfMemoryError: " + V21)
    assert (m.format, m.exception_type, m.device_index) == ("2.1", "torch.cuda.OutOfMemoryError", 1)
    assert m.requested_bytes == 448 * MiB
    assert m.total_bytes == b(79.10, GiB)
    assert m.free_bytes == b(364.31, MiB)
    assert m.processes == [
        ProcessUsage(175080, b(1.46, GiB), False),
        ProcessUsage(175356, b(77.26, GiB), False),
    ]
    assert m.allocated_bytes == b(72.12, GiB)
    assert m.reserved_unallocated_bytes == b(3.78, GiB)
    assert m.reserved_bytes == b(72.12, GiB) + b(3.78, GiB)
    assert non_pytorch_bytes(m) == b(79.10, GiB) - b(364.31, MiB) - b(72.12, GiB) - b(3.78, GiB)


def test_22_private_pools() -> None:
    m = one("OutOfMemoryError: " + V22)
    assert (m.format, m.exception_type, m.device_index) == ("2.2+", "OutOfMemoryError", 0)
    assert m.text == V22
    assert m.requested_bytes == 2 * MiB
    assert m.total_bytes == b(47.53, GiB)
    assert m.free_bytes == 896 * KiB
    assert m.processes == [ProcessUsage(1686436, b(47.51, GiB), False)]
    assert m.allocated_bytes == 47 * GiB
    assert m.private_pool_bytes == b(46.22, GiB)
    assert m.reserved_unallocated_bytes == b(149.10, MiB)
    assert m.reserved_bytes == 47 * GiB + b(149.10, MiB)


def test_22_this_process_line() -> None:
    m = one("torch.OutOfMemoryError: " + V22_THIS)
    assert m.exception_type == "torch.OutOfMemoryError"
    assert m.processes == [ProcessUsage(None, b(23.33, GiB), True)]
    assert m.private_pool_bytes == 104 * MiB
    assert m.reserved_bytes == b(21.92, GiB) + b(797.79, MiB)


def test_22_allowed_and_mixed_process_lines() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 2 has a total capacity "
        "of 39.39 GiB of which 20.00 GiB is free. Including non-PyTorch memory, this process has 9.50 GiB "
        "memory in use. Process 77 has 9.00 GiB memory in use. 10.00 GiB allowed; Of the allocated memory "
        "9.00 GiB is allocated by PyTorch, and 512.00 bytes is reserved by PyTorch but unallocated."
    )
    m = one(text)
    assert (m.format, m.device_index, m.allowed_bytes) == ("2.2+", 2, 10 * GiB)
    assert m.processes == [ProcessUsage(None, b(9.5, GiB), True), ProcessUsage(77, 9 * GiB, False)]
    assert m.reserved_unallocated_bytes == 512
    assert m.reserved_bytes == 9 * GiB + 512
    own, others = split_processes(m, set())
    assert own == [ProcessUsage(None, b(9.5, GiB), True)]
    assert others == [ProcessUsage(77, 9 * GiB, False)]
    own, others = split_processes(m, {77})
    assert [p.pid for p in own] == [None, 77] and others == []


def test_container_pid_ambiguity_is_visible() -> None:
    # in a container the failing process prints as "Process PID …": only own_pids tells it from a neighbour
    m = one("OutOfMemoryError: " + V22)
    assert split_processes(m, set()) == ([], [ProcessUsage(1686436, b(47.51, GiB), False)])
    assert split_processes(m, {1686436}) == ([ProcessUsage(1686436, b(47.51, GiB), False)], [])
    # total − free − reserved: what the device holds beyond this PyTorch process's reservation
    assert non_pytorch_bytes(m) == b(47.53, GiB) - 896 * KiB - (47 * GiB + b(149.10, MiB))


def test_non_pytorch_bytes_needs_the_numbers() -> None:
    m = one("RuntimeError: CUDA error: out of memory")
    assert non_pytorch_bytes(m) is None
    # rounding of three printed values can go below zero: clamp
    m2 = OomMessage("cuda_oom", "2.2+", "", total_bytes=100, free_bytes=60, reserved_bytes=41)
    assert non_pytorch_bytes(m2) == 0


def test_fraction_rejected() -> None:
    text = (
        "RuntimeError: CUDA out of memory. Allocation was preemptively rejected because it would exceed "
        "per_process_memory_fraction limit. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.10 "
        "GiB of which 60.00 GiB is free. 16.00 GiB allowed; Of the allocated memory 14.00 GiB is allocated by "
        "PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated."
    )
    m = one(text)
    assert (m.format, m.fraction_rejected) == ("fraction-rejected", True)
    assert (m.requested_bytes, m.allowed_bytes, m.reserved_bytes) == (4 * GiB, 16 * GiB, 15 * GiB)
    bare = one(
        "torch.OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected because it would "
        "exceed per_process_memory_fraction limit."
    )
    assert (bare.format, bare.fraction_rejected, bare.requested_bytes) == ("fraction-rejected", True, None)


def test_hip_backend() -> None:
    m = one(
        "RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.98 GiB "
        "of which 1.00 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 1.50 GiB "
        "is reserved by PyTorch but unallocated."
    )
    assert (m.kind, m.format, m.extra, m.total_bytes) == (
        "cuda_oom",
        "2.2+",
        {"backend": "HIP"},
        b(63.98, GiB),
    )


@pytest.mark.parametrize(
    ("line", "exc", "error"),
    [
        ("RuntimeError: CUDA error: out of memory", "RuntimeError", "CUDA error: out of memory"),
        (
            "torch.AcceleratorError: CUDA error: out of memory",
            "torch.AcceleratorError",
            "CUDA error: out of memory",
        ),
        (
            "RuntimeError: CUDA driver error: out of memory",
            "RuntimeError",
            "CUDA driver error: out of memory",
        ),
        (
            "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCGeneral.cpp:50",
            "RuntimeError",
            "cuda runtime error (2) : out of memory",
        ),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "RuntimeError",
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED",
        ),
        ("ncclUnhandledCudaError: Call to CUDA function failed. Cuda failure 2 'out of memory'", None, None),
    ],
)
def test_cuda_error_without_numbers(line: str, exc: str | None, error: str | None) -> None:
    m = one(line)
    assert (m.kind, m.format) == ("cuda_oom", "cuda-error")
    if exc is not None:
        assert m.exception_type == exc
    if error is not None:
        assert m.extra["error"] == error
        assert m.text.startswith(error)
    assert m.requested_bytes is None and m.total_bytes is None


def test_cuda_error_followed_by_torch_hints() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "RuntimeError: CUDA error: out of memory\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )
    m = one(log)
    assert (m.format, m.line_no, m.text) == ("cuda-error", 3, "CUDA error: out of memory")


def test_nvml_assert_on_mig() -> None:
    line = (
        'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1154, '
        "please report a bug to PyTorch."
    )
    m = one(line)
    assert (m.kind, m.format, m.exception_type) == ("cuda_oom", "nvml-assert", "RuntimeError")
    assert m.text == line.removeprefix("RuntimeError: ")
    assert m.extra == {
        "assert": "NVML_SUCCESS == r",
        "file": "../c10/cuda/CUDACachingAllocator.cpp",
        "line": "1154",
    }
    long_form = (
        "RuntimeError: NVML_SUCCESS == DriverAPI::get()->nvmlDeviceGetHandleByPciBusId_v2_( pci_id, &nvml_device) "
        'INTERNAL ASSERT FAILED at "/opt/pytorch/c10/cuda/CUDACachingAllocator.cpp":1123, please report a bug '
        "to PyTorch."
    )
    m = one(long_form)
    assert m.format == "nvml-assert"
    assert m.extra["assert"].startswith("NVML_SUCCESS == DriverAPI::get()")
    assert m.extra["line"] == "1123"


def test_assert_without_exception_type() -> None:
    m = one(
        '  !handles_.at(i) INTERNAL ASSERT FAILED at "c10/cuda/CUDACachingAllocator.cpp":430, please report'
    )
    assert (m.format, m.exception_type, m.extra["assert"]) == ("allocator-assert", None, "!handles_.at(i)")
    m = one('[rank2]: what(): NVML_SUCCESS == r INTERNAL ASSERT FAILED at "CUDACachingAllocator.cpp":7')
    assert (m.format, m.rank, m.text) == (
        "nvml-assert",
        2,
        'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "CUDACachingAllocator.cpp":7',
    )


def test_other_allocator_assert() -> None:
    m = one(
        'RuntimeError: !handles_.at(i) INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":430, '
        "please report a bug to PyTorch."
    )
    assert (m.format, m.extra["assert"], m.extra["line"]) == ("allocator-assert", "!handles_.at(i)", "430")
    assert parse_messages('RuntimeError: x INTERNAL ASSERT FAILED at "../aten/src/ATen/Foo.cpp":1') == []


# ---------------------------------------------------------------------------------------- vGPU


def test_hami_core_oom_line() -> None:
    m = one(HAMI)
    assert (m.kind, m.format, m.device_index) == ("cuda_oom", "vgpu", 0)
    assert (m.vgpu_used_bytes, m.vgpu_limit_bytes) == (27147995136, 25757220864)
    assert m.extra == {"layer": "HAMi-core", "pid": "25", "location": "allocator.c:53"}
    assert m.text == HAMI


def test_hami_wrapped_usage_counter_is_flagged() -> None:
    m = one(
        "[HAMI-core ERROR (pid:38 thread=140412686483456 allocator.c:53)]: Device 0 OOM 18446744073604695040 / 5368709120"
    )
    assert m.vgpu_used_bytes == 18446744073604695040
    assert m.vgpu_limit_bytes == 5 * GiB
    assert m.extra["vgpu_used_wrapped"] == "true"


def test_hami_alloc_failed_and_attach_to_torch_message() -> None:
    log = "\n".join(
        [
            "[rank1]: " + HAMI,
            "[rank0]: [HAMI-core ERROR (pid:7 thread=1 allocator.c:9)]: Device 0 OOM 200 / 100",
            "[rank1]: [HAMI-core ERROR (pid:25 thread=139892685178688 allocator.c:115)]: cuMemoryAllocate failed res=2",
            "[rank1]: torch.OutOfMemoryError: " + V22_THIS,
        ]
    )
    found = parse_messages(log)
    assert [(m.format, m.rank) for m in found] == [
        ("vgpu", 1),
        ("vgpu", 0),
        ("vgpu-alloc-failed", 1),
        ("2.2+", 1),
    ]
    assert found[2].extra["cuda_result"] == "2"
    # the torch message gets the numbers of the vGPU line of its own rank
    assert (found[3].vgpu_used_bytes, found[3].vgpu_limit_bytes) == (27147995136, 25757220864)


# ---------------------------------------------------------------------------------------- shm


def test_shm_unable_to_write() -> None:
    m = one("RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)")
    assert (m.kind, m.format, m.exception_type) == ("shm_exhausted", "shm-unable-to-write", "RuntimeError")
    assert m.extra == {"path": "/torch_18692_1954506624", "error": "No space left on device", "errno": "28"}
    assert m.text == "unable to write to file </torch_18692_1954506624>: No space left on device (28)"


def test_shm_no_space_alone() -> None:
    m = one("ERROR: No space left on device (28)")
    assert (m.kind, m.format, m.extra) == ("shm_exhausted", "shm-no-space", {"errno": "28"})
    m = one("OSError: [Errno 28] No space left on device: '/dev/shm/abc'")
    assert (m.format, m.exception_type, m.extra["path"]) == ("shm-no-space", "OSError", "/dev/shm/abc")
    # a full disk elsewhere is not shared memory
    assert parse_messages("OSError: [Errno 28] No space left on device: '/checkpoints/model.pt'") == []


def test_shm_allocate_and_mmap() -> None:
    m = one(
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_9_8_7>: "
        "Resource temporarily unavailable (11)"
    )
    assert (m.format, m.extra["path"], m.extra["errno"]) == ("shm-unable-to-allocate", "/torch_9_8_7", "11")
    m = one(
        "RuntimeError: unable to mmap 1048576 bytes from file </torch_1_2_3>: Cannot allocate memory (12)"
    )
    assert (m.format, m.requested_bytes, m.extra["errno"]) == ("shm-unable-to-mmap", MiB, "12")


def test_dataloader_bus_error() -> None:
    line = (
        "RuntimeError: DataLoader worker (pid 12345) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit."
    )
    m = one(line)
    assert (m.kind, m.format, m.worker_pid, m.extra) == (
        "shm_exhausted",
        "shm-bus-error",
        12345,
        {"signal": "Bus error"},
    )
    assert m.text == line.removeprefix("RuntimeError: ")


def test_worker_unexpected_bus_error() -> None:
    m = one(
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
        "memory (shm)."
    )
    assert (m.kind, m.format) == ("shm_exhausted", "shm-worker-bus-error")


def test_nccl_shm() -> None:
    m = one(
        "node1:1234:1300 [0] include/shm.h:28 NCCL WARN Error: failed to extend /dev/shm/nccl-03v824 to 9637892 bytes"
    )
    assert (m.kind, m.format, m.requested_bytes, m.extra) == (
        "shm_exhausted",
        "shm-nccl",
        9637892,
        {"path": "/dev/shm/nccl-03v824"},
    )


def test_nccl_shm_segment_after_fallocate_fails() -> None:
    """Newer NCCL: posix_fallocate finds no space, then the segment creation error names path and size."""
    m = one(
        "gpu-node-17:31:88 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
        "gpu-node-17:31:88 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-8x2Kq3 (size 9637888)\n"
    )
    assert (m.kind, m.format, m.requested_bytes, m.extra) == (
        "shm_exhausted",
        "shm-nccl",
        9637888,
        {"path": "/dev/shm/nccl-8x2Kq3"},
    )
    assert one("Error while creating shared memory segment /dev/shm/nccl-x").requested_bytes is None


# ---------------------------------------------------------------------------------------- host


def test_killed_as_last_output() -> None:
    m = one("epoch 1 step 10 loss 2.3\nepoch 1 step 20 loss 2.1\nKilled\n\n")
    assert (m.kind, m.format, m.line_no, m.exit_code, m.text) == ("host_oom", "host-killed", 3, 137, "Killed")


def test_killed_followed_by_more_output_is_not_an_oom() -> None:
    assert parse_messages("Killed\nepoch 2 step 1 loss 2.0\n") == []
    assert parse_messages("the job Killed the mood\n") == []


def test_killed_then_exit_code_is_one_event() -> None:
    m = one("step 5\nKilled\nERROR: process exited with code 137\n")
    assert (m.format, m.line_no, m.exit_code) == ("host-killed", 2, 137)


@pytest.mark.parametrize(
    "line",
    [
        "command terminated with exit code 137",
        "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 137.",
        "    Exit Code:    137",
        '{"exitCode": 137, "reason": "Error"}',
        "Process finished with exit_code=137",
        "The container exited with status 137",
    ],
)
def test_exit_code_137(line: str) -> None:
    m = one(line)
    assert (m.kind, m.format, m.exit_code) == ("host_oom", "host-exit-137", 137)


@pytest.mark.parametrize("line", ["exit code 1", "exit code 1370", "took 137 ms", "exit code 137.5"])
def test_not_exit_code_137(line: str) -> None:
    assert parse_messages(line) == []


def test_kubectl_describe_oomkilled() -> None:
    log = (
        "    State:          Waiting\n"
        "      Reason:       CrashLoopBackOff\n"
        "    Last State:     Terminated\n"
        "      Reason:       OOMKilled\n"
        "      Exit Code:    137\n"
        "      Started:      Wed, 01 May 2024 12:00:00 +0000\n"
    )
    m = one(log)
    assert (m.kind, m.format, m.line_no, m.exit_code, m.text) == (
        "host_oom",
        "host-oomkilled",
        4,
        137,
        "Reason:       OOMKilled",
    )


def test_kernel_oom_killer_lines_are_one_event() -> None:
    log = (
        "May  1 12:00:00 node1 kernel: [123456.789012] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL)\n"
        "May  1 12:00:00 node1 kernel: [123456.789100] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        "cpuset=abc,mems_allowed=0,oom_memcg=/kubepods/pod1,task_memcg=/kubepods/pod1/c1,task=python,pid=4242,"
        "uid=0\n"
        "May  1 12:00:00 node1 kernel: [123456.789200] Memory cgroup out of memory: Killed process 4242 (python) "
        "total-vm:123456kB, anon-rss:1048576kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2048kB "
        "oom_score_adj:0\n"
    )
    m = one(log)
    assert (m.kind, m.format, m.line_no, m.exit_code) == ("host_oom", "host-kernel-oom", 2, 137)
    assert m.extra == {
        "pid": "4242",
        "process": "python",
        "signal": "SIGKILL",
        "constraint": "CONSTRAINT_MEMCG",
        "cgroup": "true",
        "anon_rss_bytes": str(1048576 * 1024),
    }


def test_torchrun_sigkill_agent_line_and_summary_are_one_event() -> None:
    log = (
        "E0501 12:00:02.000000 140 torch/distributed/elastic/multiprocessing/api.py:862] failed (exitcode: -9) "
        "local_rank: 0 (pid: 4242) of binary: /usr/bin/python\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2024-05-01_12:00:02\n"
        "  host      : node-1\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -9 (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 4242\n"
        "============================================================\n"
    )
    m = one(log)
    assert (m.kind, m.format, m.line_no, m.rank, m.exit_code) == ("host_oom", "host-sigkill", 1, 0, 137)
    assert m.extra == {"signal": "SIGKILL", "pid": "4242", "local_rank": "0"}


def test_slurm_oom() -> None:
    found = parse_messages(
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.batch. Some of the step tasks have been "
        "OOM Killed.\nsrun: error: node1: task 3: Out Of Memory\n"
    )
    assert [(m.format, m.rank) for m in found] == [("host-slurm-oom", None), ("host-slurm-oom", 3)]
    assert found[0].extra == {"events": "1", "step": "1234.batch"}


def test_slurm_accounting_kill_over_the_job_memory_limit() -> None:
    """slurmstepd's accounting poll (no cgroup enforcement) kills a job over its limit; the figures are KiB."""
    log = (
        "slurmstepd: error: Job 552190 exceeded memory limit (1048837120 > 1048576000), being killed\n"
        "slurmstepd: error: Exceeded job memory limit\n"
        "srun: error: gpu-c-021: tasks 0-7: Killed\n"
    )
    found = parse_messages(log)
    assert found and all(m.format == "host-slurm-oom" for m in found)
    first = found[0]
    assert first.extra == {
        "step": "552190",
        "usage_bytes": str(1048837120 * 1024),
        "limit_bytes": str(1048576000 * 1024),
    }
    # a limit named without the kill is no event
    assert parse_messages("sbatch: job memory limit is 1000G (--mem)\n") == []


@pytest.mark.parametrize(
    ("line", "fmt", "numbers", "extra"),
    [
        (
            "ValueError: Free memory on device (31.52/79.19 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            "vllm-startup",
            (b(71.27, GiB), b(79.19, GiB), b(31.52, GiB)),
            {"engine": "vllm", "gpu_memory_utilization": "0.9"},
        ),
        (
            "(EngineCore pid=253) ValueError: Free memory on device cuda:0 (85.92/121.69 GiB) on startup is less "
            "than desired GPU memory utilization (0.92, 111.95 GiB).",
            "vllm-startup",
            (b(111.95, GiB), b(121.69, GiB), b(85.92, GiB)),
            {"engine": "vllm", "gpu_memory_utilization": "0.92"},
        ),
        (
            "ERROR 12-18 10:44:40 engine.py:366] ValueError: No available memory for the cache blocks. Try "
            "increasing `gpu_memory_utilization` when initializing the engine.",
            "serving-config",
            (None, None, None),
            {"engine": "vllm", "limit": "kv-cache"},
        ),
        (
            "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
            "stored in KV cache (28752). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
            "serving-config",
            (None, None, None),
            {"engine": "vllm", "limit": "kv-cache", "max_model_len": "131072", "kv_tokens": "28752"},
        ),
        (
            "ValueError: To serve at least one request with the models's max seq len (40960), (5.62 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (4.50 GiB). Based on the available memory, "
            "the estimated maximum model length is 32768.",
            "serving-config",
            (b(5.62, GiB), None, None),
            {
                "engine": "vllm",
                "limit": "kv-cache",
                "max_model_len": "40960",
                "kv_available_bytes": str(b(4.5, GiB)),
            },
        ),
        (
            "RuntimeError: Not enough memory to handle 32000 prefill tokens. You need to decrease "
            "`--max-batch-prefill-tokens`",
            "serving-config",
            (None, None, None),
            {"engine": "tgi", "limit": "prefill", "prefill_tokens": "32000"},
        ),
    ],
)
def test_an_inference_servers_own_words_at_start_up(
    line: str, fmt: str, numbers: tuple[int | None, ...], extra: dict[str, str]
) -> None:
    m = one(line + "\n")
    assert (m.kind, m.format) == ("cuda_oom", fmt)
    assert (m.requested_bytes, m.total_bytes, m.free_bytes) == numbers
    assert m.extra == extra
    assert m.exception_type in ("ValueError", "RuntimeError")


@pytest.mark.parametrize(
    ("line", "left"),
    [
        (
            "INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch "
            "activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
            "0",
        ),
        (
            "(EngineCore_0 pid=88) INFO 05-02 11:03:12 [gpu_worker.py:276] Available KV cache memory: -0.52 GiB",
            "0",
        ),
        ("INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681", "0"),
        ("INFO 01-10 08:00:00 llm_engine.py:300] # GPU blocks: 0, # CPU blocks: 2048", "0"),
    ],
)
def test_an_inference_servers_profile_that_left_nothing_for_its_kv_cache(line: str, left: str) -> None:
    """The profile vLLM logs before it raises: when the error itself was cut from the log, these lines say
    the same (the weights and the activation peak took the whole budget)."""
    m = one(line + "\n")
    assert (m.kind, m.format) == ("cuda_oom", "serving-config")
    assert m.extra == {"engine": "vllm", "limit": "kv-cache", "kv_available_bytes": left}


@pytest.mark.parametrize(
    "line",
    [
        "INFO 02-26 09:54:05 worker.py:267] the rest of the memory reserved for KV Cache is 31.05GiB.",
        "INFO 05-02 11:03:12 [gpu_worker.py:276] Available KV cache memory: 60.52 GiB",
        "INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 10452, # CPU blocks: 0",
    ],
)
def test_a_profile_that_left_room_for_the_kv_cache_is_no_error(line: str) -> None:
    assert parse_messages(line + "\n") == []


def test_a_notebook_restarted_for_lack_of_ram() -> None:
    m = one(
        "Your session crashed after using all available RAM. If you are interested in access to high-RAM "
        "runtimes, you may want to check out Colab Pro.\n"
    )
    assert (m.kind, m.format, m.exit_code) == ("host_oom", "host-notebook-ram", 137)
    assert m.text.startswith("Your session crashed")


def test_a_message_inside_a_json_record_ends_at_its_escaped_newline() -> None:
    m = one(
        '{"level": "ERROR", "message": "ERROR: Unexpected bus error encountered in worker. This might be caused '
        'by insufficient shared memory (shm).\\nTraceback (most recent call last):\\n  File \\"/app/train.py\\", '
        'line 55"}\n'
    )
    assert m.kind == "shm_exhausted"
    assert m.text.endswith("(shm).") and "Traceback" not in m.text


def test_bash_job_killed_line() -> None:
    m = one(
        "/var/spool/slurmd/job1/slurm_script: line 12:  4242 Killed                  python train.py\nnext\n"
    )
    assert (m.format, m.exit_code, m.extra) == ("host-killed", 137, {"signal": "SIGKILL", "pid": "4242"})


def test_dataloader_worker_killed_and_cpu_allocator() -> None:
    found = parse_messages(
        "RuntimeError: DataLoader worker (pid 777) is killed by signal: Killed.\n"
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 137438953472 bytes. Error code 12 (Cannot allocate memory)\n"
        "RuntimeError: DataLoader worker (pid 778) is killed by signal: Segmentation fault.\n"
    )
    assert [(m.kind, m.format) for m in found] == [
        ("host_oom", "host-worker-killed"),
        ("host_oom", "host-cpu-alloc"),
    ]
    assert (found[0].worker_pid, found[0].exit_code) == (777, 137)
    assert found[1].requested_bytes == 128 * GiB


# ------------------------------------------------------------------------------- logs, prefixes, ranks


@pytest.mark.parametrize(
    ("prefix", "rank", "local"),
    [
        ("[rank3]: ", 3, None),
        ("[rank3]:", 3, None),
        ("[default3]:", 3, "3"),
        ("[trainer3]:", 3, "3"),
        ("[default1]:[rank9]: ", 9, "1"),
        ("3: ", 3, None),
        ("  3: ", 3, None),
        ("[3]: ", 3, None),
        ("[1,3]<stderr>:", 3, None),
        ("rank 3: ", 3, None),
        ("[Rank 3] ", 3, None),
        ("2024-05-01T12:00:00.123456789Z stderr F [rank3]: ", 3, None),
        ("[2024-05-01 12:00:00,123] [rank3]: ", 3, None),
        ("2024-05-01 12:00:00,123 [default3]:", 3, "3"),
        ("(RayTrainWorker pid=1234, ip=10.0.0.1) [rank3]: ", 3, None),
        ("2024-05-01T12:00:00Z ", None, None),
        ("May  1 12:00:00 ", None, None),
    ],
)
def test_rank_and_timestamp_prefixes(prefix: str, rank: int | None, local: str | None) -> None:
    m = one(prefix + "torch.OutOfMemoryError: " + V22)
    assert (m.rank, m.extra.get("local_rank"), m.exception_type, m.text) == (
        rank,
        local,
        "torch.OutOfMemoryError",
        V22,
    )
    assert m.allocated_bytes == 47 * GiB


def test_rank_named_in_the_log_record() -> None:
    m = one("2024-05-01 12:00:00 ERROR [rank 5] step 100 failed: " + PRE21)
    assert (m.rank, m.format) == (5, "pre-2.1")


def test_ansi_colours_and_crlf() -> None:
    m = one("\x1b[31mtorch.OutOfMemoryError\x1b[0m: " + V22_THIS + "\r\n")
    assert (m.exception_type, m.format, m.text) == ("torch.OutOfMemoryError", "2.2+", V22_THIS)


def test_repr_and_json_embedded_messages() -> None:
    m = one("caught RuntimeError('" + CACHED + "')")
    assert (m.exception_type, m.format, m.text) == ("RuntimeError", "pre-2.1-cached", CACHED)
    m = one('{"level": "error", "msg": "' + PRE21.split(")")[0] + ')", "ts": 1}')
    assert m.text == PRE21.split(")")[0] + ")"
    assert m.reserved_bytes == b(30.40, GiB)


MULTI_RANK = "\n".join(
    [
        "[2024-05-01 12:00:00,001] torch.distributed.run: [WARNING] Setting OMP_NUM_THREADS",
        "[default0]:step 100 loss 1.234 memory 71.2 GiB",
        "[default1]:step 100 loss 1.236 memory 71.9 GiB",
        "[default0]:[rank0]: Traceback (most recent call last):",
        "[default1]:[rank1]: Traceback (most recent call last):",
        '[default0]:[rank0]:   File "/app/train.py", line 88, in <module>',
        "[default2]:[rank2]: torch.OutOfMemoryError: " + V21.replace("GPU 1 has", "GPU 2 has"),
        "[default0]:[rank0]: torch.OutOfMemoryError: " + V22,
        "[default1]:[rank1]: torch.OutOfMemoryError: " + V22_THIS,
        "[default3]:[rank3]: RuntimeError: " + PRE21,
    ]
)


def test_several_ranks_one_message_each_in_order() -> None:
    found = parse_messages(MULTI_RANK)
    assert [(m.rank, m.format, m.line_no) for m in found] == [
        (2, "2.1", 7),
        (0, "2.2+", 8),
        (1, "2.2+", 9),
        (3, "pre-2.1", 10),
    ]
    assert [m.extra["local_rank"] for m in found] == ["2", "0", "1", "3"]
    assert found[0].device_index == 2
    assert found[2].processes == [ProcessUsage(None, b(23.33, GiB), True)]
    assert parse_message(MULTI_RANK) == found[0]


def test_identical_messages_from_different_ranks_are_kept() -> None:
    log = "[rank0]: torch.OutOfMemoryError: " + V22 + "\n[rank1]: torch.OutOfMemoryError: " + V22 + "\n"
    assert [m.rank for m in parse_messages(log)] == [0, 1]


# The hard-wrapped case: a log shipper cut each line at a fixed width, mid-word and mid-number;
# torchrun prefixed every piece and two ranks interleave.
HARD_WRAPPED = "\n".join(
    [
        "2024-05-01T12:00:00.000000001Z stderr F [default0]:[rank0]: Traceback (most recent call last):",
        "2024-05-01T12:00:00.000000003Z stderr F [default0]:[rank0]: torch.OutOfMemoryError: CUDA out of memory."
        " Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.",
        "2024-05-01T12:00:00.000000003Z stderr F [default1]:[rank1]: torch.OutOfMemoryError: CUDA out of memory."
        " Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.10 GiB of which 1.",
        "2024-05-01T12:00:00.000000004Z stderr F [default0]:[rank0]: 10 GiB of which 1.50 GiB is free. Process 4"
        "242 has 77.59 GiB memory in use. Of the alloc",
        "2024-05-01T12:00:00.000000004Z stderr F [default1]:[rank1]: 20 GiB is free. Process 4243 has 77.89 GiB "
        "memory in use. Of the allocated memory 75.00 GiB is allocated by Py",
        "2024-05-01T12:00:00.000000005Z stderr F [default0]:[rank0]: ated memory 75.00 GiB is allocated by "
        "PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
        "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-var",
        "2024-05-01T12:00:00.000000005Z stderr F [default1]:[rank1]: Torch, and 1.",
        "2024-05-01T12:00:00.000000005Z stderr F [default0]:[rank0]: iables)",
        "2024-05-01T12:00:00.000000006Z stderr F [default1]:[rank1]: 00 GiB is reserved by PyTorch but unallocated.",
        "2024-05-01T12:00:00.000000007Z stderr F [default1]:[rank1]: [W501 12:00:00.1 ProcessGroupNCCL.cpp:1] x",
    ]
)


def test_hard_wrapped_interleaved_ranks_are_joined() -> None:
    found = parse_messages(HARD_WRAPPED)
    assert [(m.rank, m.line_no, m.format) for m in found] == [(0, 2, "2.2+"), (1, 3, "2.2+")]
    r0, r1 = found
    assert r0.text == (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.50 GiB "
        "is free. Process 4242 has 77.59 GiB memory in use. Of the allocated memory 75.00 GiB is allocated by "
        "PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    assert (r0.total_bytes, r0.free_bytes, r0.processes) == (
        b(79.10, GiB),
        b(1.50, GiB),
        [ProcessUsage(4242, b(77.59, GiB), False)],
    )
    assert (r0.allocated_bytes, r0.reserved_bytes) == (75 * GiB, 76 * GiB)
    assert (r1.device_index, r1.free_bytes, r1.reserved_unallocated_bytes) == (1, b(1.20, GiB), GiB)
    assert r1.processes == [ProcessUsage(4243, b(77.89, GiB), False)]


def test_word_wrapped_message_is_joined_with_spaces() -> None:
    # real: a word-wrapper dropped the space at each break
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 304.00 MiB.\n"
        "GPU 0 has a total capacity of 94.97 GiB of which 218.81 MiB is free.\n"
        "Including non-PyTorch memory, this process has 93.84 GiB memory in use.\n"
        "Of the allocated memory 91.19 GiB is allocated by PyTorch, with 118.00 MiB\n"
        "allocated in private pools (e.g., CUDA Graphs), and 744.36 MiB is reserved by\n"
        "PyTorch but unallocated.\n"
        "```\n"
    )
    m = one(log)
    assert m.text == (
        "CUDA out of memory. Tried to allocate 304.00 MiB. GPU 0 has a total capacity of 94.97 GiB of which 218.81 "
        "MiB is free. Including non-PyTorch memory, this process has 93.84 GiB memory in use. Of the allocated "
        "memory 91.19 GiB is allocated by PyTorch, with 118.00 MiB allocated in private pools (e.g., CUDA Graphs), "
        "and 744.36 MiB is reserved by PyTorch but unallocated."
    )
    assert (m.requested_bytes, m.total_bytes, m.free_bytes) == (304 * MiB, b(94.97, GiB), b(218.81, MiB))
    assert (m.private_pool_bytes, m.reserved_unallocated_bytes) == (118 * MiB, b(744.36, MiB))
    assert m.processes == [ProcessUsage(None, b(93.84, GiB), True)]


def test_wrapped_inside_comments_and_pytest_output() -> None:
    commented = (
        "# RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; "
        "130.35 MiB already\n"
        "# allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory is >> "
        "allocated memory try\n"
        "# setting max_split_size_mb to avoid fragmentation.\n"
        "# See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n"
        "x = 1\n"
    )
    m = one(commented)
    assert (m.format, m.allocated_bytes, m.free_bytes, m.reserved_bytes) == (
        "pre-2.1",
        b(130.35, MiB),
        b(47.06, MiB),
        188 * MiB,
    )
    assert m.text.endswith("See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    pytest_out = (
        "E   torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity "
        "of 23.52 GiB of which 9.75 MiB\n"
        "E   is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use. Of the allocated "
        "memory\n"
        "E   22.59 GiB is allocated by PyTorch, with 79.87 MiB allocated in private pools (e.g., CUDA Graphs), "
        "and 352.99\n"
        "E   MiB is reserved by PyTorch but unallocated.\n"
        "\n"
        "tests/test_model.py:12: OutOfMemoryError\n"
    )
    m = one(pytest_out)
    assert (m.free_bytes, m.allocated_bytes, m.reserved_unallocated_bytes) == (
        b(9.75, MiB),
        b(22.59, GiB),
        b(352.99, MiB),
    )


def test_wrapped_message_stops_at_the_next_record() -> None:
    log = (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity;\n"
        "Traceback (most recent call last):\n"
        "ValueError: something else 30.29 GiB already allocated\n"
    )
    m = one(log)
    assert (m.format, m.total_bytes, m.allocated_bytes) == ("pre-2.1", b(31.75, GiB), None)
    assert m.text == "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity;"


def test_continuation_without_the_first_lines_timestamp() -> None:
    log = (
        "2024-05-01 12:00:00,123 ERROR train: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 MiB. GPU 0 has a total capacity of 47.53 GiB of which 896.00\n"
        "KiB is free. Process 1686436 has 47.51 GiB memory in use. Of the allocated memory 47.00 GiB is\n"
        "allocated by PyTorch, and 149.10 MiB is reserved by PyTorch but unallocated.\n"
        "2024-05-01 12:00:00,124 INFO train: shutting down\n"
    )
    m = one(log)
    assert (m.free_bytes, m.allocated_bytes, m.reserved_bytes) == (
        896 * KiB,
        47 * GiB,
        47 * GiB + b(149.10, MiB),
    )
    assert m.processes == [ProcessUsage(1686436, b(47.51, GiB), False)]


def test_decoration_is_only_stripped_when_it_matches() -> None:
    log = (
        "E   RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity;\n"
        "E   30.29 GiB already allocated; 3.75 MiB free; 30.40 GiB reserved in total by PyTorch)\n"
    )
    m = one(log)
    assert (m.allocated_bytes, m.reserved_bytes) == (b(30.29, GiB), b(30.40, GiB))
    # a continuation that merely starts with the same letter keeps it
    log = (
        "E   RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity;\n"
        "Every 30.29 GiB already allocated; 3.75 MiB free; 30.40 GiB reserved in total by PyTorch)\n"
    )
    m = one(log)
    assert "capacity; Every 30.29 GiB" in m.text


def test_message_and_other_evidence_on_one_line() -> None:
    line = "job failed: RuntimeError: " + PRE21.split(")")[0] + ") ; container exit code 137"
    found = parse_messages(line)
    assert [(m.kind, m.format) for m in found] == [("host_oom", "host-exit-137"), ("cuda_oom", "pre-2.1")]
    assert found[1].text == PRE21.split(")")[0] + ")"
    assert found[1].exception_type == "RuntimeError"


def test_exception_type_at_the_start_of_the_line() -> None:
    m = one("RuntimeError: step 3 failed: " + PRE21)
    assert (m.exception_type, m.format) == ("RuntimeError", "pre-2.1")
    m = one("HIP error: out of memory")
    assert (m.format, m.extra["error"], m.exception_type) == ("cuda-error", "HIP error: out of memory", None)


def test_truncated_message_is_unknown_format() -> None:
    m = one("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB.")
    assert (m.format, m.requested_bytes, m.total_bytes) == ("unknown", 2 * MiB, None)


# --------------------------------------------------------------------------------------------- dedupe


def test_traceback_chain_is_one_message() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 10, in step\n'
        "torch.OutOfMemoryError: " + V22 + "\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 20, in main\n'
        "RuntimeError: " + V22 + "\n"
    )
    m = one(log)
    assert (m.line_no, m.exception_type) == (3, "torch.OutOfMemoryError")


def test_torchrun_error_summary_repeats_the_message() -> None:
    log = (
        "[default1]:[rank1]: torch.OutOfMemoryError: " + V22_THIS + "\n"
        "[default0]:[rank0]: torch.OutOfMemoryError: " + V22 + "\n"
        "E0501 12:00:02.000000 140 api.py:862] failed (exitcode: 1) local_rank: 1 (pid: 4243) of binary: python\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n"
        "[1]:\n"
        "  time      : 2024-05-01_12:00:02\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 4242)\n"
        "  traceback : Traceback (most recent call last):\n"
        "  torch.OutOfMemoryError: " + V22 + "\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 1 (pid: 4243)\n"
        "  traceback : Traceback (most recent call last):\n"
        '    File "/app/train.py", line 88, in <module>\n'
        "  torch.OutOfMemoryError: " + V22_THIS + "\n"
        "============================================================\n"
    )
    found = parse_messages(log)
    assert [(m.rank, m.line_no) for m in found] == [(1, 1), (0, 2)]


def test_summary_gives_a_rank_to_an_unprefixed_message() -> None:
    log = (
        "torch.OutOfMemoryError: " + V22 + "\n"
        "============================================================\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  rank      : 5 (local_rank: 1)\n"
        "  traceback : Traceback (most recent call last):\n"
        "  torch.OutOfMemoryError: " + V22 + "\n"
        "============================================================\n"
    )
    m = one(log)
    assert (m.line_no, m.rank, m.extra.get("local_rank")) == (1, 5, "1")


def test_same_message_far_apart_counts_twice() -> None:
    filler = "step ok\n" * (DEDUPE_WINDOW_LINES + 5)
    log = "RuntimeError: " + PRE21 + "\n" + filler + "RuntimeError: " + PRE21 + "\n"
    assert [m.line_no for m in parse_messages(log)] == [1, DEDUPE_WINDOW_LINES + 7]


def test_same_message_after_an_elastic_restart_counts_twice() -> None:
    log = (
        "[rank0]: torch.OutOfMemoryError: " + V22 + "\n"
        "[WARNING] Worker group FAILED. 2/3 attempts left; will restart worker group\n"
        "[rank0]: torch.OutOfMemoryError: " + V22 + "\n"
    )
    assert [(m.rank, m.line_no) for m in parse_messages(log)] == [(0, 1), (0, 3)]


def test_rewrapped_copy_is_still_a_duplicate() -> None:
    wrapped = V22_THIS.replace("is free. ", "is free.\n")
    log = "torch.OutOfMemoryError: " + wrapped + "\nsummary:\ntorch.OutOfMemoryError: " + V22_THIS + "\n"
    m = one(log)
    assert m.line_no == 1 and m.reserved_unallocated_bytes == b(797.79, MiB)


# ---------------------------------------------------------------------------------------- negatives


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n\n",
        "step 100 loss 1.2 memory allocated 31.2 GiB reserved 33.0 GiB max memory 40 GiB\n"
        "torch.cuda.memory_summary(): |  Allocated memory | 12.00 GiB | 30.00 GiB |\n",
        'if "CUDA out of memory" in str(e):\n    retry()\n',
        'OOM_MARKERS = ("CUDA error: out of memory",)\n',
        "Setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to reduce memory fragmentation\n",
        "warning: shared memory is small; see docs on /dev/shm\n",
        "Free memory: 10 GiB. Process 1234 has 2.00 GiB memory in use.\n",
        "pod pid 1370 exited 0; killed_count=0\n",
        "Bus error (core dumped) in an unrelated tool\n",
    ],
)
def test_logs_without_an_oom(text: str) -> None:
    assert parse_messages(text) == []
    assert parse_message(text) is None


# ------------------------------------------------------------------------------------ robustness


def test_never_raises_on_random_text() -> None:
    rng = random.Random(1234)
    pieces = [
        "CUDA out of memory. ",
        "Tried to allocate ",
        "20.00 MiB",
        " (GPU ",
        "; ",
        " GiB total capacity",
        "[rank",
        "]: ",
        "Killed",
        "\n",
        "\r",
        "\x1b[31m",
        "exit code 137",
        "OOMKilled",
        "[HAMI-core ERROR (pid:",
        ")]: Device 0 OOM ",
        " / ",
        "unable to write to file <",
        ">: No space left on device (28)",
        'INTERNAL ASSERT FAILED at "',
        'CUDACachingAllocator.cpp":',
        "is reserved by PyTorch but unallocated",
        "Process ",
        " has ",
        "memory in use",
        "99999999999999999999999",
        "\x00\xff\ud7ff",
        " " * 50,
    ]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        for m in parse_messages(text):
            assert m.kind in ("cuda_oom", "shm_exhausted", "host_oom")
            assert m.line_no is not None and m.line_no >= 1
    for _ in range(100):
        blob = bytes(rng.randrange(256) for _ in range(rng.randint(0, 2000))).decode("latin-1")
        assert isinstance(parse_messages(blob), list)


def test_long_lines_and_pathological_runs_finish() -> None:
    texts = [
        "x" * 2_000_000 + " RuntimeError: " + PRE21 + " " + "y" * 1_000_000,
        "CUDA out of memory. " * 100_000,
        "RuntimeError: CUDA out of memory. Tried to allocate " + "9" * 1_000_000 + " MiB",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
        + " " * 1_000_000
        + "1.00 GiB",
        "[" * 500_000 + "rank" + "1" * 100_000,
        "Killed\n" * 50_000,
    ]
    results = [parse_messages(t) for t in texts]
    assert [len(r) for r in results] == [1, 1, 1, 1, 0, 1]
    assert results[0][0].reserved_bytes == b(30.40, GiB)
    assert results[3][0].total_bytes is None


def test_five_megabyte_log() -> None:
    filler = "[default3]:[rank3]: 2024-05-01 12:00:00,123 INFO step 1137 loss=0.1234 lr=3e-4 mem 12.3 GiB\n"
    log = filler * 30_000 + MULTI_RANK + "\n" + filler * 30_000 + "[rank3]: RuntimeError: " + CACHED + "\n"
    assert len(log) > 5_000_000
    found = parse_messages(log)
    assert [(m.rank, m.format) for m in found] == [
        (2, "2.1"),
        (0, "2.2+"),
        (1, "2.2+"),
        (3, "pre-2.1"),
        (3, "pre-2.1-cached"),
    ]
    assert found[-1].line_no == 60_000 + MULTI_RANK.count("\n") + 2


def test_a_hard_wrap_that_cut_the_word_cuda() -> None:
    """A terminal wrapped at 80 columns without regard to words: "CUD" ends one line, "A out of memory.
    Tried to allocate …" begins the next. The allocator's own words still make it a CUDA OOM."""
    text = (
        "| WARNING | fairseq.trainer | OOM: Ran out of memory with exception: CUD\n"
        "A out of memory. Tried to allocate 3.02 GiB (GPU 1; 23.70 GiB total capacity; \n"
        "16.92 GiB already allocated; 1019.69 MiB free; 21.03 GiB reserved in total by \n"
        "PyTorch)                                                                      \n"
    )
    [m] = parse_messages(text)
    assert (m.kind, m.format, m.device_index) == ("cuda_oom", "pre-2.1", 1)
    assert m.reserved_bytes == b(21.03, GiB) and m.requested_bytes == b(3.02, GiB)
    # a sentence that merely says "out of memory" is not one
    assert parse_messages("A out of memory condition was logged by the agent.\n") == []
