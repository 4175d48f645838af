"""What launchers, servers and the kernel print around a failure, read for what it says of the cause.

- The ranks of one job step together (each step's collectives wait for every rank), and often rank 0 alone
  draws the progress bar: its ``0/N`` says no step had finished on the failing rank either.
- Host memory that grew while the job loaded its data, before any training step, is a load the limit does
  not hold; growth across training steps stays the job's own (pinned in test_platform_readings.py).
- DeepSpeed's launcher reports a SIGKILL as ``exits with return code = -9``; NCCL before 2.19 names its
  shared-memory segment without its folder.
- A worker's SIGBUS is a full /dev/shm when it faults writing a batch into shared memory (the collate
  function); faulthandler's stack in a dataset's ``__getitem__`` is a memory-mapped file that could not be
  read.
- A memory fraction the job's logger says it set from a file named without a folder is the job's own.
- Triton's Python backend runs one stub process per model instance: in Triton's own log, the server and
  its stubs are one service, not neighbours; a model that fails to load is a deployment too large for its
  GPU, as is torch.compile's autotuning on its first call.
- detectron2 prints only each period's peak (``max_mem``): earlier peaks above what the failing moment
  needed, with large holes, are fragmentation.

The lines follow torchrun's, DeepSpeed's, NCCL's, faulthandler's, Triton's, Inductor's and detectron2's
own output (none of them runs here).
"""

from __future__ import annotations

from triage.messages import bus_error_frame, first_step_bar, parse_messages
from triage.pipeline import diagnose_text

OOM_L4 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU {g} has a total capacity of "
    "22.03 GiB of which 834.72 MiB is free. Including non-PyTorch memory, this process has 21.21 GiB memory in "
    "use. Of the allocated memory 20.74 GiB is allocated by PyTorch, and 86.00 MiB is reserved by PyTorch but "
    "unallocated."
)


def _rank_tb(rank: int) -> str:
    return (
        f"[rank{rank}]:Traceback (most recent call last):\n"
        f'[rank{rank}]:  File "/app/pretrain.py", line 131, in main\n'
        f"[rank{rank}]:    loss = model(x, y)\n"
        f"[rank{rank}]:" + OOM_L4.format(g=rank) + "\n"
    )


def test_rank_zeros_bar_at_zero_says_the_first_step_had_not_finished_on_any_rank() -> None:
    head = "[rank0]:after model+optimizer init: torch.cuda.memory_allocated=2.51 GiB\n"
    bar = "[rank0]:Epoch 0:   0%|          | 0/5000 [00:00<?, ?it/s]\n"
    text = head + bar + _rank_tb(3)
    assert first_step_bar(text, text.count("\n")) == "0/5000"
    d, ev = diagnose_text(text)
    assert ev.message is not None and ev.message.rank == 3 and ev.first_step_bar == "0/5000"
    assert d.verdict == "workload_too_large", d.headline
    # rank 0 had drawn steps: the failing rank had run them too
    moved = head + bar + "[rank0]:Epoch 0:   1%|          | 40/5000 [00:21<44:10, 1.9it/s]\n" + _rank_tb(3)
    d, ev = diagnose_text(moved)
    assert ev.first_step_bar is None and d.verdict != "workload_too_large"


KILLED = (
    "E0312 10:04:57.254000 1402 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
    "local_rank: 2 (pid: 33102) of binary: /usr/bin/python\n"
    "[Tue Mar 12 10:04:07 2024] Memory cgroup out of memory: Killed process 33102 (python) "
    "total-vm:341228316kB, anon-rss:224871632kB, file-rss:301220kB, shmem-rss:0kB\n"
)


def test_host_memory_that_grew_while_loading_is_a_load_the_limit_does_not_hold() -> None:
    loading = "".join(
        f"[rank2]:caching feature shard {k}/16 in RAM (rss {15.3 * k:.1f} GiB)\n" for k in range(1, 15)
    )
    d, ev = diagnose_text(loading + KILLED)
    assert ev.host_growth is not None and ev.host_growth[4] is False
    assert d.verdict == "host_memory_limit", d.headline
    assert any("while it loaded its data" in e.fact for e in d.evidence)
    # the same growth printed at training steps: the job's own growth, the kill at a lower confidence
    training = "".join(f"[rank2]:step {100 * k} loss 2.1 rss {15.3 * k:.1f} GiB\n" for k in range(1, 15))
    grown, ev = diagnose_text(training + KILLED)
    assert ev.host_growth is not None and ev.host_growth[4] is True
    assert grown.verdict == "host_memory_limit" and grown.confidence < d.confidence
    assert any("rose at nearly every print" in e.fact for e in grown.evidence)


