"""Memory a training log printed at its steps, in the spellings real loops use beside the English ones:
Chinese, Russian and Japanese keys with their step words, Lightning's DeviceStatsMonitor figures in
scientific notation, and the shard-by-shard prints of a model still loading (not steps at all).

Each reading is pinned on both sides: a climbing series at one batch size is a leak, the same series
flat is not; the loading prints before an OOM in ``from_pretrained`` are not read as steps.
"""

from __future__ import annotations

import pytest

from triage.messages import memory_samples
from triage.pipeline import diagnose_text
from triage.units import GiB

OOM_22 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 172.00 MiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 97.00 MiB is free. Including non-PyTorch memory, this process has 79.05 GiB memory in "
    "use. Of the allocated memory 77.89 GiB is allocated by PyTorch, and 143.62 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/sft.py", line 212, in train\n'
    "    loss = model(**batch).loss\n"
)


def zh(step: int, alloc: float) -> str:
    return f"2024-05-12 10:03:09 | INFO | 第 {step} 步 | 损失 2.87 | 显存 已分配 {alloc:.2f}GB 已保留 78.1GB 峰值 {alloc + 30:.2f}GB\n"


def ru(step: int, alloc: float) -> str:
    return f"Эпоха 1 | шаг {step}/1000 | потеря 1.82 | память: выделено {alloc:.2f} ГБ, зарезервировано 60.1 ГБ, пик {alloc + 11:.2f} ГБ\n"


def ja(step: int, alloc: float) -> str:
    return f"ステップ {step} | 損失 0.91 | メモリ 割り当て済み {alloc:.2f}GiB ピーク {alloc + 20:.2f}GiB\n"


def lightning(step: int, alloc: float) -> str:
    return (
        f"Epoch 0:  {step // 10}%| | {step}/1000 [00:46<06:55, 2.17it/s, loss=0.889, "
        f"DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current={alloc * 1e9:.2e}, "
        f"DeviceStatsMonitor.on_train_batch_end/reserved_bytes.all.current={70 * 1e9:.2e}]\n"
    )


@pytest.mark.parametrize("line", [zh, ru, ja, lightning])
def test_steps_printed_in_other_spellings_are_read(line) -> None:  # type: ignore[no-untyped-def]
    text = "".join(line(20 * (k + 1), 30.0 + 0.7 * k) for k in range(12))
    samples = memory_samples(text)
    assert [s["step"] for s in samples] == [20 * (k + 1) for k in range(12)]
    assert samples[0]["allocated_bytes"] in (30_000_000_000, 30 * GiB)
    assert samples[-1]["allocated_bytes"] > samples[0]["allocated_bytes"]


@pytest.mark.parametrize("line", [zh, ru, ja, lightning])
@pytest.mark.parametrize("climbs", [True, False])
def test_a_climb_in_any_spelling_is_a_leak(line, climbs: bool) -> None:  # type: ignore[no-untyped-def]
    text = "".join(line(20 * (k + 1), 30.0 + (1.4 * k if climbs else 0.0)) for k in range(24))
    d, ev = diagnose_text(text + TRACEBACK + OOM_22)
    assert ev.trend is not None
    if climbs:
        assert d.verdict == "tensor_leak"
    else:
        assert d.verdict != "tensor_leak"


LOADING = (
    "[rank0] loading meta-llama/Llama-2-13b-hf torch_dtype=torch.float32\n"
    + "".join(
        f"Loading checkpoint shards:  {k * 16}%|█   | {k}/6 [00:{21 * k:02d}<01:45, 21.0s/it]\n"
        f"[mem] after shard {k}/6: allocated={9.3 * k:.2f} GiB reserved={9.3 * k + 0.02:.2f} GiB\n"
        for k in range(1, 5)
    )
    + "Traceback (most recent call last):\n"
    '  File "/home/u/ft/sft.py", line 66, in <module>\n'
    "    model = AutoModelForCausalLM.from_pretrained(\n"
    '  File "/opt/conda/lib/python3.10/site-packages/transformers/modeling_utils.py", line 3531, in '
    "from_pretrained\n"
    "    ) = cls._load_pretrained_model(\n"
    + OOM_22.replace("79.15 GiB", "39.59 GiB").replace("77.89 GiB", "37.17 GiB").replace("79.05", "39.44")
)


def test_shards_loaded_before_an_oom_in_setup_are_not_steps() -> None:
    d, ev = diagnose_text(LOADING)
    assert ev.setup_call is not None and "from_pretrained" in ev.setup_call
    assert ev.steps == [] and ev.step == 0
    assert d.verdict == "workload_too_large"


def test_the_same_prints_in_a_training_loop_are_steps() -> None:
    text = LOADING.replace("from_pretrained", "train_step").replace("AutoModelForCausalLM.", "")
    _, ev = diagnose_text(text)
    assert ev.setup_call is None and len(ev.steps) == 4


