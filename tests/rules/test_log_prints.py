"""Live memory as loggers print it beside their steps, in the forms a log reader meets: the size before the
word (``mem 5.21GiB alloc``), keys joined by slashes (Lightning's ``mem/alloc_gib``), a qualified peak key
(``peak_allocated(step)``), a key that does not say which counter (``Mem 0.57G``), and two loggers at once
(detectron2's ``max_mem`` beside the job's own live-memory print); the launchers' own SIGKILL after a failed
child, and a checkpoint loaded straight onto the device before the first step. Each is pinned on both sides.

The lines follow what nanoGPT-style loops, Lightning, detectron2 and torch.load print (no framework runs
here).
"""

from __future__ import annotations

import random

from triage.messages import memory_samples, setup_frame
from triage.pipeline import diagnose_text

GiB = 1 << 30

OOM_L4 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 392.00 MiB. GPU 0 has a total capacity "
    "of 22.06 GiB of which 288.00 MiB is free. Including non-PyTorch memory, this process has 21.78 GiB memory "
    "in use. Of the allocated memory 21.11 GiB is allocated by PyTorch, and 256.00 MiB is reserved by PyTorch "
    "but unallocated."
)
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/app/train.py", line 96, in training_step\n'
    "    logits = self.backbone(x)\n"
)


def test_the_size_printed_before_the_word_allocated() -> None:
    text = "\n".join(
        f"iter {100 * k}: loss 10.5, time 2400.00ms, mem {5.21 + 1.12 * k:.2f}GiB alloc / {11.69 + 1.12 * k:.2f}GiB "
        "reserved"
        for k in range(6)
    )
    samples = memory_samples(text)
    assert [s["step"] for s in samples] == [0, 100, 200, 300, 400, 500]
    assert samples[0]["allocated_bytes"] == round(5.21 * GiB)
    assert "peak_only" not in samples[0]
    # the reservation printed alone, size first, is not live memory
    assert memory_samples("iter 1: 11.69GiB reserved\niter 2: 12.81GiB reserved\n") == []


def test_slashed_keys_and_a_qualified_peak_key() -> None:
    bar = "Epoch 0:  5%| | 100/2000 [01:22<25:58, 1.22it/s, train/loss=0.664, mem/alloc_gib=43.4, mem/reserved_gib=58.2]"
    assert memory_samples(bar) == [
        {"allocated_bytes": round(43.4 * GiB), "peak_allocated_bytes": round(43.4 * GiB), "step": 100}
    ]
    line = "[mem] step 10400: allocated=30.31 GiB peak_allocated(step)=44.18 GiB reserved=61.20 GiB"
    assert memory_samples(line) == [
        {"allocated_bytes": round(30.31 * GiB), "peak_allocated_bytes": round(44.18 * GiB), "step": 10400}
    ]


def test_a_key_that_does_not_say_which_counter_is_read_as_a_peak_alone() -> None:
    line = "Epoch: [0][{s:4d}/1015]\tTime  0.452 ( 0.464)\tLoss 9.6538e+00 (9.8538e+00)\tMem {m:.2f}G"
    samples = memory_samples("\n".join(line.format(s=100 * k, m=0.57 + 0.39 * k) for k in range(10)))
    assert len(samples) == 10
    assert all(s.get("peak_only") == 1 for s in samples)
    assert samples[-1]["peak_allocated_bytes"] == round((0.57 + 0.39 * 9) * GiB)
    # the reservation's, the host's and a bare number are not
    assert memory_samples("step 1 reserved mem: 16.6G\nstep 2 host memory 12 GB\nstep 3 mem: 1234\n") == []


def _two_loggers(live: list[float]) -> str:
    lines = []
    for k, level in enumerate(live):
        for j in range(5):
            it = 500 * k + 80 * j + 19
            lines.append(
                f"d2.utils.events INFO:  iter: {it}  total_loss: 2.9  lr: 1.0e-04  max_mem: {44577 + 4 * it}M"
            )
        lines.append(
            f"vitdet.train INFO: [memdebug] iter {500 * (k + 1)}: live allocated {level:.2f} GiB between steps"
        )
    return "\n".join(lines)


