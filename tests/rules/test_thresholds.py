"""Every rule on both sides of its thresholds, on Evidence built field by field.

Each case states the fact that moves and asserts the finding (or its absence) and its explanation.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from rules import (
    fragmentation,
    gpu_quota,
    host_memory_limit,
    other_process,
    shm_exhausted,
    tensor_leak,
    workload_too_large,
)
from rules.base import CANDIDATE, LIKELY, STRONG
from triage.engine import diagnose
from triage.evidence import Evidence, Process, StepTrend
from triage.units import GiB, KiB, MiB


def cuda(**kw: Any) -> Evidence:
    base: dict[str, Any] = {
        "kind": "cuda_oom",
        "total_bytes": 80 * GiB,
        "device_free_bytes": 100 * MiB,
        "reserved_bytes": 78 * GiB,
        "allocated_bytes": 77 * GiB,
        "request_bytes": 2 * GiB,
    }
    base.update(kw)
    return Evidence(**base)


def trend(values: list[int], peaks: list[int] | None = None) -> StepTrend:
    from triage.evidence import _trend

    samples = [
        {"step": i, "allocated_bytes": v, "peak_allocated_bytes": (peaks[i] if peaks else v)}
        for i, v in enumerate(values)
    ]
    t = _trend(samples)
    assert t is not None
    return t


# ---------------------------------------------------------------- shm_exhausted
def test_shm_fires_on_shm_kind_and_cites_the_default_size() -> None:
    f = shm_exhausted.evaluate(
        Evidence(kind="shm_exhausted", shm_total_bytes=64 * MiB, shm_used_bytes=63 * MiB)
    )
    assert f is not None and f.score >= STRONG
    assert any("64 MiB default" in s for s in f.facts)


@pytest.mark.parametrize(
    ("used", "fires"), [(int(0.9 * 64 * MiB) + 1, True), (int(0.9 * 64 * MiB) - 1, False)]
)
def test_shm_on_a_plain_crash_needs_a_full_shm(used: int, fires: bool) -> None:
    f = shm_exhausted.evaluate(Evidence(kind="crash", shm_total_bytes=64 * MiB, shm_used_bytes=used))
    assert (f is not None) is fires


def test_shm_on_a_crash_with_a_sigbus_worker() -> None:
    f = shm_exhausted.evaluate(
        Evidence(kind="crash", shm_total_bytes=64 * MiB, shm_used_bytes=0, dead_workers_sigbus=2)
    )
    assert f is not None and f.score >= LIKELY
    assert any("2 DataLoader worker(s) died of SIGBUS" in s for s in f.facts)


def test_shm_does_not_fire_on_a_cuda_oom() -> None:
    assert shm_exhausted.evaluate(cuda(shm_total_bytes=64 * MiB)) is None


# ---------------------------------------------------------------- host_memory_limit
def test_host_oom_fires_and_reports_the_limit() -> None:
    f = host_memory_limit.evaluate(
        Evidence(kind="host_oom", cgroup_limit_bytes=64 * GiB, cgroup_usage_bytes=63 * GiB, oom_kill_count=1)
    )
    assert f is not None and f.score >= STRONG
    assert any("memory limit is 64.0 GiB" in s for s in f.facts)


@pytest.mark.parametrize(
    ("usage", "bonus"), [(math.ceil(0.9 * 64 * GiB), True), (int(0.89 * 64 * GiB), False)]
)
def test_host_usage_near_the_limit_strengthens(usage: int, bonus: bool) -> None:
    f = host_memory_limit.evaluate(
        Evidence(kind="host_oom", cgroup_limit_bytes=64 * GiB, cgroup_usage_bytes=usage)
    )
    assert f is not None
    assert (f.score > STRONG) is bonus


def test_exit_137_alone_is_likely_and_exit_1_is_nothing() -> None:
    f = host_memory_limit.evaluate(Evidence(kind="crash", exit_code=137))
    assert f is not None and f.score == pytest.approx(LIKELY)
    assert host_memory_limit.evaluate(Evidence(kind="crash", exit_code=1)) is None


# ---------------------------------------------------------------- gpu_quota
def test_fraction_cap_with_free_device_memory_is_strong() -> None:
    f = gpu_quota.evaluate(
        cuda(fraction_cap_bytes=40 * GiB, device_free_bytes=30 * GiB, allocated_bytes=38 * GiB)
    )
    assert f is not None and f.score >= STRONG
    assert any("per-process memory cap" in s for s in f.facts)


@pytest.mark.parametrize(("cap_fraction", "fires"), [(0.97, True), (0.99, False)])
def test_fraction_cap_must_be_below_the_device(cap_fraction: float, fires: bool) -> None:
    ev = cuda(fraction_cap_bytes=int(cap_fraction * 80 * GiB), device_free_bytes=10 * GiB)
    assert (gpu_quota.evaluate(ev) is not None) is fires


@pytest.mark.parametrize(("declared", "fires"), [(int(1.06 * 40 * GiB), True), (int(1.04 * 40 * GiB), False)])
def test_declared_bigger_than_actual_device(declared: int, fires: bool) -> None:
    ev = cuda(
        total_bytes=40 * GiB, declared_total_bytes=declared, reserved_bytes=39 * GiB, allocated_bytes=38 * GiB
    )
    f = gpu_quota.evaluate(ev)
    assert (f is not None) is fires
    if f:
        assert f.score >= STRONG


def test_mig_slice_is_a_quota_finding() -> None:
    f = gpu_quota.evaluate(
        cuda(total_bytes=10 * GiB, mig_profile="1g.10gb", reserved_bytes=9 * GiB, allocated_bytes=9 * GiB)
    )
    assert f is not None and f.score >= LIKELY
    assert any("MIG slice (1g.10gb)" in s for s in f.facts)


def test_no_limit_no_quota() -> None:
    assert gpu_quota.evaluate(cuda()) is None


# ---------------------------------------------------------------- other_process
def _others(used: int, own_nvml: bool = True) -> Evidence:
    procs = [Process(100, 60 * GiB, True, "nvml"), Process(200, used, False, "nvml")]
    return cuda(
        processes=procs,
        own_pids={100} if own_nvml else set(),
        own_process_identified=True,
        other_process_bytes=used,
        reserved_bytes=59 * GiB,
        allocated_bytes=58 * GiB,
        request_bytes=2 * GiB,
    )


@pytest.mark.parametrize(("used", "fires"), [(GiB, True), (GiB - 1, False)])
def test_neighbour_must_hold_at_least_a_gib(used: int, fires: bool) -> None:
    f = other_process.evaluate(_others(used))
    assert (f is not None) is fires


def test_a_big_neighbour_identified_by_pid_is_strong() -> None:
    f = other_process.evaluate(_others(20 * GiB))
    assert f is not None and f.score >= STRONG
    assert any("pid 200 (20.0 GiB)" in s for s in f.facts)


def test_neighbour_does_not_matter_when_the_job_alone_exceeds_the_gpu() -> None:
    ev = _others(20 * GiB)
    ev.allocated_bytes = 79 * GiB
    ev.request_bytes = 2 * GiB
    f = other_process.evaluate(ev)
    assert f is not None and f.score <= CANDIDATE


# ---------------------------------------------------------------- fragmentation
def _frag(largest: int, ru: int, req: int = 512 * MiB, expandable: bool | None = False) -> Evidence:
    from triage.snapshot.model import Segment, Snapshot

    seg = Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])
    return cuda(
        snapshot=Snapshot([seg], [], {}, [], era="v2"),
        trend=trend([50 * GiB] * 8),  # the collector's samples: live memory flat across steps
        reserved_bytes=70 * GiB,
        allocated_bytes=70 * GiB - ru,
        request_bytes=req,
        largest_free_block_bytes=largest,
        expandable_segments=expandable,
    )


def test_fragmentation_when_the_largest_hole_is_one_byte_too_small() -> None:
    f = fragmentation.evaluate(_frag(largest=512 * MiB - 1, ru=6 * GiB))
    assert f is not None and f.score >= STRONG
    assert "largest free block in the large pool was 512.0 MiB" in " ".join(f.facts) or f.facts


def test_no_fragmentation_when_a_hole_fits_the_request() -> None:
    assert fragmentation.evaluate(_frag(largest=512 * MiB, ru=6 * GiB)) is None


def test_the_hole_is_measured_against_the_rounded_request_of_the_trace() -> None:
    """The message prints "2.08 GiB" for a 2133.7 MiB block; a 2130.4 MiB hole reads larger than that figure
    but is smaller than the block the allocator looked for (the trace's oom entry)."""
    ev = _frag(largest=int(2130.4 * MiB), ru=10 * GiB, req=int(2.08 * GiB))
    assert fragmentation.evaluate(ev) is None  # from the message's figure alone, the hole fits
    ev.request_rounded_bytes = 2237335040
    assert ev.block_request_bytes == 2237335040
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score >= STRONG


@pytest.mark.parametrize(("ru", "fires"), [(412 * MiB, True), (412 * MiB - 1, False)])
def test_fragmentation_needs_cached_plus_device_free_memory_at_least_the_request(
    ru: int, fires: bool
) -> None:
    """The holes and the device's free memory (100 MiB here) together must hold the 512 MiB request: then
    it failed only because no single piece was large enough (the holes cannot be released while live
    blocks pin their segments)."""
    f = fragmentation.evaluate(_frag(largest=1 * MiB, ru=ru))
    assert (f is not None) is fires
    if f is not None:
        assert "together enough for the 512.0 MiB requested" in " ".join(f.facts)


def test_expandable_segments_on_makes_the_torch_hint_wrong() -> None:
    f = fragmentation.evaluate(_frag(largest=1 * MiB, ru=6 * GiB, expandable=True))
    assert f is not None and f.score < LIKELY
    assert any("torch's hint" in s for s in f.facts)


# ---------------------------------------------------------------- tensor_leak
def test_leak_from_a_rising_step_timeline() -> None:
    vals = [10 * GiB + i * 300 * MiB for i in range(20)]
    f = tensor_leak.evaluate(cuda(trend=trend(vals)))
    assert f is not None and f.score >= LIKELY
    assert any("grew in 100% of 20 steps" in s for s in f.facts)


@pytest.mark.parametrize(("rising_steps", "fires"), [(14, True), (13, False)])
def test_leak_needs_70_percent_rising_steps_when_memory_also_falls(rising_steps: int, fires: bool) -> None:
    # 20 changes: `rising_steps` rises of 400 MiB, 3 falls of 10 MiB (15%), the rest flat
    vals = [10 * GiB]
    changes = [-10 * MiB] * 3 + [0] * (17 - rising_steps) + [400 * MiB] * rising_steps
    for d in changes:
        vals.append(vals[-1] + d)
    t = trend(vals)
    assert t.rising_fraction == pytest.approx(rising_steps / 20)
    assert t.falling_fraction == pytest.approx(3 / 20)
    f = tensor_leak.evaluate(cuda(trend=t))
    assert (f is not None and f.score >= LIKELY - 0.1) is fires


@pytest.mark.parametrize(
    ("falls", "fall", "fires"), [(2, 50 * MiB, True), (3, 50 * MiB, False), (3, 20 * MiB, True)]
)
def test_growth_that_never_falls_is_a_leak_even_every_other_step(falls: int, fall: int, fires: bool) -> None:
    # a tensor kept every other step: 10 rises of 500 MiB among 20 changes; ≤ 10% falls still counts, and a
    # fall of a twentieth of a riser or less (a small block's wobble) is no fall at all
    vals = [10 * GiB]
    changes = [500 * MiB, 0] * 10
    for k in range(falls):
        changes[2 * k + 1] = -fall
    for d in changes:
        vals.append(vals[-1] + d)
    f = tensor_leak.evaluate(cuda(trend=trend(vals)))
    assert (f is not None and f.score >= LIKELY - 0.1) is fires


def test_a_plateau_clears_the_leak() -> None:
    vals = [10 * GiB + min(i, 8) * 500 * MiB for i in range(24)]
    assert tensor_leak.evaluate(cuda(trend=trend(vals))) is None


def test_leak_is_only_a_candidate_from_a_message_alone() -> None:
    f = tensor_leak.evaluate(cuda(step=None))
    assert f is not None and f.score == CANDIDATE
    assert f.missing


def test_no_leak_before_the_first_step_completes() -> None:
    assert tensor_leak.evaluate(cuda(step=0)) is None


# ---------------------------------------------------------------- workload_too_large
def test_too_large_at_step_zero_estimates_max_batch() -> None:
    t = None
    ev = cuda(
        step=0,
        batch_size=64,
        trend=t,
        reserved_bytes=70 * GiB,
        allocated_bytes=70 * GiB,
        device_free_bytes=8 * GiB,
        request_bytes=4 * GiB,
    )
    f = workload_too_large.evaluate(ev)
    assert f is not None and f.score >= LIKELY
    assert f.max_batch_size is not None and f.max_batch_size < 64


def test_max_batch_from_completed_steps() -> None:
    from triage.evidence import _step_samples

    # fixed 20 GiB, peaks 20 + 32*1 GiB at batch 32 → 1 GiB per sample; usable 50 + 28 = 78 GiB → 58,
    # but batch 32 itself just failed (a longer sequence, say): the answer is capped below it
    timeline = [
        {"step": i, "allocated_bytes": 20 * GiB, "peak_allocated_bytes": 52 * GiB, "batch_size": 32}
        for i in range(5)
    ]
    ev = cuda(
        step=5,
        batch_size=32,
        steps=_step_samples(timeline),
        reserved_bytes=50 * GiB,
        allocated_bytes=50 * GiB,
        device_free_bytes=28 * GiB,
        request_bytes=2 * GiB,
    )
    est, info = workload_too_large.estimate_max_batch(ev)
    assert info["source"] == "4 completed steps"
    assert (info["fixed_bytes"], info["per_sample_bytes"], info["usable_bytes"]) == (20 * GiB, GiB, 78 * GiB)
    assert est == 31
    ev.kind = "none"  # the same numbers without an OOM: the uncapped estimate
    assert workload_too_large.estimate_max_batch(ev)[0] == 58
    # 8 GiB still reserved but unallocated at the OOM: split segments the allocator could not release
    # are not there for tensors; 78 - 8 - 20 = 50
    ev.reserved_bytes, ev.device_free_bytes = 58 * GiB, 20 * GiB
    est, info = workload_too_large.estimate_max_batch(ev)
    assert (est, info["stranded_bytes"]) == (50, 8 * GiB)


def test_message_alone_is_inconclusive_between_leak_and_batch() -> None:
    d = diagnose(cuda())
    assert d.verdict == "inconclusive"
    assert {"tensor_leak", "workload_too_large"} <= set(d.candidates)
    assert d.missing


def test_contract_violations_of_the_pod_are_cited_whatever_the_verdict() -> None:
    from triage.evidence import build_evidence

    bundle = {
        "kind": "cuda_oom",
        "host": {"shm_total_bytes": 64 * MiB, "cpu_count": 8},
        "k8s": {"shm_medium": None, "gpu_count": 8, "cpu_request": "8", "memory_limit_bytes": None},
    }
    ev = build_evidence(None, None, bundle)
    assert ev.contract_violations
    d = diagnose(ev)
    contract = [e for e in d.evidence if e.rule == "contract"]
    assert contract and all(e.value and e.value["contract_version"] for e in contract)
    assert any("/dev/shm" in e.fact for e in contract)


def test_fragmentation_with_a_capped_process_and_a_free_device_is_the_cap() -> None:
    ev = _frag(largest=1 * MiB, ru=6 * GiB)
    ev.fraction_cap_bytes = 40 * GiB
    ev.device_free_bytes = 30 * GiB
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score <= CANDIDATE
    assert any("a cap refused it" in s for s in f.facts)


def test_tiny_holes_are_never_a_confident_fragmentation() -> None:
    ev = _frag(largest=512 * KiB, ru=3 * MiB, req=2 * MiB)
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score < 0.6


@pytest.mark.parametrize(("step", "confident"), [(2, True), (1, False)])
def test_fragmentation_in_the_first_steps_is_not_confident(step: int, confident: bool) -> None:
    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)
    ev.step = step
    f = fragmentation.evaluate(ev)
    assert f is not None and (f.score >= 0.6) is confident


