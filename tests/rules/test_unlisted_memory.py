"""Memory on the GPU that no listed process accounts for, and failures that say "out of memory" without
torch's numbers.

- torch 2.2+ lists every process NVML reports; a message that lists only "this process" while the device's
  total less its free memory is far more than that process holds shows memory of processes NVML did not
  list (another container's, a display's, an MPS client's): a neighbour, when it made the difference.
- nvidia-smi printed before the job showed progress gives the GPU's memory in use even where it lists no
  process (in a container it cannot list the host's): its table's Memory-Usage column, or the CSV of
  ``--query-gpu``.
- cuBLAS and cuDNN allocate their handle and workspace on first use: on a full GPU that fails as
  ``CUBLAS_STATUS_NOT_INITIALIZED`` / ``CUDNN_STATUS_NOT_INITIALIZED`` (``CUDNN_STATUS_ALLOC_FAILED`` says it
  outright).
- accelerate's ``find_executable_batch_size`` (HF Trainer's ``auto_find_batch_size``) halves the batch after
  each out-of-memory error and raises ``No executable batch size found, reached zero.`` when batch size 1
  failed too.

Messages follow torch 2.2+'s template (SNAPSHOT_FORMAT.md §4); nvidia-smi lines follow its 550 driver's
output and its documented CSV; accelerate's wording is its ``utils/memory.py``'s (no GPU runs here).
"""

from __future__ import annotations

from triage.messages import parse_messages, smi_gpu_usage
from triage.pipeline import diagnose_text

MiB = 1 << 20

MSG_2_2 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of "
    "39.39 GiB of which {free} is free. Including non-PyTorch memory, this process has {mine} memory in use. "
    "Of the allocated memory {alloc} is allocated by PyTorch, and 302.00 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)

TRACE = """Traceback (most recent call last):
  File "/srv/job/train.py", line 40, in <module>
    y = model(x)
  File "/usr/local/lib/python3.11/site-packages/torch/nn/modules/conv.py", line 456, in _conv_forward
    return F.conv2d(input, weight, bias, self.stride,
"""

TABLE = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA L4                      On  |   00000000:00:03.0 Off |                    0 |
| N/A   45C    P0             30W /   72W |   {used}MiB /  23034MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""


def test_memory_outside_the_only_listed_process_is_a_neighbours_when_it_made_the_difference() -> None:
    text = TRACE + MSG_2_2.format(req="2.00 GiB", free="1.12 GiB", mine="11.60 GiB", alloc="10.80 GiB")
    d, ev = diagnose_text(text)
    # 39.39 - 1.12 - 11.60 GiB: held outside the job's process
    assert ev.unlisted_bytes is not None and abs(ev.unlisted_bytes / (1 << 30) - 26.67) < 0.01
    assert d.verdict == "other_process", d.headline
    assert any("NVML did not list" in e["fact"] for e in d.to_dict()["evidence"])
    # the process holds nearly everything: what is outside it is a context's worth, no neighbour
    close = TRACE + MSG_2_2.format(req="2.00 GiB", free="1.12 GiB", mine="37.90 GiB", alloc="37.10 GiB")
    d, ev = diagnose_text(close)
    assert ev.unlisted_bytes is not None and ev.unlisted_bytes < 1 << 30
    assert d.verdict != "other_process"
    # a request larger than everything outside the job and the free memory together: they did not decide
    big = TRACE + MSG_2_2.format(req="30.00 GiB", free="1.12 GiB", mine="11.60 GiB", alloc="10.80 GiB")
    d, _ = diagnose_text(big)
    assert d.verdict != "other_process"


def test_nvidia_smi_memory_in_use_before_the_job_started_with_no_process_listed() -> None:
    err = TRACE + "RuntimeError: CUDA error: out of memory\n"
    rows = smi_gpu_usage(TABLE.format(used="22810"))
    assert [(g.gpu, g.used_bytes, g.total_bytes) for g in rows] == [(0, 22810 * MiB, 23034 * MiB)]
    d, ev = diagnose_text(TABLE.format(used="22810") + err)
    assert ev.log_smi_gpu is not None and ev.log_smi_before_start
    assert d.verdict == "other_process", d.headline
    # an idle GPU before the job: nothing of another's
    d, ev = diagnose_text(TABLE.format(used="    0") + err)
    assert d.verdict != "other_process"
    # printed while the job trained, the reading holds the job's own memory: not read
    d, ev = diagnose_text("epoch 0 step 10 loss 2.31\n" + TABLE.format(used="22810") + err)
    assert ev.log_smi_gpu is None and d.verdict != "other_process"