def test_two_loggers_live_memory_and_the_peak_alone_are_read_apart() -> None:
    # four live-memory prints: the live series, each with the highest peak printed since the one before
    text = _two_loggers([21.44, 33.45, 45.46, 57.47]) + "\n" + TRACEBACK + OOM_L4 + "\n"
    _, ev = diagnose_text(text)
    assert [s.allocated_bytes for s in ev.steps] == [round(x * GiB) for x in (21.44, 33.45, 45.46, 57.47)]
    assert ev.steps[0].peak_allocated_bytes == (44577 + 4 * 339) * (1 << 20)
    assert not ev.log_peaks_only
    # three: too few for a live series; the peaks printed alone are the steps
    _, ev = diagnose_text(_two_loggers([21.44, 33.45, 45.46]) + "\n" + TRACEBACK + OOM_L4 + "\n")
    assert ev.log_peaks_only
    assert len(ev.steps) == 15
    assert ev.trend is not None and ev.trend.rising_fraction == 1.0


def _lightning(kill_line: str) -> str:
    bars = "\r".join(
        f"Epoch 0:  {k}%| | {50 * k}/400 [00:36<04:15, 1.37it/s, train_loss=3.9, gpu_mem_gb={6.21 + 0.2 * k:.2f}]"
        for k in range(1, 9)
    )
    return (
        "Initializing distributed: GLOBAL_RANK: 2, MEMBER: 3/4\n" + bars + "\n" + TRACEBACK + OOM_L4 + "\n"
        "[rank: 2] Child process with PID 23145 terminated with code 1. " + kill_line + "\nKilled\n"
    )


def test_lightning_killing_the_other_processes_after_a_child_failed_is_not_a_memory_kill() -> None:
    d, ev = diagnose_text(_lightning("Forcefully terminating all other processes to avoid zombies 🧟"))
    assert ev.other_killer is not None and "Forcefully terminating" in ev.other_killer
    assert d.verdict != "host_memory_limit"
    # without the launcher's word, Killed after the traceback is the kernel's
    d, ev = diagnose_text(_lightning(""))
    assert ev.other_killer is None
    assert "host_memory_limit" in d.candidates


CKPT_TRACEBACK = """Traceback (most recent call last):
  File "/app/train.py", line 296, in main
    state = load_checkpoint(cfg.resume, model, optimizer)
  File "/app/utils/ckpt.py", line 52, in load_checkpoint
    ckpt = torch.load(path, map_location="cuda")
  File "/usr/local/lib/python3.10/dist-packages/torch/serialization.py", line 1014, in load
    return _load(opened_zipfile,
  File "/usr/local/lib/python3.10/dist-packages/torch/serialization.py", line 279, in _cuda_deserialize
    return obj.cuda(device)
"""


def test_a_checkpoint_loaded_onto_the_device_before_any_step_is_setup() -> None:
    text = "INFO model on device, allocated=4.89 GiB\n" + CKPT_TRACEBACK + OOM_L4 + "\n"
    line_no = text.count("\n")
    assert setup_frame(text, line_no) == "serialization.py:1014 in load"
    d, ev = diagnose_text(text)
    assert ev.step == 0
    assert d.verdict == "workload_too_large"
    # the same load after training had gone on (an evaluation swapping weights in) is not setup
    text = "step 1200 | loss 0.52\n" + CKPT_TRACEBACK + OOM_L4 + "\n"
    assert setup_frame(text, text.count("\n")) is None


def _epoch_bars(levels: list[list[float]]) -> str:
    return "\n".join(
        f"Epoch {ep}: {(k + 1) * 10}%|██  | {(k + 1) * 100}/1000 [01:00<02:00, 1.2it/s, loss=2.1, mem_alloc={a:.2f}GiB]"
        for ep, row in enumerate(levels)
        for k, a in enumerate(row)
    )