# ---------------------------------------------------------------- batch size changes between steps
def _samples(values: list[int], batches: list[int]) -> list[dict[str, Any]]:
    return [
        {"step": i, "allocated_bytes": v, "peak_allocated_bytes": v, "batch_size": b}
        for i, (v, b) in enumerate(zip(values, batches, strict=True))
    ]


def test_growth_at_a_batch_size_change_is_not_counted_as_growth() -> None:
    from triage.evidence import _trend

    # a cache filled (steps 0-4), stayed flat, then the batch grew 5 -> 14: the jump is the bigger batch
    values = [10 * GiB + i * GiB for i in range(5)] + [14 * GiB] * 4 + [17 * GiB]
    t = _trend(_samples(values, [5] * 9 + [14]))
    assert t is not None
    assert t.late_growth_bytes == 0 and t.plateaued
    assert (t.start_bytes, t.end_bytes) == (10 * GiB, 17 * GiB)  # the real values are still reported
    # the same jump at an unchanged batch size is growth
    t = _trend(_samples(values, [5] * 10))
    assert t is not None
    assert t.late_growth_bytes == 3 * GiB and not t.plateaued


@pytest.mark.parametrize(
    ("batches", "failing", "grew_from"),
    [
        ([8] * 10, 16, 8),  # the failing step is the first at the new size
        ([8] * 8 + [16] * 2, 16, 8),  # grew two completed steps before the OOM: still the cause
        ([8] * 7 + [16] * 3, 16, 0),  # three steps ran at the new size: not a recent change
        ([16] * 10, 16, 0),
        ([16] * 8 + [8] * 2, 8, 0),  # it shrank
    ],
)
def test_batch_grew_from_looks_at_the_last_steps(batches: list[int], failing: int, grew_from: int) -> None:
    from triage.evidence import _step_samples

    ev = cuda(batch_size=failing, steps=_step_samples(_samples([GiB] * len(batches), batches)))
    assert ev.batch_grew_from == grew_from