def test_deepspeeds_sigkill_and_nccls_older_segment_name() -> None:
    (m,) = parse_messages(
        "[2024-06-30 12:04:14,252] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', "
        "'train.py', '--local_rank=4'] exits with return code = -9"
    )
    assert m.kind == "host_oom" and m.format == "host-sigkill"
    assert parse_messages("... exits with return code = -90") == []
    (m,) = parse_messages(
        "trainer-0:301:441 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "nccl-shm-recv-b3f5e3a1b1f0c1d2-0-7-0 (size 4460544)"
    )
    assert m.kind == "shm_exhausted" and m.format == "shm-nccl" and m.requested_bytes == 4460544


BUS = (
    "RuntimeError: DataLoader worker (pid 112944) is killed by signal: Bus error. It is possible that "
    "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n"
)


def _fault(frame: str) -> str:
    return (
        "Fatal Python error: Bus error\n\n"
        "Current thread 0x00007f2b9c1fa740 (most recent call first):\n"
        f"  {frame}\n"
        '  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/_utils/worker.py", line 308 in _worker_loop\n'
    )


def test_a_bus_error_is_a_full_shm_only_where_a_batch_is_written_to_shared_memory() -> None:
    mmap = _fault('File "/workspace/megatron/core/datasets/indexed_dataset.py", line 587 in __getitem__')
    assert bus_error_frame(mmap) == (
        "/workspace/megatron/core/datasets/indexed_dataset.py",
        587,
        "__getitem__",
    )
    d, _ = diagnose_text(mmap + BUS)
    assert d.verdict == "inconclusive" and "shm_exhausted" in d.candidates
    assert any("memory-mapped file" in e.fact for e in d.evidence)
    collate = _fault(
        'File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/_utils/collate.py", line 141 in collate'
    )
    d, _ = diagnose_text(collate + BUS)
    assert d.verdict == "shm_exhausted"
    d, _ = diagnose_text(BUS)  # no stack: the message's own reading
    assert d.verdict == "shm_exhausted"


def test_a_fraction_the_jobs_logger_says_it_set_from_a_bare_file_name_is_the_jobs() -> None:
    oom = (
        "[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total "
        "capacity of 79.11 GiB of which 35.43 GiB is free. Including non-PyTorch memory, this process has 43.68 "
        "GiB memory in use. 43.51 GiB allowed; Of the allocated memory 41.92 GiB is allocated by PyTorch, and "
        "880.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    tb = (
        "[rank0]:Traceback (most recent call last):\n"
        '[rank0]:  File "/home/ray/rlhf/ppo_train.py", line 351, in main\n'
        "[rank0]:    loss = policy(batch)\n"
    )
    said = "[rank0]:{f}:88 calling torch.cuda.set_per_process_memory_fraction(0.55) to leave room for vLLM\n"
    d, ev = diagnose_text(said.format(f="train.py") + tb + oom)
    assert ev.cap_set_by_job is not None and d.verdict != "gpu_quota"
    # a site hook named without a folder is still not the job's
    d, ev = diagnose_text(said.format(f="sitecustomize.py") + tb + oom)
    assert ev.cap_set_by_job is None and d.verdict == "gpu_quota"


SMI = """+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI       PID   Type   Process name                             GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0   N/A  N/A   1804411      C   tritonserver                               3128MiB |
|    0   N/A  N/A   1804530      C   ...triton_python_backend_stub              6210MiB |
|    0   N/A  N/A   1804562      C   ...triton_python_backend_stub              6206MiB |
|    0   N/A  N/A   1804597      C   ...triton_python_backend_stub              6789MiB |
+---------------------------------------------------------------------------------------+
"""
STUB = (
    "E0927 12:01:09.552301 61 pb_stub.cc:406] Failed to initialize Python stub: OutOfMemoryError: CUDA out of "
    "memory. Tried to allocate 882.00 MiB. GPU 0 has a total capacity of 22.19 GiB of which 390.00 MiB is free. "
    "Process 1804411 has 3.05 GiB memory in use. Process 1804530 has 6.06 GiB memory in use. Process 1804562 has "
    "6.06 GiB memory in use. Process 1804597 has 6.63 GiB memory in use. Of the allocated memory 6.10 GiB is "
    "allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated.\n"
)