def test_a_progress_bar_per_epoch_counts_on_across_epochs() -> None:
    """A bar that starts its count again each epoch is one run going on; a count that starts again in the
    same epoch at the first sample's level is a new attempt."""
    swing = [[22.1, 18.4, 23.5, 19.0, 21.7], [18.2, 23.9, 19.6, 22.0, 18.9], [21.4, 18.1, 23.2, 19.9, 22.6]]
    samples = memory_samples(_epoch_bars(swing))
    steps = [s["step"] for s in samples]
    assert len(steps) == 15 and steps == sorted(set(steps))
    assert [round(s["allocated_bytes"] / GiB, 1) for s in samples] == [a for row in swing for a in row]
    frag = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.10 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 1.05 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory in "
        "use. Of the allocated memory 41.20 GiB is allocated by PyTorch, and 36.30 GiB is reserved by PyTorch but "
        "unallocated."
    )
    d, ev = diagnose_text(_epoch_bars(swing) + "\n" + TRACEBACK + frag + "\n")
    assert len(ev.steps) == 15 and ev.restart_growth is None
    # fifteen steps swinging around one level: nothing grows, nothing to call a leak
    assert d.verdict in ("fragmentation", "inconclusive") and "tensor_leak" not in d.candidates, d.headline
    # the same bar without epochs: the count starting again at the first sample's level is a new attempt
    plain = "\n".join(line.split(": ", 1)[1] for line in _epoch_bars(swing).split("\n"))
    assert len(memory_samples(plain)) < 15


def test_a_qualified_allocated_key_and_a_bare_peak_beside_it() -> None:
    line = "[asr] batch=400 reqs=12 max_audio=47.2s | alloc_idle=3.12GiB peak=11.96GiB reserved=10.43GiB"
    (s,) = memory_samples(line)
    assert round(s["allocated_bytes"] / GiB, 2) == 3.12 and round(s["peak_allocated_bytes"] / GiB, 2) == 11.96
    # a bare peak with no allocated reading beside it is not read as live memory: the reservation printed
    # beside it is the line's reading, a peak printed alone
    (r,) = memory_samples("[asr] batch=400 peak=11.96GiB reserved=10.43GiB")
    assert round(r["allocated_bytes"] / GiB, 2) == 10.43 and r["peak_only"] == r["reserved"] == 1


def test_holes_decide_a_step_a_little_above_the_earlier_peaks_with_room_to_spare() -> None:
    """Thirty steps with live memory flat at 31 GiB and peaks of 51-52 GiB; at the OOM the step needs 56.5 GiB
    of the 78.6 GiB it could hold while 24.9 GiB sits in split segments, six times the request: packed, a step
    this close to the earlier ones fits. The same holes beside a step that already needs nearly all the job
    could hold decide nothing."""
    rng = random.Random(8)
    prints = "".join(
        f"step {100 * (k + 1)}: mem_alloc={rng.uniform(31.2, 31.6):.1f}G mem_reserved={52 + 0.9 * k:.1f}G "
        f"peak={rng.uniform(50.9, 52.3):.1f}G\n"
        for k in range(30)
    )
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.30 GiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in "
        "use. Of the allocated memory {a} GiB is allocated by PyTorch, and {ru} GiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    d, ev = diagnose_text(prints + TRACEBACK + oom.format(a="52.20", ru="24.90"))
    assert ev.peaks_sampled and len(ev.steps) == 30
    assert d.verdict == "fragmentation", d.headline
    d, _ = diagnose_text(prints + TRACEBACK + oom.format(a="70.20", ru="6.90"))
    assert d.verdict != "fragmentation"


def _yolo(gpu_mem: list[str]) -> str:
    head = "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
    rows = "".join(
        head
        + f"      {k + 1}/100      {g}       1.45       1.81       1.27        121        640: 100%|██████████| "
        "1012/1012 [10:22<00:00, 1.63it/s]\n"
        for k, g in enumerate(gpu_mem)
    )
    return "Ultralytics 8.3.2 🚀 Python-3.10.12 torch-2.4.1+cu121 CUDA:0 (Tesla T4, 15102MiB)\n" + rows