@pytest.mark.parametrize(("step", "decides"), [(12, False), (1, True)])
def test_too_large_is_not_proved_when_the_request_fitted_packed_after_the_first_steps(
    step: int, decides: bool
) -> None:
    """60 GiB held, 12 GiB asked: 7 GiB of holes plus the device's 11 GiB free would have held it. Past the
    first steps that is the layout's doing as much as the step's; in the first steps holes have not had
    time to build up, and the step is the likelier story."""
    from triage.snapshot.model import Segment, Snapshot

    seg = Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])
    ev = cuda(
        snapshot=Snapshot([seg], [], {}, [], era="v2"),
        step=step,
        trend=trend([31 * GiB] * 8),
        total_bytes=80 * GiB,
        reserved_bytes=67 * GiB,
        allocated_bytes=60 * GiB,
        device_free_bytes=11 * GiB,
        request_bytes=12 * GiB,
        largest_free_block_bytes=int(1.5 * GiB),
        free_in_pool_bytes=7 * GiB,
    )
    f = workload_too_large.evaluate(ev)
    assert f is not None
    assert (f.score >= LIKELY) is decides
    assert any("would, packed, have held" in s for s in f.facts) is not decides


@pytest.mark.parametrize(("declared", "quota"), [(int(19.5 * GiB), False), (80 * GiB, True)])
def test_a_mig_slice_the_job_was_declared_for_is_not_a_quota(declared: int, quota: bool) -> None:
    f = gpu_quota.evaluate(
        cuda(
            total_bytes=int(19.5 * GiB),
            mig_profile="2g.20gb",
            declared_total_bytes=declared,
            reserved_bytes=19 * GiB,
            allocated_bytes=19 * GiB,
        )
    )
    assert f is not None
    assert (f.score >= LIKELY) is quota


