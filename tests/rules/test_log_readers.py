"""More of what training logs print, read as evidence:

- the first step's bar after a trainer's setup bars: Ultralytics' dataset scans and its "Starting training for
  N epochs" line and table header, Lightning's sanity-check bar, a banner's "Num batches each epoch = 2";
- OpenMMLab's ``memory: 19332`` column (mmcv's and mmengine's training lines: ``max_memory_allocated()`` in
  MiB, its peak reset every log interval);
- one reading per device on a line (``memory_allocated cuda:0 9.49G cuda:1 3.28G``): the fullest device's;
- nvidia-smi listing several GPUs: the rows of the GPU the OOM message names;
- peaks printed at two batch sizes (a sweep) give fixed and per-sample memory, and so the largest batch.

Lines follow each tool's documented output (Ultralytics' trainer, Lightning's progress bar, mmengine's
LoggerHook, nvidia-smi 550); messages follow SNAPSHOT_FORMAT.md §4. No tool runs here.
"""

from __future__ import annotations

from triage.messages import _sample_on, first_step_bar
from triage.pipeline import diagnose_text

PRE_2_1 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {req} (GPU {gpu}; {total} total capacity; "
    "{alloc} already allocated; {free} free; {res} reserved in total by PyTorch)\n"
)
TRACE = 'Traceback (most recent call last):\n  File "/w/train.py", line 40, in <module>\n    out = model(x)\n'


def _bar(head: str) -> str | None:
    text = (
        head
        + TRACE
        + PRE_2_1.format(
            req="400.00 MiB", gpu=0, total="11.76 GiB", alloc="10.89 GiB", free="195.60 MiB", res="10.96 GiB"
        )
    )
    return first_step_bar(text, text.count("\n"))


def test_setup_bars_and_banners_do_not_count_as_training_progress() -> None:
    scans = (
        "train: Scanning /d/labels/train.cache... 580 images, 0 corrupt: 100%|██████████| 580/580 [00:00<?, ?it/s]\n"
        "Starting training for 100 epochs...\n\n"
        "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
        "  0%|          | 0/184 [00:00<?, ?it/s]\n"
    )
    assert _bar(scans) == "0/184"
    sanity = (
        "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:14<00:00,  0.14it/s]\n"
        "Epoch 0:   0%|          | 0/61 [00:00<?, ?it/s]\n"
    )
    assert _bar(sanity) == "0/61"
    banner = "***** Running training *****\n  Num batches each epoch = 2\nSteps:   0%|   | 0/500 [00:00<?, ?it/s]\n"
    assert _bar(banner) == "0/500"
    # a bar that had moved is progress, setup or not
    assert _bar("Epoch 0:   2%|▏         | 1/61 [00:03<03:00,  3.0s/it]\n") is None


def test_openmmlab_memory_column_is_a_peak_in_mib() -> None:
    line = (
        "2024/04/12 10:52:08 - mmengine - INFO - Epoch(train)  [1][2350/2931]  lr: 2.0000e-02  eta: 15:17:55  "
        "time: 0.8126  data_time: 0.0388  memory: 22448  loss: 1.3502"
    )
    assert _sample_on(line) == {
        "allocated_bytes": 22448 << 20,
        "peak_allocated_bytes": 22448 << 20,
        "peak_only": 1,
    }
    assert _sample_on("host memory: 22448 pages") is None  # not a training line of theirs
    rising = "".join(
        f"2024/04/12 10:{k:02d}:00 - mmengine - INFO - Epoch(train)  [1][{50 * k}/2931]  time: 0.81  "
        f"memory: {12000 + 280 * k}  loss: 1.4\n"
        for k in range(1, 40)
    )
    oom = PRE_2_1.format(
        req="606.00 MiB", gpu=0, total="23.69 GiB", alloc="22.62 GiB", free="418.88 MiB", res="22.71 GiB"
    )
    d, ev = diagnose_text(rising + TRACE + oom)
    assert ev.log_peaks_only and ev.trend is not None
    assert d.verdict == "tensor_leak", d.headline


def test_one_reading_per_device_on_a_line_is_the_fullest_devices() -> None:
    s = _sample_on("step 500 loss 0.72 | memory_allocated cuda:0 9.49G cuda:1 3.28G")
    assert s is not None and s["allocated_bytes"] == round(9.49 * (1 << 30))
    assert _sample_on("moving the model to cuda:0 3.2G") is None


def test_the_failing_gpus_rows_of_a_listing_of_several() -> None:
    smi = (
        "|    0   N/A  N/A      5531      C   python main.py                            7012MiB |\n"
        "|    0   N/A  N/A      6120      C   /opt/conda/bin/python serve_api.py        3858MiB |\n"
        "|    1   N/A  N/A      5531      C   python main.py                            6880MiB |\n"
    )
    oom = PRE_2_1.format(
        req="588.00 MiB", gpu=0, total="10.76 GiB", alloc="6.21 GiB", free="155.12 MiB", res="6.46 GiB"
    )
    d, ev = diagnose_text(smi + "Iter 1600 training loss = 2.118\n" + TRACE + oom)
    assert {p.pid: p.own for p in ev.processes} == {5531: True, 6120: False}
    assert d.verdict == "other_process", d.headline
    # the message names GPU 2, which the listing does not show: no rows are read
    _, ev2 = diagnose_text(smi + TRACE + oom.replace("(GPU 0;", "(GPU 2;"))
    assert not ev2.processes