def test_ultralytics_gpu_mem_column_is_read_per_epoch() -> None:
    """Ultralytics prints torch.cuda.memory_reserved() / 1e9 as GPU_mem in its table, one row per epoch:
    read as a peak printed alone. Rising every epoch is a leak; flat, the step that then wants far more is a
    bigger demand."""
    rising = [f"{5.02 + 1.29 * k:.3g}G" for k in range(9)]
    samples = memory_samples(_yolo(rising))
    assert [s["step"] for s in samples] == list(range(1, 10)) and all(s.get("peak_only") for s in samples)
    assert samples[0]["allocated_bytes"] == 5_020_000_000
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of "
        "14.75 GiB of which 5.00 MiB is free. Including non-PyTorch memory, this process has 14.74 GiB memory in "
        "use. Of the allocated memory {a} is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    d, _ = diagnose_text(_yolo(rising) + TRACEBACK + oom.format(req="20.00 MiB", a="14.44 GiB"))
    assert d.verdict == "tensor_leak", d.headline
    flat = ["6.1G", "6.2G", "6.1G", "6.2G", "6.2G", "6.1G", "6.2G", "6.2G", "6.1G"]
    d, _ = diagnose_text(_yolo(flat) + TRACEBACK + oom.format(req="4.20 GiB", a="10.30 GiB"))
    assert d.verdict == "workload_too_large", d.headline
    # a table without the column reads nothing
    assert memory_samples(_yolo(rising).replace("GPU_mem", "gpu_util")) == []


def test_a_validation_loop_that_keeps_its_outputs_is_a_late_leak() -> None:
    """Training flat at 41.3 GiB, then six validation prints, each 15 GiB higher, right up to the OOM: fewer
    rises than a slow late leak needs, but together two thirds of the device. A step that merely
    needed more shows no such climb."""
    train = "".join(f"train step {250 * k} loss 4.2 allocated=41.3GiB reserved=92.6GiB\n" for k in range(9))
    val = "".join(f"val batch {10 * k}/1250 allocated={36.0 + 15.2 * k:.1f}GiB\n" for k in range(7))
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB. GPU 0 has a total capacity of "
        "139.81 GiB of which 1.10 GiB is free. Including non-PyTorch memory, this process has 138.71 GiB memory "
        "in use. Of the allocated memory 137.70 GiB is allocated by PyTorch, and 520.00 MiB is reserved by "
        "PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(train + "running validation (1250 batches)\n" + val + TRACEBACK + oom)
    assert ev.trend is not None and ev.trend.tail_rises == 6
    assert d.verdict == "tensor_leak", d.headline
    # the same rises of a few hundred MiB each: too small to have filled the device, not decided by them
    small = "".join(f"val batch {10 * k}/1250 allocated={41.3 + 0.3 * k:.1f}GiB\n" for k in range(7))
    d, _ = diagnose_text(train + small + TRACEBACK + oom)
    assert d.verdict != "tensor_leak"


def test_a_tiny_rise_decides_only_in_floors_and_only_when_it_could_account_for_the_oom() -> None:
    """A rise of 40 MiB a print, 320 MiB in all. Printed as a peak alone (detectron2's ``max_mem``) it is no
    leak: a peak moves with the input. Printed as the floor after each step (exact to the byte in a healthy
    loop) it is something kept, unless the step was short by more than everything that grew."""
    peaks = "".join(
        f"[03/21 04:11:19 d2.utils.events]:  eta: 1 day, 2:11:19  iter: {19 + 400 * k}  total_loss: 1.7  "
        f"max_mem: {55101 + 40 * k}M\n"
        for k in range(9)
    )
    floors = "".join(f"iter {19 + 400 * k} loss 1.7 mem_allocated {55101 + 40 * k}M\n" for k in range(9))
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req} GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 400.00 MiB is free. Including non-PyTorch memory, this process has 78.75 GiB memory in "
        "use. Of the allocated memory {a} GiB is allocated by PyTorch, and {ru} GiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    near = oom.format(req="0.90", a="78.00", ru="0.30")  # short by 0.2 GiB: less than the rise
    d, _ = diagnose_text(peaks + TRACEBACK + near)
    assert d.verdict != "tensor_leak", d.headline
    d, _ = diagnose_text(floors + TRACEBACK + near)
    assert d.verdict == "tensor_leak", d.headline
    # short by 3 GiB against a 320 MiB rise: without the rise it still fails
    d, _ = diagnose_text(floors + TRACEBACK + oom.format(req="4.00", a="77.90", ru="0.40"))
    assert d.verdict != "tensor_leak", d.headline