@pytest.mark.parametrize(("stranded", "decides"), [(12 * GiB, False), (int(0.9 * GiB), True)])
def test_too_large_is_not_proved_when_the_memory_was_stranded_on_another_stream(
    stranded: int, decides: bool
) -> None:
    """11 GiB held, 0.5 GiB asked, the batch doubled: the process held 23 GiB, of which ``stranded`` sat free
    in another stream's segment that a live block keeps from being released. 12 GiB of it is the story;
    0.9 GiB (under 5% of what the job may hold) is not, and the doubled batch is."""
    from triage.evidence import _step_samples
    from triage.snapshot.model import Segment, Snapshot

    seg = Segment(0, 0, 1, 0, "large", (0, 0), False, [], [])
    samples = [
        {"step": i, "allocated_bytes": 4 * GiB, "peak_allocated_bytes": 8 * GiB, "batch_size": 8}
        for i in range(10)
    ]
    ev = cuda(
        snapshot=Snapshot([seg], [], {}, [], era="v2"),
        step=10,
        batch_size=16,
        steps=_step_samples([*samples, {"step": 10, "allocated_bytes": 4 * GiB, "batch_size": 16}]),
        trend=trend([4 * GiB] * 10),
        total_bytes=24 * GiB,
        reserved_bytes=11 * GiB + stranded,
        allocated_bytes=11 * GiB,
        device_free_bytes=12 * GiB - stranded,
        request_bytes=GiB // 2,
        largest_free_block_bytes=2 * MiB,  # in the request's own pool and stream
        free_in_pool_bytes=2 * MiB,
    )
    f = workload_too_large.evaluate(ev)
    assert f is not None
    assert (f.score >= LIKELY) is decides
    assert any("other streams' or pools' segments" in s for s in f.facts) is not decides