def test_the_query_gpu_csv_with_and_without_its_header() -> None:
    head = (
        "$ nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv\n"
        "index, name, memory.used [MiB], memory.total [MiB]\n"
        "0, NVIDIA A100-SXM4-40GB, 27311 MiB, 40960 MiB\n"
        "1, NVIDIA A100-SXM4-40GB, 3 MiB, 40960 MiB\n"
    )
    assert [(g.gpu, g.used_bytes // MiB) for g in smi_gpu_usage(head)] == [(0, 27311), (1, 3)]
    bare = "nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader\n1200 MiB, 81559 MiB\n"
    assert [(g.gpu, g.used_bytes // MiB, g.total_bytes) for g in smi_gpu_usage(bare)] == [
        (None, 1200, 81559 * MiB)
    ]
    err = "$ python train.py\n" + TRACE + "RuntimeError: CUDA error: out of memory\n"
    one = head.replace("1, NVIDIA A100-SXM4-40GB, 3 MiB, 40960 MiB\n", "")
    d, ev = diagnose_text(one + err)
    assert ev.log_smi_gpu is not None and ev.log_smi_gpu.gpu == 0
    assert d.verdict == "other_process", d.headline
    # two GPUs and an error that does not say which one failed: neither reading is read
    d, ev = diagnose_text(head + err)
    assert ev.log_smi_gpu is None and d.verdict != "other_process"
    # the message names the GPU: its reading is the one read
    pre = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 39.39 GiB total "
        "capacity; 30.10 GiB already allocated; 1.02 GiB free; 30.40 GiB reserved in total by PyTorch)\n"
    )
    _, ev = diagnose_text(head + TRACE + pre)
    assert ev.log_smi_gpu is not None and ev.log_smi_gpu.gpu == 1
    # the job's own reservation at the OOM bounds what the reading can hold of the job's: a reading no
    # larger than that and a context is not another's
    msg = MSG_2_2.format(req="2.00 GiB", free="1.12 GiB", mine="38.20 GiB", alloc="37.40 GiB")
    d, ev = diagnose_text(head.replace("27311", "30000") + TRACE + msg)
    assert d.verdict != "other_process"


def test_cudnn_and_cublas_that_could_not_initialise_on_a_full_gpu() -> None:
    listed = TABLE.format(used="22810").replace(
        "|  No running processes found                                                             |",
        "|    0   N/A  N/A      1844      C   /usr/bin/python3 serve.py                   22800MiB |",
    )
    d, ev = diagnose_text(listed + TRACE + "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED\n")
    assert ev.message is not None and ev.message.extra.get("library_init") == "cudnn"
    assert d.verdict == "other_process", d.headline
    # alone, the status decides nothing: a library or driver mismatch gives it too
    d, ev = diagnose_text(TRACE + "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED\n")
    assert d.verdict == "inconclusive"
    assert any("could not initialise" in n for n in ev.notes)
    for text in (
        "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
        "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    ):
        (m,) = parse_messages(text)
        assert m.kind == "cuda_oom" and m.format == "cuda-error"
    # a warning that merely names the library is no failure
    assert parse_messages("cudnn version 8902, cublas ok") == []


def test_accelerate_gave_up_at_batch_size_zero() -> None:
    text = (
        "trainable params: 6,553,600 || all params: 13,022,417,920 || trainable%: 0.0503\n"
        "Traceback (most recent call last):\n"
        '  File "/app/finetune.py", line 84, in main\n'
        "    inner_training_loop()\n"
        '  File "/usr/local/lib/python3.10/dist-packages/accelerate/utils/memory.py", line 149, in decorator\n'
        '    raise RuntimeError("No executable batch size found, reached zero.")\n'
        "RuntimeError: No executable batch size found, reached zero.\n"
    )
    d, ev = diagnose_text(text)
    assert ev.is_cuda_oom
    assert d.verdict == "inconclusive"
    assert {"workload_too_large", "other_process", "gpu_quota"} <= set(d.candidates)
    assert any("not even batch size 1" in n for n in ev.notes)


def test_a_first_step_that_already_holds_nearly_all_the_gpu_is_not_the_unlisted_memorys() -> None:
    """5.2 GiB no process accounts for, beside a job that, in its first step and unfinished, already needs 72.6
    GiB of 79.2: whether the step fits an empty GPU is not known, so the unlisted memory is no verdict; the same
    numbers after many steps of this size would be (the margin the steps ran in)."""
    from rules import other_process

    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 1 has a total capacity of "
        "79.19 GiB of which 1.36 GiB is free. Including non-PyTorch memory, this process has 72.68 GiB memory in "
        "use. Of the allocated memory 70.90 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    _, first = diagnose_text("step 0 starting\n" + msg)
    f = other_process.evaluate(first)
    assert first.unlisted_bytes and f is not None and f.score < 0.6
    assert any("first step" in s for s in f.facts)
    _, later = diagnose_text("step 900 loss 1.2\n" + msg)
    g = other_process.evaluate(later)
    assert g is not None and g.score >= 0.6
