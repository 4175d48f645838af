"""Message-only logs, written from SNAPSHOT_FORMAT.md §4 templates, with realistic surrounding noise.

Each entry: name -> (text, acceptable verdicts, soft (tolerable but weaker) verdicts, why)."""

import json as _json

HINT_OLD = (
    " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  "
    "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
HINT_21 = (
    " If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  "
    "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
HINT_22 = (
    " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    " to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def tb_plain(err_line, file="/workspace/train.py"):
    return f"""Traceback (most recent call last):
  File "{file}", line 212, in <module>
    main()
  File "{file}", line 188, in main
    loss = train_one_epoch(model, loader, optimizer, scaler, epoch)
  File "{file}", line 121, in train_one_epoch
    output = model(images)
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl
    return forward_call(*args, **kwargs)
  File "/opt/conda/lib/python3.10/site-packages/timm/models/vision_transformer.py", line 662, in forward
    x = self.forward_features(x)
  File "/opt/conda/lib/python3.10/site-packages/timm/models/vision_transformer.py", line 645, in forward_features
    x = self.blocks(x)
  File "/opt/conda/lib/python3.10/site-packages/timm/models/vision_transformer.py", line 157, in forward
    x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/functional.py", line 1546, in gelu
    return torch._C._nn.gelu(input, approximate=approximate)
{err_line}
"""


def tb_rank(rank, err_line, exc="torch.OutOfMemoryError"):
    lines = [
        "Traceback (most recent call last):",
        '  File "/workspace/llm/train.py", line 171, in <module>',
        "    main()",
        '  File "/workspace/llm/train.py", line 160, in main',
        "    loss = trainer.train_step(batch)",
        '  File "/workspace/llm/trainer.py", line 96, in train_step',
        "    logits = self.model(input_ids, attention_mask=mask)",
        '  File "/usr/local/lib/python3.11/dist-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl',
        "    return self._call_impl(*args, **kwargs)",
        '  File "/usr/local/lib/python3.11/dist-packages/torch/nn/modules/module.py", line 1747, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        '  File "/workspace/llm/model.py", line 58, in forward',
        "    return self.lm_head(h).float()",
        f"{exc}: {err_line}",
    ]
    return "\n".join(f"[rank{rank}]: {ln}" for ln in lines) + "\n"


def torchrun_tail(rank, pid, host="gpu-node-17", ts="2024-11-05_14:03:25"):
    return f"""W1105 14:03:25.118000 31 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 58 closing signal SIGTERM
E1105 14:03:26.402000 31 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: {rank} (pid: {pid}) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.11/dist-packages/torch/distributed/run.py", line 919, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {ts}
  host      : {host}
  rank      : {rank} (local_rank: {rank})
  exitcode  : 1 (pid: {pid})
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def train_noise(
    n,
    start=0,
    loss0=2.31,
    fmtstr="{ts} | INFO | epoch 0 | step {s:>5} | loss {l:.4f} | lr 3.00e-04 | {tp:.1f} samples/s",
    ts_base="2024-11-05 13:5{m}:{sec:02d},{ms:03d}",
):
    out = []
    for i in range(n):
        s = start + i * 10
        ts = ts_base.format(m=(i // 12) % 10, sec=(i * 5) % 60, ms=(i * 137) % 1000)
        out.append(fmtstr.format(ts=ts, s=s, l=loss0 * (0.995**i), tp=412.0 + (i % 7) * 1.3))
    return "\n".join(out) + "\n"


LOGS = {}


def add(name, text, acceptable, why, soft=()):
    LOGS[name] = (text, list(acceptable), list(soft), why)


# --------------------------------------------------------------------------------------------------------------
add(
    "L01_pre21_plain",
    (
        "Namespace(arch='vit_base_patch16_224', batch_size=256, epochs=300, lr=0.001, amp=True)\n"
        "=> creating model 'vit_base_patch16_224'\n"
        "Use GPU: 0 for training\n"
        + train_noise(
            14, fmtstr="Epoch: [{s}][ 40/5005]\tTime  0.612 ( 0.634)\tLoss {l:.4e}\tAcc@1  12.50 ( 10.31)"
        )
        + tb_plain(
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 31.75 GiB total capacity; "
            "30.29 GiB already allocated; 3.75 MiB free; 30.40 GiB reserved in total by PyTorch)" + HINT_OLD
        )
    ),
    ["inconclusive"],
    "pre-2.1, allocated~reserved~total, no neighbour info: a leak and a too-large batch look identical",
)

add(
    "L02_pre21_fragmentation",
    (
        "[2023-06-14 09:12:01,118] torch 2.0.1+cu118, CUDA 11.8, 1x NVIDIA A100-SXM4-40GB\n"
        + train_noise(10, fmtstr="{ts} step={s} seq_len=dynamic loss={l:.3f}")
        + tb_plain(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB (GPU 0; 39.39 GiB total "
            "capacity; 21.87 GiB already allocated; 1.14 GiB free; 37.42 GiB reserved in total by PyTorch)"
            + HINT_OLD
        )
    ),
    ["fragmentation"],
    "15.55 GiB reserved-but-unallocated (after the allocator already released unsplit cache) cannot hold a 2.5 GiB request",
    soft=["inconclusive"],
)

add(
    "L03_pre21_allowed_cap",
    (
        "INFO:root:set_per_process_memory_fraction(0.5) requested by scheduler (shared GPU)\n"
        + train_noise(8)
        + tb_plain(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 79.15 GiB total "
            "capacity; 37.92 GiB already allocated; 40.06 GiB free; 39.50 GiB allowed; 38.31 GiB reserved in total by "
            "PyTorch)" + HINT_OLD
        )
    ),
    ["gpu_quota"],
    "'39.50 GiB allowed' with 40 GiB free on the device: the per-process fraction cap rejected it",
)

add(
    "L04_v21_typo_neighbour",
    (
        "2024-01-09 11:20:44 rank0 | torch 2.1.2 | cuda 12.1\n"
        + train_noise(12)
        + tb_plain(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacty "
            "of 79.15 GiB of which 382.06 MiB is free. Process 4121 has 41.30 GiB memory in use. Process 98765 has "
            "37.46 GiB memory in use. Of the allocated memory 35.92 GiB is allocated by PyTorch, and 812.44 MiB is "
            "reserved by PyTorch but unallocated." + HINT_21
        )
    ),
    ["other_process"],
    "Process 98765 (37.46 GiB) matches PyTorch's 36.71 GiB reserved + context = this job; Process 4121 holds 41.30 GiB",
)

add(
    "L05_v22_self_in_container",
    (
        "[rank0]:[W1105 13:50:02.331] Warning: torch.distributed: TORCH_NCCL_ASYNC_ERROR_HANDLING set\n"
        + train_noise(15)
        + tb_rank(
            0,
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
            "18.75 MiB is free. Process 1843321 has 79.12 GiB memory in use. Of the allocated memory 76.80 GiB is "
            "allocated by PyTorch, and 1.55 GiB is reserved by PyTorch but unallocated." + HINT_22,
        )
        + torchrun_tail(0, 57)
    ),
    ["inconclusive"],
    "the only 'Process N' line is this job itself in a PID namespace (79.12 = 78.35 reserved + context); leak vs too-large undecidable",
)

add(
    "L06_v22_this_process",
    (
        "Loading checkpoint shards: 100%|##########| 4/4 [00:07<00:00,  1.83s/it]\n"
        "trainable params: 6,738,415,616 || all params: 6,738,415,616 || trainable%: 100.0\n"
        + train_noise(
            6, fmtstr="{{'loss': {l:.4f}, 'grad_norm': 1.93, 'learning_rate': 2e-05, 'epoch': 0.0{s}}}"
        )
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity "
            "of 23.65 GiB of which 187.06 MiB is free. Including non-PyTorch memory, this process has 23.45 GiB "
            "memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 113.72 MiB is reserved by "
            "PyTorch but unallocated." + HINT_22,
            file="/home/user/finetune.py",
        )
    ),
    ["inconclusive"],
    "only this process, allocated~total: leak vs too-large undecidable from text",
    soft=["workload_too_large"],
)

add(
    "L07_v22_fragmentation",
    (
        train_noise(10, fmtstr="{ts} [train] it={s} bs=dynamic tokens=118k loss={l:.3f}")
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of "
            "39.39 GiB of which 1.04 GiB is free. Including non-PyTorch memory, this process has 38.34 GiB memory in "
            "use. Of the allocated memory 24.60 GiB is allocated by PyTorch, and 13.20 GiB is reserved by PyTorch but "
            "unallocated." + HINT_22
        )
    ),
    ["fragmentation"],
    "13.20 GiB reserved-but-unallocated vs a 3 GiB request",
    soft=["inconclusive"],
)

add(
    "L08_v22_allowed_cap",
    (
        train_noise(9)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.15 GiB of which 40.42 GiB is free. Including non-PyTorch memory, this process has 38.72 GiB memory in "
            "use. 39.58 GiB allowed; Of the allocated memory 37.61 GiB is allocated by PyTorch, and 601.19 MiB is "
            "reserved by PyTorch but unallocated." + HINT_22
        )
    ),
    ["gpu_quota"],
    "'39.58 GiB allowed' while 40 GiB is free on the device: fraction cap",
)

add(
    "L09_preemptive_rejection",
    (
        train_noise(5)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected because it would "
            "exceed per_process_memory_fraction limit."
        )
    ),
    ["gpu_quota"],
    "explicit per_process_memory_fraction rejection",
)

add(
    "L10_mig_nvml_assert",
    (
        "$ nvidia-smi -L\n"
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d1f0c3e-2b7a-4f5e-9c1d-0a7e3b9d2f11)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-8c2b6f0e-1d3a-5e7b-a9c4-2f0d1e3b4a5c)\n"
        "torch 2.1.0+cu121 cuda available: True device: NVIDIA A100-SXM4-80GB MIG 1g.10gb\n"
        + train_noise(4)
        + tb_plain(
            'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1123, '
            "please report a bug to PyTorch. "
        )
    ),
    ["gpu_quota"],
    "NVML assert in the caching allocator on a MIG 1g.10gb slice = the slice's memory ran out",
    soft=["inconclusive"],
)

add(
    "L11_nvml_assert_no_context",
    (
        train_noise(7)
        + tb_plain(
            'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":838, '
            "please report a bug to PyTorch. "
        )
    ),
    ["gpu_quota", "inconclusive"],
    "NVML assert: MIG/container symptom per SNAPSHOT_FORMAT, but no slice named; both defensible",
)

add(
    "L12_hami_vgpu",
    (
        "[HAMI-core Msg(31:140245118764864:libvgpu.c:836)]: Initializing.....\n"
        + train_noise(6)
        + "[HAMI-core ERROR (pid:31 thread=140245118764864 allocator.c:54)]: Device 0 OOM 21474836480 / 21474836480\n"
        + tb_plain(
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
            "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
            "CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
        )
    ),
    ["gpu_quota"],
    "HAMi vGPU limit hit (used == limit 20 GiB)",
    soft=["inconclusive"],
)

add(
    "L13_cuda_error_no_numbers",
    (
        train_noise(3)
        + tb_plain(
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
            "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
            "CUDA_LAUNCH_BLOCKING=1."
        )
    ),
    ["inconclusive"],
    "no numbers at all",
)

add(
    "L14_shm_bus_error",
    (
        train_noise(4)
        + "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
        + "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
        + """Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
  File "/opt/conda/lib/python3.10/multiprocessing/queues.py", line 113, in get
    if not self._poll(timeout):
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 4512) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/workspace/train.py", line 121, in train_one_epoch
    for images, target in loader:
RuntimeError: DataLoader worker (pid(s) 4512) exited unexpectedly
"""
    ),
    ["shm_exhausted"],
    "SIGBUS in DataLoader worker = /dev/shm exhausted",
)

add(
    "L15_shm_no_space",
    (
        train_noise(2)
        + """Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/worker.py", line 308, in _worker_loop
    data = fetcher.fetch(index)
  File "/opt/conda/lib/python3.10/multiprocessing/reduction.py", line 51, in dumps
    cls(buf, protocol).dump(obj)
  File "/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/reductions.py", line 557, in reduce_storage
    fd, size = storage._share_fd_cpu_()
RuntimeError: unable to write to file </torch_1234_2849302_0>: No space left on device (28)
"""
    ),
    ["shm_exhausted"],
    "torch shm file write failed with ENOSPC",
)

add(
    "L16_k8s_oomkilled",
    (
        train_noise(20)
        + """$ kubectl describe pod llm-train-worker-3 -n research
Containers:
  pytorch:
    State:          Terminated
      Reason:       OOMKilled
      Exit Code:    137
      Started:      Tue, 05 Nov 2024 13:41:10 +0000
      Finished:     Tue, 05 Nov 2024 14:03:25 +0000
    Last State:     Terminated
      Reason:       OOMKilled
      Exit Code:    137
    Restart Count:  2
    Limits:
      memory:          64Gi
      nvidia.com/gpu:  1
"""
    ),
    ["host_memory_limit"],
    "pod OOMKilled, exit 137, memory limit 64Gi",
)

add(
    "L17_sigkill_bare",
    (
        train_noise(25)
        + "W1105 14:03:25.118000 31 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGKILL death signal, shutting down workers\n"
        + "E1105 14:03:26.402000 31 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 58) of binary: /usr/bin/python\n"
        + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  exitcode  : -9 (pid: 58)\n  traceback : Signal 9 (SIGKILL) received by PID 58\n"
    ),
    ["host_memory_limit", "inconclusive"],
    "SIGKILL of the worker: usually the kernel OOM killer, but preemption/eviction also send SIGKILL",
)

add(
    "L18_dmesg_cgroup",
    (
        train_noise(18)
        + "Killed\n"
        + "$ dmesg | tail -3\n"
        + "[1823341.112233] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=968\n"
        + "[1823341.118812] Memory cgroup out of memory: Killed process 2231 (python) total-vm:98123456kB, anon-rss:33554432kB, file-rss:102400kB, shmem-rss:0kB, UID:0 pgtables:70212kB oom_score_adj:968\n"
        + "[1823341.201010] oom_reaper: reaped process 2231 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB\n"
    ),
    ["host_memory_limit"],
    "memory cgroup OOM kill of the training process",
)

add(
    "L19_worker_killed_sigkill",
    (
        train_noise(8)
        + """Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 3321) is killed by signal: Killed.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/workspace/train.py", line 121, in train_one_epoch
    for images, target in loader:
RuntimeError: DataLoader worker (pid(s) 3321) exited unexpectedly
"""
    ),
    ["host_memory_limit", "inconclusive"],
    "worker SIGKILLed: almost always the host OOM killer",
)

add(
    "L20_v22_private_pools_self",
    (
        train_noise(11)
        + tb_rank(
            0,
            "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 47.53 GiB of which "
            "896.00 KiB is free. Process 1686436 has 47.51 GiB memory in use. Of the allocated memory 47.00 GiB is "
            "allocated by PyTorch, with 46.22 GiB allocated in private pools (e.g., CUDA Graphs), and 149.10 MiB "
            "is reserved by PyTorch but unallocated." + HINT_22,
            exc="torch.cuda.OutOfMemoryError",
        )
    ),
    ["inconclusive"],
    "real message shape: single 'Process N' line = self in container; CUDA graphs pools; nothing decides",
    soft=["workload_too_large"],
)

add(
    "L21_v22_neighbour_and_self",
    (
        train_noise(30)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 17.06 MiB is free. Process 3302 has 14.20 GiB memory in use. Including non-PyTorch "
            "memory, this process has 9.42 GiB memory in use. Of the allocated memory 8.61 GiB is allocated by "
            "PyTorch, and 366.37 MiB is reserved by PyTorch but unallocated." + HINT_22
        )
    ),
    ["other_process"],
    "another process holds 14.20 GiB of a 24 GiB GPU; this process only 9.42 GiB",
)

add(
    "L22_very_old_cached",
    (
        "torch 1.4.0\n"
        + train_noise(5)
        + tb_plain(
            "RuntimeError: CUDA out of memory. Tried to allocate 64.00 MiB (GPU 0; 10.92 GiB total capacity; "
            "9.83 GiB already allocated; 39.38 MiB free; 136.20 MiB cached)"
        )
    ),
    ["inconclusive"],
    "very old format; allocated~total; nothing decides",
)

add(
    "L23_pre21_unaccounted_gap",
    (
        train_noise(9)
        + tb_plain(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 31.75 GiB total "
            "capacity; 12.40 GiB already allocated; 1.35 GiB free; 12.90 GiB reserved in total by PyTorch)"
            + HINT_OLD
        )
    ),
    ["other_process", "inconclusive"],
    "17.5 GiB used outside PyTorch's reserve: most likely another process, but non-PyTorch memory in-process is possible",
)

add(
    "L24_growing_memory_prints",
    (
        "".join(
            f"2024-11-05 13:{10 + i // 6:02d}:{(i * 10) % 60:02d} | step {i * 100:>5} | loss {2.1 - i * 0.01:.3f} | "
            f"bs 32 | torch.cuda.memory_allocated {10.2 + i * 1.45:.2f} GB | max_reserved {10.9 + i * 1.45:.2f} GB\n"
            for i in range(46)
        )
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 394.00 MiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 201.06 MiB is free. Including non-PyTorch memory, this process has 78.94 GiB "
            "memory in use. Of the allocated memory 76.45 GiB is allocated by PyTorch, and 1.88 GiB is reserved by "
            "PyTorch but unallocated." + HINT_22
        )
    ),
    ["tensor_leak", "inconclusive"],
    "the log itself prints memory_allocated growing linearly (+1.45 GB/100 steps) at fixed bs 32: a leak to a human",
)

add(
    "L25_first_step_huge",
    (
        "2024-11-05 13:50:01 | INFO | model: 13.0B params, bf16, AdamW, bs=64, seq=4096\n"
        "2024-11-05 13:50:44 | INFO | starting training, step 0\n"
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.62 GiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 9.87 GiB is free. Including non-PyTorch memory, this process has 69.26 GiB memory "
            "in use. Of the allocated memory 68.55 GiB is allocated by PyTorch, and 198.21 MiB is reserved by "
            "PyTorch but unallocated." + HINT_22
        )
    ),
    ["workload_too_large", "inconclusive"],
    "fails in step 0 (no step completed, so no leak across steps) asking for 15.62 GiB: too large",
)

add(
    "L26_nccl_shm_mentions_then_cuda_oom",
    (
        "gpu-node-17:31:31 [0] NCCL INFO Bootstrap : Using eth0:10.0.3.17<0>\n"
        "gpu-node-17:31:31 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using internal implementation\n"
        "gpu-node-17:31:88 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "gpu-node-17:31:88 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "WARNING: /dev/shm is 64M; consider --shm-size for DataLoader workers (informational)\n"
        + train_noise(12)
        + tb_rank(
            0,
            "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
            "1.21 GiB is free. Including non-PyTorch memory, this process has 77.93 GiB memory in use. Of the "
            "allocated memory 75.10 GiB is allocated by PyTorch, and 2.11 GiB is reserved by PyTorch but "
            "unallocated." + HINT_22,
        )
        + torchrun_tail(0, 31)
    ),
    ["inconclusive", "fragmentation"],
    "benign SHM mentions; the failure is a CUDA OOM with only this process; 2.11 GiB unallocated vs 1.95 GiB ask is borderline",
)

add(
    "L27_autobs_caught_oom_then_shm",
    (
        "Finding best initial batch size...\n"
        "Batch size 512 failed: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
        "of which 1.02 GiB is free. Including non-PyTorch memory, this process has 22.61 GiB memory in use. Of the "
        "allocated memory 21.90 GiB is allocated by PyTorch, and 250.00 MiB is reserved by PyTorch but unallocated.\n"
        "Batch size 256 succeeded, using it.\n"
        + train_noise(10)
        + "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
        + "RuntimeError: DataLoader worker (pid 9921) is killed by signal: Bus error. It is possible that dataloader's "
        "workers are out of shared memory. Please try to raise your shared memory limit.\n"
    ),
    ["shm_exhausted"],
    "the CUDA OOM was caught by the batch-size finder; the fatal error is the SIGBUS",
)

add(
    "L28_nonpytorch_in_process",
    (
        "cupy 12.3 memory pool enabled; TensorRT engine loaded (workspace 16 GiB)\n"
        + train_noise(7)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
            "39.39 GiB of which 212.06 MiB is free. Including non-PyTorch memory, this process has 39.17 GiB memory "
            "in use. Of the allocated memory 19.86 GiB is allocated by PyTorch, and 310.14 MiB is reserved by "
            "PyTorch but unallocated." + HINT_22
        )
    ),
    ["inconclusive", "workload_too_large"],
    "19 GiB of non-PyTorch memory is inside THIS process (cupy/TensorRT): not another process, not a quota",
)

add(
    "L29_multirank_one_neighbour",
    (
        "".join(
            f"[rank{r}]:[I1105 13:50:0{r}.1] ProcessGroupNCCL initialized, rank {r}/8\n" for r in range(8)
        )
        + train_noise(10, fmtstr="[rank0]: {ts} step {s} loss {l:.3f}")
        + tb_rank(
            3,
            "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which "
            "1.12 GiB is free. Process 209911 has 31.50 GiB memory in use. Process 208777 has 46.51 GiB memory in "
            "use. Of the allocated memory 44.90 GiB is allocated by PyTorch, and 850.00 MiB is reserved by PyTorch "
            "but unallocated." + HINT_22,
        )
        + "".join(
            f"[rank{r}]:[E1105 14:13:25.0] [PG 0 Rank {r}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum=1822, OpType=ALLREDUCE, NumelIn=65536, Timeout(ms)=600000) ran for 600012 milliseconds\n"
            for r in (0, 1, 2, 4, 5, 6, 7)
        )
        + torchrun_tail(3, 61)
    ),
    ["other_process"],
    "rank 3: Process 208777 (46.51 GiB = 45.73 reserved + ctx) is self; Process 209911 holds 31.5 GiB",
)

add(
    "L30_not_an_oom",
    (
        train_noise(12)
        + tb_plain(
            "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1."
        )
    ),
    ["inconclusive"],
    "not an out-of-memory at all; no memory verdict should be given",
)


# ============================================================================================ round 2: harder probes

add(
    "L31_caught_neighbour_oom_then_plain_fatal",
    (
        "2024-11-05 09:00:03 | INFO | auto batch size: trying 128\n"
        "2024-11-05 09:00:09 | WARNING | caught torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 "
        "has a total capacity of 79.15 GiB of which 3.20 GiB is free. Process 7777 has 30.00 GiB memory in use. Including "
        "non-PyTorch memory, this process has 45.93 GiB memory in use. Of the allocated memory 44.80 GiB is allocated by "
        "PyTorch, and 610.00 MiB is reserved by PyTorch but unallocated.\n"
        "2024-11-05 09:00:09 | INFO | auto batch size: retrying with 64 -> ok\n"
        + train_noise(30)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.15 GiB of which 20.00 MiB is free. Including non-PyTorch memory, this process has 79.11 GiB memory in "
            "use. Of the allocated memory 77.40 GiB is allocated by PyTorch, and 1.19 GiB is reserved by PyTorch but "
            "unallocated." + HINT_22
        )
    ),
    ["inconclusive"],
    "an earlier OOM was caught (a neighbour was there at 09:00); the FATAL one, hours later, shows only this process",
)

add(
    "L32_small_neighbour_irrelevant",
    (
        train_noise(14)
        + tb_plain(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty "
            "of 79.15 GiB of which 300.00 MiB is free. Process 11823 has 1.50 GiB memory in use. Including non-PyTorch "
            "memory, this process has 77.33 GiB memory in use. Of the allocated memory 75.90 GiB is allocated by "
            "PyTorch, and 911.00 MiB is reserved by PyTorch but unallocated." + HINT_21
        )
    ),
    ["inconclusive"],
    "a 1.50 GiB neighbour cannot explain a 2 GiB miss (1.50 + 0.29 free < 2.00); the job holds 77 GiB itself",
)

_exc = (
    'Traceback (most recent call last):\n  File "/workspace/train.py", line 88, in train_step\n    out = model(x)\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 382.06 MiB is free. Process 4121 has 41.30 GiB memory in use. Including non-PyTorch memory, this "
    "process has 37.46 GiB memory in use. Of the allocated memory 35.92 GiB is allocated by PyTorch, and 812.44 MiB "
    "is reserved by PyTorch but unallocated." + HINT_22
)
add(
    "L33_json_lines_neighbour",
    (
        "".join(
            _json.dumps(
                {
                    "ts": f"2024-11-05T13:5{i // 6}:{(i * 10) % 60:02d}Z",
                    "level": "INFO",
                    "logger": "trainer",
                    "rank": 0,
                    "msg": "step",
                    "step": i * 10,
                    "loss": round(2.3 - i * 0.01, 4),
                }
            )
            + "\n"
            for i in range(40)
        )
        + _json.dumps(
            {
                "ts": "2024-11-05T14:03:25.118Z",
                "level": "ERROR",
                "logger": "trainer",
                "rank": 0,
                "msg": "training failed",
                "exc_info": _exc,
            }
        )
        + "\n"
    ),
    ["other_process"],
    "structured (JSON-lines) log: the OOM text is inside a JSON string with escaped newlines",
)

add(
    "L34_windows_zero_bytes_free",
    (
        "C:\\Users\\me\\proj> python train.py --bs 16\n"
        + train_noise(6)
        + "Traceback (most recent call last):\n"
        '  File "C:\\Users\\me\\proj\\train.py", line 40, in <module>\n    loss = model(x).sum()\n'
        '  File "C:\\Users\\me\\miniconda3\\envs\\pt\\lib\\site-packages\\torch\\nn\\modules\\module.py", line 1130, in _call_impl\n'
        "    return forward_call(*input, **kwargs)\n"
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity; 3.43 GiB already "
        "allocated; 0 bytes free; 3.47 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try "
        "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF\n"
    ),
    ["inconclusive"],
    "laptop GPU, '0 bytes free'; 0.5 GiB non-PyTorch is the context/display: nothing decides",
    soft=["workload_too_large"],
)

add(
    "L35_too_many_open_files_not_shm",
    (
        train_noise(22)
        + "RuntimeError: Too many open files. Communication with the workers is no longer possible. Please increase the "
        "limit using `ulimit -n` in the shell or change the sharing strategy by calling "
        "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code\n"
    ),
    ["inconclusive"],
    "file-descriptor ulimit, not /dev/shm space and not memory at all",
)

add(
    "L36_nccl_shm_enospc",
    (
        "gpu-node-17:31:31 [0] NCCL INFO Bootstrap : Using eth0:10.0.3.17<0>\n"
        "gpu-node-17:31:88 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
        "gpu-node-17:31:88 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-8x2Kq3 (size 9637888)\n"
        "gpu-node-17:31:88 [0] NCCL INFO transport/shm.cc:114 -> 2\n"
        + tb_rank(
            0,
            "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error "
            "(run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\nncclSystemError: System call (e.g. socket, "
            "malloc) or external library call failed or device error.\nLast error:\nError while creating shared "
            "memory segment /dev/shm/nccl-8x2Kq3 (size 9637888)",
            exc="torch.distributed.DistBackendError",
        )
    ),
    ["shm_exhausted"],
    "NCCL could not fallocate its /dev/shm segment: ENOSPC on /dev/shm",
    soft=["inconclusive"],
)

add(
    "L37_stray_killed_then_neighbour_oom",
    (
        "[prep] timeout 30 nvidia-smi --query-gpu=memory.used --format=csv\n"
        "/bin/bash: line 1:  4120 Killed                  timeout 30 nvidia-smi --query-gpu=memory.used --format=csv\n"
        "[prep] nvidia-smi hung, continuing anyway\n"
        + train_noise(20)
        + tb_plain(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 17.06 MiB is free. Process 3302 has 14.20 GiB memory in use. Including non-PyTorch "
            "memory, this process has 9.42 GiB memory in use. Of the allocated memory 8.61 GiB is allocated by "
            "PyTorch, and 366.37 MiB is reserved by PyTorch but unallocated." + HINT_22
        )
    ),
    ["other_process"],
    "a helper's 'Killed' early on is noise; the fatal error is a CUDA OOM with a 14 GiB neighbour",
)

add(
    "L38_cuda_oom_root_siblings_sigkilled",
    (
        train_noise(12)
        + tb_rank(
            2,
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of 79.15 GiB of which "
            "18.75 MiB is free. Process 2283 has 79.12 GiB memory in use. Of the allocated memory 76.80 GiB is "
            "allocated by PyTorch, and 1.55 GiB is reserved by PyTorch but unallocated." + HINT_22,
        )
        + """W1105 14:03:25.118000 31 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 58 closing signal SIGTERM
W1105 14:03:25.119000 31 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 59 closing signal SIGTERM
W1105 14:03:55.120000 31 torch/distributed/elastic/multiprocessing/api.py:912] Unable to shutdown process 58 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL
E1105 14:03:56.402000 31 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 2 (pid: 60) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-11-05_14:03:55
  host      : gpu-node-17
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 58)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 58
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-11-05_14:03:25
  host      : gpu-node-17
  rank      : 2 (local_rank: 2)
  exitcode  : 1 (pid: 60)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
    ),
    ["inconclusive"],
    "root cause is rank 2's CUDA OOM (self only); the SIGKILL of rank 0 is torchrun's own teardown, not the OOM killer",
)