RANK3_OOM = "[rank3]: " + TRACEBACK.replace("\n", "\n[rank3]: ").rstrip("[rank3]: ") + "[rank3]: " + OOM_22


@pytest.mark.parametrize("climbs", [True, False])
def test_a_failing_rank_that_printed_nothing_takes_the_trend_of_those_that_did(climbs: bool) -> None:
    """Rank 0 alone logs its memory, rank 3 fails: whether live memory grew holds for every rank running
    the same code; rank 0's peaks are not taken for rank 3's."""
    prints = "".join(
        f"[rank0] step {50 * (k + 1)} loss 2.01 mem alloc {30.0 + (1.2 * k if climbs else 0.0):.2f}G max_allocated 70.1G\n"
        for k in range(16)
    )
    d, ev = diagnose_text(prints + RANK3_OOM)
    assert ev.message is not None and ev.message.rank == 3
    assert len(ev.steps) == 16 and ev.step_peaks == []
    assert ev.log_floor_bytes is None
    assert any("other ranks than the failing rank 3" in n for n in ev.notes)
    assert (d.verdict == "tensor_leak") is climbs
    # the failing rank's own prints, where it made them, are the ones read
    own = prints.replace("[rank0]", "[rank3]")
    _, ev = diagnose_text(own + RANK3_OOM)
    assert ev.log_floor_bytes is not None and ev.step_peaks


def metric_logger(k: int, peak_mib: float) -> str:
    return (
        f"Epoch: [3]  [{10 * k:4d}/5000]  eta: 0:14:17  lr: 0.000100  loss: 0.8812 (0.9024)  time: 0.1719  "
        f"data: 0.0302  max mem: {peak_mib:.0f}\n"
    )


@pytest.mark.parametrize(
    ("prints", "climbs", "leak"), [(24, True, True), (24, False, False), (5, True, False)]
)
def test_peaks_printed_alone(prints: int, climbs: bool, leak: bool) -> None:
    """torchvision's MetricLogger prints torch.cuda.max_memory_allocated() alone ("max mem: 9518", MiB),
    never reset. A long run that rises at nearly every print is growth; a few rising prints are what rarer,
    larger inputs also make (not read as steps); and a peak is never taken for a floor."""
    text = "".join(metric_logger(k, 30000 + (420 * k if climbs else 0)) for k in range(prints))
    samples = memory_samples(text)
    assert len(samples) == prints and all(s.get("peak_only") for s in samples)
    assert samples[0]["allocated_bytes"] == 30000 * 2**20
    d, ev = diagnose_text(text + TRACEBACK + OOM_22)
    assert ev.log_floor_bytes is None
    assert ev.log_peaks_only is (prints >= 8)
    assert (d.verdict == "tensor_leak") is leak
    if leak:
        assert any(e.fact.startswith("The peak the log printed at each step") for e in d.evidence)


def test_the_peak_of_the_reservation_is_not_live_memory() -> None:
    """It is read as a peak printed alone, marked as the reservation's (whether its rise says anything
    about live memory is decided with the OOM's free-in-reserved memory)."""
    text = "".join(f"iter {k} max_mem_reserved: {30 + k} GiB\n" for k in range(12))
    samples = memory_samples(text)
    assert [s["allocated_bytes"] for s in samples] == [(30 + k) * GiB for k in range(12)]
    assert all(s["peak_only"] == 1 and s["reserved"] == 1 for s in samples)


@pytest.mark.parametrize(("prints", "read"), [(5, False), (24, True)])
def test_other_ranks_peaks_printed_alone_follow_the_peak_rules(prints: int, read: bool) -> None:
    """Rank 0 prints only its peak, rank 3 fails: the same bar as the failing rank's own peak prints."""
    text = "".join("[rank0]: " + metric_logger(k, 30000 + 420 * k) for k in range(prints))
    _, ev = diagnose_text(text + RANK3_OOM)
    assert bool(ev.steps) is read and ev.log_peaks_only is read
    assert ev.log_floor_bytes is None


@pytest.mark.parametrize("stranded", [True, False])
def test_flat_peaks_under_an_allocated_key_and_large_holes(stranded: bool) -> None:
    """ "max_mem_alloc 58.1G" every 100 iterations, flat: no leak, and the steps needed about that much. At the
    OOM the step needs a little more while 18.8 GiB of the reservation sits in holes eight times the request:
    fragmentation. With the holes small, the step itself outgrew what it could hold."""
    prints = "".join(
        f"[trainer] it {100 * k:6d} | loss 2.9 | max_mem_alloc {58.0 + 0.1 * (k % 3):.1f}G\n"
        for k in range(31)
    )
    ru, alloc = (18.82, 58.70) if stranded else (0.40, 77.10)
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.34 GiB. GPU 0 has a total capacity of "
        f"79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in "
        f"use. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and {ru:.2f} GiB is reserved by "
        "PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(prints + TRACEBACK + oom)
    assert ev.log_peaks_only and len(ev.steps) == 31
    assert (d.verdict == "fragmentation") is stranded