@pytest.mark.parametrize(
    ("batch_before", "asked", "decides"), [(32, GiB, False), (8, GiB, True), (32, 3 * GiB, True)]
)
def test_a_step_far_above_every_earlier_one_at_the_same_batch_is_not_proved_too_large(
    batch_before: int, asked: int, decides: bool
) -> None:
    """Earlier steps peaked at 20 GiB; this one already wants 35 GiB of the 35.1 GiB it could hold. At the
    same batch size something in the step differs (a longer input, an evaluation pass with gradients on,
    tensors kept inside it); after the batch grew from 8 to 32, the batch is the answer; and a step that
    wants more than the job could hold at all (a 3 GiB request) has outgrown the device whatever differs."""
    from triage.evidence import _step_samples

    samples = [
        {"step": i, "allocated_bytes": 6 * GiB, "peak_allocated_bytes": 20 * GiB, "batch_size": batch_before}
        for i in range(6)
    ]
    ev = cuda(
        step=6,
        batch_size=32,
        steps=_step_samples(samples),
        trend=trend([6 * GiB] * 6),
        total_bytes=40 * GiB,
        reserved_bytes=35 * GiB,
        allocated_bytes=34 * GiB,
        device_free_bytes=100 * MiB,
        request_bytes=asked,
    )
    f = workload_too_large.evaluate(ev)
    assert f is not None
    assert (f.score >= LIKELY) is decides
    assert any("with the same batch size" in s for s in f.facts) is not decides


