"""A log that prints only the allocator's reservation (``torch.cuda.memory_reserved()``, its max, a
``reserved`` column) beside its steps.

The reservation holds every step's peak and never shrinks without ``empty_cache()``, so it is read like a
peak printed alone. Its rise says live memory rose only when the OOM shows the reservation nearly all
allocated; with much of it free at the OOM (holes, cached memory), the rise may be the cache's. A reservation
that stayed flat bounds the earlier steps' peaks either way.

Messages follow torch 2.2+'s template (SNAPSHOT_FORMAT.md §4); the prints are a training loop's own.
"""

from __future__ import annotations

import pytest

from triage.messages import _sample_on
from triage.pipeline import diagnose_text

OOM = (
    "Traceback (most recent call last):\n"
    '  File "/w/train.py", line 77, in <module>\n'
    "    loss = model(x).mean()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req:.2f} GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB "
    "memory in use. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and {ru:.2f} GiB is reserved "
    "by PyTorch but unallocated.\n"
)


def _oom(req: float, alloc: float, ru: float) -> str:
    used = alloc + ru + 0.5
    return OOM.format(req=req, free=79.15 - used, used=used, alloc=alloc, ru=ru)


@pytest.mark.parametrize(
    ("line", "read"),
    [
        ("step 5 torch.cuda.memory_reserved: 21.9 GB", 21_900_000_000),
        ("max_memory_reserved 61.0GiB", 61 << 30),
        ("torch.cuda.memory_reserved()=24159191040", 24_159_191_040),
        ("gpu mem reserved 5G", 5 << 30),
        ("the rest of the memory reserved for KV Cache is 3.1 GiB", None),
        ("reserved 12", None),  # a bare small number is no byte count
    ],
)
def test_the_reservation_printed_alone_is_a_peak(line: str, read: int | None) -> None:
    s = _sample_on(line)
    if read is None:
        assert s is None
    else:
        assert s == {"allocated_bytes": read, "peak_allocated_bytes": read, "peak_only": 1, "reserved": 1}
    # beside an allocated reading, the allocated one is the sample
    both = _sample_on("alloc 10 GB reserved 12 GB")
    assert both is not None and both["allocated_bytes"] == 10_000_000_000 and "reserved" not in both


def _rising() -> str:
    return "".join(
        f"step {k * 100} loss {2 - k * 0.05:.2f} mem_reserved={18 + k * 3.9:.1f}GB\n" for k in range(1, 15)
    )


def test_a_rising_reservation_nearly_all_allocated_at_the_oom_is_a_leak() -> None:
    d, ev = diagnose_text(_rising() + _oom(1.5, 76.8, 1.2))
    assert ev.log_peaks_only and ev.trend is not None and ev.trend.steps == 14
    assert d.verdict == "tensor_leak", d.headline


def test_a_rising_reservation_with_much_of_it_free_at_the_oom_decides_nothing() -> None:
    """27 GiB of the reservation free at the OOM: the reservation's rise may be holes the steps left."""
    d, ev = diagnose_text(_rising() + _oom(1.5, 50.8, 27.2))
    assert ev.trend is None
    assert d.verdict != "tensor_leak"


def test_a_flat_reservation_then_a_step_far_above_it_is_too_large() -> None:
    flat = "".join(f"step {k * 100} loss 1.9 mem_reserved={40 + (k % 2) * 0.2:.1f}GB\n" for k in range(1, 15))
    d, ev = diagnose_text(flat + _oom(30.5, 36.8, 3.2))
    assert ev.trend is not None and ev.log_peaks_only
    assert d.verdict == "workload_too_large", d.headline