def test_memory_stats_memory_summary_and_lightnings_metrics_csv() -> None:
    """torch.cuda.memory_stats() printed (a dict on Python 3.12, pairs before), memory_summary()'s
    "Allocated memory" row, and Lightning's DeviceStatsMonitor columns in metrics.csv: the whole device's
    current and peak, never the cumulative counters."""
    as_dict = (
        "step 200 stats {'allocated_bytes.all.allocated': 380179572224, 'allocated_bytes.all.current': "
        "4584415744, 'allocated_bytes.all.freed': 375595156480, 'allocated_bytes.all.peak': 7913015398, "
        "'allocated_bytes.large_pool.current': 4520452608}"
    )
    pairs = (
        "step 200 stats OrderedDict([('allocated_bytes.all.allocated', 380179572224), "
        "('allocated_bytes.all.current', 4584415744), ('allocated_bytes.all.peak', 7913015398)])"
    )
    for line in (as_dict, pairs):
        (s,) = memory_samples(line)
        assert (s["allocated_bytes"], s["peak_allocated_bytes"]) == (4584415744, 7913015398)
    assert memory_samples("stats {'allocated_bytes.all.allocated': 380179572224}") == []
    summary = "| Allocated memory      |   3993 MiB |   6963 MiB |  46778 GiB |  46775 GiB |"
    (s,) = memory_samples(summary)
    assert (s["allocated_bytes"], s["peak_allocated_bytes"]) == (3993 << 20, 6963 << 20)
    csv = (
        "epoch,step,DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current,"
        "DeviceStatsMonitor.on_train_batch_end/reserved_bytes.all.current\n"
        + "".join(
            f"0,{49 + 250 * k},{4225775104 + 1728723968 * k},{6264193024 + 1728723968 * k}\n"
            for k in range(8)
        )
    )
    samples = memory_samples(csv)
    assert [s["step"] for s in samples] == [49 + 250 * k for k in range(8)]
    assert samples[1]["allocated_bytes"] == 4225775104 + 1728723968
    d, _ = diagnose_text(csv + TRACEBACK + OOM_L4)
    assert d.verdict == "tensor_leak", d.headline


def _curriculum(levels: list[tuple[int, float]], last: str) -> str:
    lines = "".join(
        f"[{500 * (k + 1)}] seq_len={seq} bs=8 loss=2.{90 - k} allocated={a:.1f}GiB peak={a + 0.6:.1f}GiB\n"
        for k, (seq, a) in enumerate(levels)
    )
    return lines + last


def test_live_memory_that_rose_only_with_the_printed_input_size_is_no_leak() -> None:
    """A curriculum: seq_len 512 → 1024 → 2048 → 4096 printed beside each step, live memory flat at each
    length and higher at the next; the last line before the OOM starts 8192. The rises follow the input, and
    the failing step is the first at its size. The same rises at one length are something kept."""
    levels = [(512, 17.9)] * 4 + [(1024, 21.6)] * 4 + [(2048, 29.0)] * 4 + [(4096, 43.8)] * 4
    oom = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 4.60 GiB is free. Including non-PyTorch memory, this process has 74.51 GiB memory "
        "in use. Of the allocated memory 72.90 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch "
        "but unallocated.\n"
    )
    text = _curriculum(levels, "[8001] seq_len=8192 bs=8\n" + TRACEBACK + oom)
    d, ev = diagnose_text(text)
    assert ev.growth_with_input == ("seq_len", 512, 4096)
    assert ev.log_size_change == ("seq_len", 4096, 8192)
    assert d.verdict == "workload_too_large", d.headline
    same = [(4096, a) for _, a in levels]
    d, ev = diagnose_text(_curriculum(same, TRACEBACK + oom))
    assert ev.growth_with_input is None and ev.log_size_change is None
    assert d.verdict == "tensor_leak", d.headline