TWO_LINES = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 6.75 MiB is free. Process 2201 has {a} memory in use. Process 2210 has {b} memory in "
    "use. Of the allocated memory 36.84 GiB is allocated by PyTorch, and 3"
)


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        (
            "41.22 GiB",
            "37.91 GiB",
            "other_process",
        ),  # either line may be the job: the other holds >= 37.9 GiB
        ("37.50 GiB", "12.00 GiB", "inconclusive"),  # only the first can be the job; 12 GiB is 15% of the GPU
    ],
)
def test_two_process_lines_and_no_way_to_tell_which_is_the_job(a: str, b: str, verdict: str) -> None:
    """A message cut before its reservation figure, in a container (pids, no "this process"): the job's
    own line holds at least what PyTorch allocated, so the others hold at least all but the largest such
    line. A quarter of the GPU or more, whichever line is the job, is a neighbour that mattered."""
    from triage.pipeline import diagnose_text

    d, _ = diagnose_text(TWO_LINES.format(a=a, b=b))
    assert d.verdict == verdict, d.headline
    assert "other_process" in d.candidates


def test_a_message_with_more_free_in_the_reservation_than_the_request_does_not_prove_too_large() -> None:
    """Flat steps (DeepSpeed's prints), then a 3.1 GiB request fails with 38.6 GiB reserved but unallocated
    and the step at 42.9 GiB of the 78.6 it could hold: the memory was there, not in one piece. Whether the
    rest of the step fits is not in the text."""
    from triage.pipeline import diagnose_text

    prints = "".join(
        f"[Rank 0] step={k * 200}\nMA 30.{k % 5} GB         Max_MA 38.50 GB         CA 60.00 GB         Max_CA 60 GB\n"
        for k in range(1, 12)
    )
    oom = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.12 GiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 218.00 MiB is free. Including non-PyTorch memory, this process has 78.90 GiB memory "
        "in use. Of the allocated memory 39.80 GiB is allocated by PyTorch, and 38.60 GiB is reserved by PyTorch "
        "but unallocated.\n"
    )
    d, ev = diagnose_text(prints + oom)
    assert ev.trend is not None and ev.trend.growth_bytes < (1 << 30)
    assert d.verdict == "inconclusive", d.headline
    assert {"workload_too_large", "fragmentation"} <= set(d.candidates)