def test_peaks_at_two_batch_sizes_give_the_largest_batch() -> None:
    """Fixed 4 GiB and 0.5 GiB a sample: 12 GiB at 16, 16 GiB at 24; 23.1 GiB usable → 38."""
    sweep = (
        "[bs=16] step 50/50 loss 6.118\n[bs=16] torch.cuda.max_memory_allocated: 12.00 GiB\n"
        "[bs=24] step 50/50 loss 6.092\n[bs=24] torch.cuda.max_memory_allocated: 16.00 GiB\n"
        "[bs=48] starting\n"
    )
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 154.00 MiB. GPU 0 has a total capacity of "
        "23.69 GiB of which 101.36 MiB is free. Including non-PyTorch memory, this process has 23.59 GiB memory in "
        "use. Of the allocated memory 23.00 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    d, ev = diagnose_text(sweep + TRACE + oom)
    assert ev.batch_size == 48 and ev.log_batch_peaks == {16: 12 << 30, 24: 16 << 30}
    assert d.verdict == "workload_too_large"
    assert d.max_batch_size == 38
    assert d.details["max_batch_size"]["source"] == "completed steps at batch sizes 16 and 24"


def test_the_web_uis_memory_monitor_is_a_peak_per_generation() -> None:
    assert _sample_on("Time taken: 9.0 sec.  A: 3.41 GB, R: 4.02 GB, Sys: 5.5/8 GB (68.8%)") == {
        "allocated_bytes": round(3.41 * (1 << 30)),
        "peak_allocated_bytes": round(3.41 * (1 << 30)),
        "peak_only": 1,
    }
    old = _sample_on("Torch active/reserved: 8159/8591 MiB, Sys VRAM: 9061/11019 MiB (82.23%)")
    assert old is not None and old["allocated_bytes"] == 8159 << 20


def test_a_few_flat_peaks_are_enough_to_say_the_steps_did_not_grow() -> None:
    """Five generations peaking at 3.41 GiB, then a pass that asks for 6.33 GiB beside 3.39 GiB held: flat
    peaks read after four prints (a rise takes eight: a peak never reset rises with every larger input)."""
    gens = "".join("Time taken: 8.1 sec.  A: 3.41 GB, R: 4.02 GB, Sys: 5.5/8 GB (68.8%)\n" for _ in range(5))
    oom = PRE_2_1.format(
        req="6.33 GiB", gpu=0, total="8.00 GiB", alloc="3.39 GiB", free="2.61 GiB", res="3.62 GiB"
    )
    d, ev = diagnose_text(gens + TRACE + oom)
    assert ev.trend is not None and ev.log_peaks_only
    assert d.verdict == "workload_too_large", d.headline
    rising = "".join(
        f"Time taken: 8.1 sec.  A: {3.0 + 0.4 * k:.2f} GB, R: 9.0 GB, Sys: 9/11 GB\n" for k in range(5)
    )
    _, ev2 = diagnose_text(rising + TRACE + oom)
    assert ev2.trend is None


def test_a_hub_downloads_bar_is_setup() -> None:
    head = (
        "generation_config.json: 100%|██████████| 234/234 [00:00<00:00, 1.71MB/s]\n"
        "model.safetensors: 100%|██████████| 2.24G/2.24G [00:19<00:00, 116MB/s]\n"
        "  0%|          | 0/60 [00:00<?, ?it/s]\n"
    )
    assert _bar(head) == "0/60"


def test_a_worker_the_launcher_tore_down_at_its_restart_is_an_earlier_attempts() -> None:
    """torchrun restarts its workers; rank 0 of the earlier attempt would not die on SIGTERM and still holds
    71 GiB of GPU 0 when the new rank 0 loads its model there."""
    log = (
        "W0108 05:13:52.340000 30500 torch/distributed/elastic/agent/server/api.py:704] [default] Worker group "
        "FAILED. 3/3 attempts left; will restart worker group\n"
        "W0108 05:13:52.341000 30500 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 30511 "
        "closing signal SIGTERM\n"
        "W0108 05:14:22.343000 30500 torch/distributed/elastic/multiprocessing/api.py:916] Unable to shutdown "
        "process 30511 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\n"
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total "
        "capacity of 79.19 GiB of which 98.00 MiB is free. Process 30511 has 71.12 GiB memory in use. Including "
        "non-PyTorch memory, this process has 7.97 GiB memory in use. Of the allocated memory 7.30 GiB is allocated "
        "by PyTorch, and 150.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(log)
    assert 30511 in ev.earlier_attempt_pids
    assert d.verdict == "other_process", d.headline


def test_a_peak_and_what_the_step_left_behind_under_after() -> None:
    s = _sample_on("[29/64] call.wav dur=845s segments=599 peak_cuda=5.54GiB after=4.71GiB")
    assert s == {"allocated_bytes": round(4.71 * (1 << 30)), "peak_allocated_bytes": round(5.54 * (1 << 30))}
    assert _sample_on("retrying after=3 attempts") is None