def test_an_old_cached_figure_larger_than_the_device_allows_is_the_whole_reservation() -> None:
    """torch ≤ 1.3 printed the cached-but-unallocated memory ("7.33 GiB already allocated; 1.94 MiB free;
    15.39 MiB cached"); a figure that, added to what was allocated, would exceed the device is the whole
    reservation instead. And a bar at 0/N under a first epoch counted from one ("Epoch 1/20") is the first
    step."""
    from triage.messages import parse_messages

    (m,) = parse_messages(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 7.93 GiB total capacity; 7.33 GiB "
        "already allocated; 1.94 MiB free; 15.39 MiB cached)"
    )
    assert m.reserved_unallocated_bytes == round(15.39 * (1 << 20))
    old = (
        "RuntimeError: CUDA out of memory. Tried to allocate 1.56 GiB (GPU 0; 11.17 GiB total capacity; 9.42 GiB "
        "already allocated; 722.50 MiB free; 10.12 GiB cached)"
    )
    (m,) = parse_messages(old)
    assert m.reserved_bytes == round(10.12 * GiB)
    text = "Epoch 1/20\n\r  0%|          | 0/1875 [00:00<?, ?it/s]" + TRACEBACK + old + "\n"
    d, ev = diagnose_text(text)
    assert ev.first_step_bar == "0/1875" and d.verdict == "workload_too_large", d.headline
    d, ev = diagnose_text(text.replace("Epoch 1/20", "Epoch 2/20"))
    assert ev.first_step_bar is None


def test_a_size_printed_without_an_equals_sign() -> None:
    steps = "".join(
        f"step {50 * (k + 1)} tokens_in_batch 8013 max_len {987 - 37 * k} reserved 15.2GiB\n"
        for k in range(8)
    )
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
        "22.05 GiB of which 1.32 GiB is free. Process 3188214 has 20.72 GiB memory in use. Of the allocated memory "
        "20.40 GiB is allocated by PyTorch, and 320.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    _, ev = diagnose_text(
        steps + "step 413 tokens_in_batch 8192 max_len 8192 (single long document)\n" + TRACEBACK + oom
    )
    assert ev.log_size_change == ("max_len", 728, 8192)


def test_the_loops_own_lines_naming_step_0_as_the_one_it_is_in() -> None:
    """ "[mem] step 0 after backward" before the OOM: the first step had not finished, nothing could have
    leaked. A line naming a later step, or a completed step 0 followed by later ones, is not that."""
    from triage.messages import first_step_bar

    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 394.00 MiB. GPU 0 has a total capacity of "
        "21.99 GiB of which 211.00 MiB is free. Including non-PyTorch memory, this process has 21.78 GiB memory in "
        "use. Of the allocated memory 21.20 GiB is allocated by PyTorch, and 140.00 MiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    head = (
        "[mem] after model.cuda(): allocated=5.27GiB reserved=5.29GiB\n"
        "[mem] step 0 after forward: allocated=13.12GiB reserved=13.60GiB\n"
        "[mem] step 0 after backward: allocated=10.55GiB reserved=16.72GiB\n"
    )
    text = head + TRACEBACK + oom
    assert first_step_bar(text, text.count("\n")) == "step 0"
    d, ev = diagnose_text(text)
    assert ev.step == 0 and d.verdict == "workload_too_large", d.headline
    later = head + "[mem] step 1 after forward: allocated=13.12GiB reserved=16.72GiB\n" + TRACEBACK + oom
    assert first_step_bar(later, later.count("\n")) is None


def test_gpu_memory_in_use_under_a_chinese_or_russian_key_is_read_as_a_peak_alone() -> None:
    """ "显存占用 8.48 GB" (GPU memory in use) does not say which counter: the weakest reading, a peak printed
    alone, as for "Mem 0.57G". Its cache beside it ("缓存") is the reservation, not read."""
    lines = "".join(
        f"训练步数 {100 * (k + 1)} | 损失 1.890 | 显存占用 {8.48 + 0.445 * k:.2f} GB | 缓存 {8.79 + 0.445 * k:.2f} GB\n"
        for k in range(12)
    )
    samples = memory_samples(lines)
    assert len(samples) == 12 and all(s.get("peak_only") for s in samples)
    assert samples[0]["allocated_bytes"] == 8_480_000_000
    (s,) = memory_samples("шаг 100 | GPU-память 12.5 ГБ")
    assert s["allocated_bytes"] == round(12.5 * 1000**3)
    d, _ = diagnose_text(lines + TRACEBACK + OOM_L4.replace("22.06 GiB", "31.74 GiB"))
    assert d.verdict == "tensor_leak", d.headline