BEYOND = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of "
    "{total} of which 3.69 GiB is free. Including non-PyTorch memory, this process has 6.68 GiB memory in "
    "use. Of the allocated memory 6.10 GiB is allocated by PyTorch, and 396.58 MiB is reserved by PyTorch "
    "but unallocated.\n"
)


@pytest.mark.parametrize(
    ("req", "total", "verdict"),
    [
        ("30.29 GiB", "10.74 GiB", "workload_too_large"),  # one tensor three times the device
        ("10.80 GiB", "10.74 GiB", "workload_too_large"),  # just beyond it
        ("6.20 GiB", "10.74 GiB", "inconclusive"),  # fits the device: what else was held decides
        ("30.29 GiB", "19.50 GiB", "inconclusive"),  # a MIG 2g.20gb-sized device: was a bigger one promised?
    ],
)
def test_a_request_larger_than_the_whole_device_is_the_steps_own(req: str, total: str, verdict: str) -> None:
    """No leak, neighbour or cached hole can make room for one allocation larger than the whole device:
    the step asked for a tensor that cannot exist there. A device the size of a MIG slice leaves open
    whether the job was promised a whole GPU."""
    from triage.pipeline import diagnose_text

    d, ev = diagnose_text(BEYOND.format(req=req, total=total))
    assert d.verdict == verdict, d.headline
    if verdict == "workload_too_large":
        assert ev.request_beyond_device
        assert "tensor_leak" not in d.candidates and d.confidence >= 0.6
        assert any("larger than the whole device" in e.fact for e in d.evidence)
    else:
        assert "workload_too_large" in d.candidates


OLD_FORMAT = (
    "RuntimeError: CUDA out of memory. Tried to allocate 216.00 MiB (GPU 0; 7.92 GiB total capacity; "
    "{allocated} already allocated; {free} free; {reserved} reserved in total by PyTorch)\n"
)


@pytest.mark.parametrize(
    ("allocated", "reserved", "verdict"),
    [("69.17 MiB", "86.00 MiB", "other_process"), ("3.90 GiB", "4.00 GiB", "inconclusive")],
)
def test_most_of_the_device_held_outside_the_job_with_no_process_lines(
    allocated: str, reserved: str, verdict: str
) -> None:
    """A torch 1.x message has no process lines. With 86 MiB reserved by the job and 24 MiB free, 7.8 GiB
    of the 7.9 GiB device is held outside its allocator: no context or library workspace of the job is that
    large. With 4 GiB reserved, the 3.9 GiB held elsewhere (under half) could still be the job's own (NCCL buffers, a
    second framework in the process)."""
    from triage.pipeline import diagnose_text

    d, _ = diagnose_text(OLD_FORMAT.format(allocated=allocated, reserved=reserved, free="24.56 MiB"))
    assert d.verdict == verdict, d.headline
    assert "other_process" in d.candidates
