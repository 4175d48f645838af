"""Per-step samples of another device than the OOM's. The collector samples the process's current device;
a process that runs a second model on a second GPU (a reward model in RLHF, a teacher in distillation) can
run out of memory there, and the first GPU's flat steps say nothing of it. The bundles are the collector's
shape (docs/bundle.md) with the OOM message and no snapshot."""

from __future__ import annotations

from typing import Any

from tests.rules.test_timelines import bundle
from triage.pipeline import diagnose_bundle
from triage.units import GiB


def samples(device: int | None) -> list[dict[str, Any]]:
    return [
        {
            "step": k,
            "allocated_bytes": 16 * GiB,
            "peak_allocated_bytes": 30 * GiB,
            "batch_size": 8,
            "device": device,
        }
        for k in range(40)
    ]


def test_samples_of_another_device_are_not_the_failing_devices_steps() -> None:
    b = bundle(samples(0), req=3.1, alloc=74.0, ru=1.2)
    b["device"]["index"] = 1
    _, ev = diagnose_bundle(b)
    assert ev.device == 1 and ev.steps == [] and ev.trend is None
    assert any("another device than the OOM's" in n for n in ev.notes)


def test_samples_of_the_failing_device_or_of_none_named_are_read() -> None:
    for device in (1, None):
        b = bundle(samples(device), req=3.1, alloc=74.0, ru=1.2)
        b["device"]["index"] = 1
        _, ev = diagnose_bundle(b)
        assert len(ev.steps) == 40 and ev.trend is not None