def test_tritons_stubs_are_the_servers_own_processes_in_its_own_log() -> None:
    start = "I0927 12:00:41.001877 61 python_be.cc:2362] TRITONBACKEND_ModelInstanceInitialize: asr_whisper_0_2 (GPU device 0)\n"
    d, ev = diagnose_text(start + SMI + STUB)
    assert {1804411, 1804530, 1804562, 1804597} <= ev.service_pids
    assert d.verdict != "other_process", d.headline
    assert d.verdict == "workload_too_large"  # the stub failed loading its model
    # the same listing in another program's log: Triton's processes there are neighbours
    other = SMI + STUB.replace(
        "E0927 12:01:09.552301 61 pb_stub.cc:406] Failed to initialize Python stub: ", ""
    )
    d, ev = diagnose_text(other)
    assert ev.service_pids == set() and d.verdict == "other_process"


def test_a_model_that_fails_to_load_and_compiles_first_call_are_setup() -> None:
    triton = (
        "| reranker_large | 1    | UNAVAILABLE: Internal: failed to load model 'reranker_large': CUDA out of "
        "memory. Tried to allocate 60.00 MiB (GPU 0; 14.75 GiB total capacity; 13.21 GiB already allocated; "
        "27.06 MiB free; 13.88 GiB reserved in total by PyTorch) |\n"
    )
    d, ev = diagnose_text(triton)
    assert ev.setup_call == "failed to load model 'reranker_large'"
    assert d.verdict == "workload_too_large", d.headline
    inductor = (
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 212, in <module>\n'
        "    loss = compiled_step(batch)\n"
        '  File "/opt/conda/lib/python3.11/site-packages/torch/_inductor/select_algorithm.py", line 1347, in benchmark_example_value\n'
        "    return cls.generate_example_value(\n"
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of 39.59 GiB "
        "of which 1.15 GiB is free. Including non-PyTorch memory, this process has 38.43 GiB memory in use. Of the "
        "allocated memory 37.59 GiB is allocated by PyTorch, and 340.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(inductor)
    assert ev.setup_call is not None and "select_algorithm.py" in ev.setup_call
    assert d.verdict == "workload_too_large"
    # compiled again after steps had run (a new shape): no longer setup, nothing decided from it
    d, ev = diagnose_text("step 400 | loss 2.31\n" + inductor)
    assert ev.setup_call is None and d.verdict == "inconclusive"


def test_peaks_printed_alone_above_what_the_failing_moment_needed_with_large_holes() -> None:
    peaks = [11008, 10869, 9446, 12785, 9549, 12038, 12092, 9781, 10125, 10178, 10758, 10353]
    prints = "".join(
        f"[02/11 03:00:19 d2.utils.events]:  eta: 9:10:21  iter: {19 + 200 * k}  total_loss: 1.2  time: 0.91  "
        f"lr: 0.01  max_mem: {p}M\n"
        for k, p in enumerate(peaks)
    )
    oom = (
        "Traceback (most recent call last):\n"
        '  File "/work/tools/train_net.py", line 141, in <module>\n'
        "    launch(main)\n"
        "RuntimeError: CUDA out of memory. Tried to allocate 1.22 GiB (GPU 0; 14.76 GiB total capacity; "
        "{a} GiB already allocated; 809.75 MiB free; 13.12 GiB reserved in total by PyTorch)\n"
    )
    d, ev = diagnose_text(prints + oom.format(a="9.87"))
    assert ev.log_peaks_only and len(ev.steps) == 12
    assert d.verdict == "fragmentation", d.headline
    # the failing moment needed more than any earlier peak: the holes decide nothing alone
    d, _ = diagnose_text(prints + oom.format(a="12.90"))
    assert d.verdict != "fragmentation"
