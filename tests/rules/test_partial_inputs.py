"""What the engine may conclude from partial inputs: a snapshot alone, a log with several failures in it,
a trace without stacks, a step history that grows only now and then.

The cases are built field by field or from `triage simulate` scenarios with parts of the bundle removed;
each asserts the verdict and the sentence that explains it, on both sides of the condition.
"""

from __future__ import annotations

from typing import Any

import pytest

from rules import gpu_quota, host_memory_limit, tensor_leak, workload_too_large
from rules.base import CANDIDATE
from tests.rules.rawsnap import one_block_segment
from triage.engine import CONFIDENT as CONFIDENT_MIN
from triage.evidence import Evidence, _step_samples, _trend, trace_cycles
from triage.pipeline import diagnose_snapshot, diagnose_text
from triage.simulate.scenarios import run_scenario
from triage.snapshot.loader import normalise
from triage.units import GiB, MiB


def snapshot_only(name: str, seed: int, *, message: bool = False) -> Any:
    r = run_scenario(name, seed)
    snap = normalise(r.snapshot, source="simulated", shared_frames=False)
    d, ev = diagnose_snapshot(snap, message=r.message if message else None)
    return r, d, ev


# ---------------------------------------------------------------- a snapshot alone does not show the device
def test_a_snapshot_alone_cannot_rule_out_a_neighbour() -> None:
    r, d, ev = snapshot_only("other_process", 1)
    assert r.truth["verdict"] == "other_process"
    assert ev.device_unseen
    assert d.verdict == "inconclusive"
    assert {"workload_too_large", "other_process", "gpu_quota"} <= set(d.candidates)
    assert any("OOM message" in m for m in d.missing)
    # the OOM message names the neighbour: decided
    _, d, ev = snapshot_only("other_process", 1, message=True)
    assert not ev.device_unseen
    assert d.verdict == "other_process"


def test_a_snapshot_alone_still_decides_what_the_job_itself_shows() -> None:
    """A leak is in the job's own blocks; the device does not matter."""
    _, d, ev = snapshot_only("tensor_leak", 0)
    assert ev.device_unseen
    assert d.verdict == "tensor_leak"


def cuda(**kw: Any) -> Evidence:
    base: dict[str, Any] = {
        "kind": "cuda_oom",
        "device_free_bytes": 20 * MiB,
        "reserved_bytes": int(4.6 * GiB),
        "allocated_bytes": int(4.5 * GiB),
        "request_bytes": 210 * MiB,
    }
    base.update(kw)
    return Evidence(**base)


@pytest.mark.parametrize(
    ("total", "slice_name"),
    [
        (int(4.75 * GiB), "1g.5gb"),
        (int(19.5 * GiB), "1g.20gb / 2g.20gb"),
        (int(22.17 * GiB), None),  # an L4: a whole GPU
        (int(79.15 * GiB), None),
    ],
)
def test_a_device_the_size_of_a_mig_slice(total: int, slice_name: str | None) -> None:
    # an OOM in the first step: nothing had time to leak
    ev = cuda(total_bytes=total, reserved_bytes=total - 300 * MiB, allocated_bytes=total - 320 * MiB, step=0)
    assert ev.slice_sized == slice_name
    q = gpu_quota.evaluate(ev)
    w = workload_too_large.evaluate(ev)
    assert w is not None
    if slice_name:
        assert q is not None and q.score > CANDIDATE
        assert any("MIG slice" in s for s in q.facts)
        assert w.score < CONFIDENT_MIN
    else:
        assert q is None
        assert w.score >= CONFIDENT_MIN
    # a name that says what the device is settles it either way
    ev.device_name = "NVIDIA A100-SXM4-40GB"
    assert ev.slice_sized is None


# ---------------------------------------------------------------- a trace without stacks still has steps
def test_trace_cycles_are_the_biggest_recurring_swing() -> None:
    levels: list[int] = list(range(0, 1000, 100))  # weights
    kept = 1000
    for _ in range(6):
        levels += [kept + 50, kept + 400, kept + 380, kept + 900, kept + 300, kept + 20]  # forward/backward
        kept += 20  # what each step keeps
        levels.append(kept)
    cycles = trace_cycles(levels)
    assert [low for low, _ in cycles] == [1020 + 20 * i for i in range(6)]
    assert all(top >= low + 800 for low, top in cycles)
    assert trace_cycles(levels[:20]) == []  # fewer than four cycles: not read as steps


def test_a_leak_without_stacks_is_read_from_the_trace_cycles() -> None:
    r, d, ev = snapshot_only("leak_no_frames", 1)
    assert r.truth["verdict"] == "tensor_leak"
    assert ev.trend_source == "trace" and ev.trend is not None and ev.trend.steps >= 4
    assert d.verdict == "tensor_leak"
    assert any("read from the allocator trace" in e.fact for e in d.evidence)


def test_trace_cycles_are_not_used_when_stacks_name_the_sites() -> None:
    _, _, ev = snapshot_only("tensor_leak", 0)
    assert ev.trend_source == "samples" and ev.trend is None


# ---------------------------------------------------------------- growth now and then
def staircase(every: int, steps: int = 175, step_bytes: int = 1280 * MiB) -> list[dict[str, Any]]:
    return [
        {"step": i, "allocated_bytes": 16 * GiB + (i // every) * step_bytes, "batch_size": 16}
        for i in range(steps)
    ]


@pytest.mark.parametrize("every", [5, 25, 50])
def test_a_leak_at_every_evaluation_is_growth(every: int) -> None:
    samples = staircase(every)
    t = _trend(samples)
    assert t is not None and t.staircase and t.never_falls
    ev = cuda(
        total_bytes=40 * GiB,
        reserved_bytes=36 * GiB,
        allocated_bytes=int(32.8 * GiB),
        request_bytes=4 * GiB,
        trend=t,
        steps=_step_samples(samples),
        step=175,
        batch_size=16,
    )
    leak = tensor_leak.evaluate(ev)
    assert leak is not None and leak.score >= CONFIDENT_MIN
    assert any("never fell" in s for s in leak.facts)
    w = workload_too_large.evaluate(ev)
    assert w is not None and not any("did not grow" in s for s in w.facts)


def test_a_cache_that_filled_once_is_not_a_staircase() -> None:
    samples = [
        {"step": i, "allocated_bytes": 16 * GiB + min(i, 3) * GiB, "batch_size": 16} for i in range(40)
    ]
    t = _trend(samples)
    assert t is not None and not t.staircase and t.plateaued


# ---------------------------------------------------------------- logs with more than one failure
NEIGHBOUR_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 3.20 GiB is free. Process 7777 has 30.00 GiB memory in use. Including non-PyTorch "
    "memory, this process has 45.93 GiB memory in use. Of the allocated memory 44.80 GiB is allocated by "
    "PyTorch, and 610.00 MiB is reserved by PyTorch but unallocated."
)
ALONE_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 20.00 MiB is free. Including non-PyTorch memory, this process has 79.11 GiB memory "
    "in use. Of the allocated memory 77.40 GiB is allocated by PyTorch, and 1.19 GiB is reserved by PyTorch "
    "but unallocated."
)


def test_the_last_oom_of_a_log_is_the_fatal_one() -> None:
    """A batch-size finder caught an OOM beside a neighbour hours before; the job died alone later."""
    log = f"09:00:09 WARNING caught {NEIGHBOUR_OOM}\n09:00:10 retrying with batch 16\n" + "step ok\n" * 20
    d, ev = diagnose_text(log + f"Traceback (most recent call last):\n{ALONE_OOM}\n")
    assert ev.message is not None and "Process 7777" not in ev.message.text
    assert d.verdict == "inconclusive" and "other_process" not in d.candidates
    d, _ = diagnose_text(f"{ALONE_OOM}\n" + "step ok\n" * 5 + f"{NEIGHBOUR_OOM}\n")
    assert d.verdict == "other_process"


def test_torchrun_tearing_down_the_other_ranks_is_not_a_host_kill() -> None:
    log = (
        f"[rank2]: {ALONE_OOM}\n"
        "W1105 14:03:25.118000 31 api.py:897] Sending process 58 closing signal SIGTERM\n"
        "W1105 14:03:55.120000 31 api.py:912] Unable to shutdown process 58 via Signals.SIGTERM, "
        "forcefully exiting via Signals.SIGKILL\n"
        "  exitcode  : -9 (pid: 58)\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 58\n"
    )
    d, ev = diagnose_text(log)
    assert any(m.kind == "host_oom" for m in ev.messages) and not ev.host_kills
    assert d.verdict == "inconclusive" and "host_memory_limit" not in d.candidates


def test_a_kill_before_the_cuda_oom_killed_something_else() -> None:
    before = "/bin/bash: line 1:  4120 Killed                  timeout 30 nvidia-smi\n"
    d, ev = diagnose_text(before + "step ok\n" * 10 + ALONE_OOM + "\n")
    assert not ev.host_kills and "host_memory_limit" not in d.candidates
    # the kernel's kill after the traceback did end the job
    after = "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1000kB\n"
    d, ev = diagnose_text(ALONE_OOM + "\n" + after)
    assert ev.host_kills and "host_memory_limit" in d.candidates


# ---------------------------------------------------------------- many survivors per step from one site
@pytest.mark.parametrize(
    ("per_step", "steps", "is_leak"),
    [
        (4, 5, True),  # a few per step over five steps
        (96, 4, False),  # 96 per step but only four steps: not enough to call it, so many per step
        (96, 6, True),  # 96 per step over six steps: nothing but a leak survives that many steps
        (96, 5, False),
    ],
)
def test_a_site_that_keeps_many_blocks_every_step(per_step: int, steps: int, is_leak: bool) -> None:
    from rules.tensor_leak import _leaky_site
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    n = per_step * steps
    st = SiteStats(Site("/w/monitor.py", 27, "_hook"), bytes=n * MiB, count=n, traced=n, allocs_in_trace=n)
    ev = Evidence(kind="cuda_oom", survivors=[Survivors(st, cycles=steps - 1, gaps=n - 1, freed_at_site=0)])
    assert (_leaky_site(ev) is not None) is is_leak


# ---------------------------------------------------------------- a MIG slice named only by the log
NVML_ASSERT = (
    'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":1123, '
    "please report a bug to PyTorch.\n"
)


def test_a_mig_slice_named_by_the_log_is_a_lead_not_a_verdict() -> None:
    log = "device: NVIDIA A100-SXM4-80GB MIG 1g.10gb\n" + "step ok\n" * 3 + NVML_ASSERT
    d, ev = diagnose_text(log)
    assert ev.mig_profile == "1g.10gb"
    assert d.verdict == "inconclusive" and d.candidates[0] == "gpu_quota"
    assert any("MIG slice (1g.10gb)" in e.fact for e in d.evidence)
    # nvidia-smi -L of a node with several slices does not say which one the job had
    log = "  MIG 1g.10gb Device 0: (UUID: MIG-a)\n  MIG 3g.40gb Device 1: (UUID: MIG-b)\n" + NVML_ASSERT
    _, ev = diagnose_text(log)
    assert ev.log_mig_profile is None and ev.mig_profile is None


# ---------------------------------------------------------------- holes matter only at a known limit
def test_fragmentation_without_the_device_is_a_candidate() -> None:
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag

    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score >= CONFIDENT_MIN
    ev.total_bytes = None  # a snapshot alone: neither the device's size nor its processes
    assert ev.device_unseen
    f = fragmentation.evaluate(ev)
    assert f is not None and CANDIDATE < f.score < CONFIDENT_MIN
    assert any("Which limit the job hit" in s for s in f.facts)


def test_fragmentation_needs_the_steps_to_rule_out_growth() -> None:
    """Holes are also what a leak leaves: without step samples and with a trace of a step or two, the
    layout is a lead; with the samples flat, it is the verdict."""
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag

    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)
    f = fragmentation.evaluate(ev)
    assert f is not None and f.score >= CONFIDENT_MIN
    ev.trend = None
    assert ev.trace_steps == 0
    f = fragmentation.evaluate(ev)
    assert f is not None and CANDIDATE < f.score < CONFIDENT_MIN
    assert any("a leak leaves the same holes" in s for s in f.facts)


@pytest.mark.parametrize(
    ("steps", "frames", "kept_across", "capped"),
    [(4, True, False, False), (3, True, False, True), (4, False, False, True), (4, True, True, True)],
)
def test_a_short_trace_with_stacks_rules_out_growth_when_nothing_outlived_a_step(
    steps: int, frames: bool, kept_across: bool, capped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay without step samples whose trace covers a few steps (TRACE_MIN_CYCLES), with stacks: if no
    site's surviving blocks were made in different steps, nothing leaked while the trace watched, and the
    holes decide. Fewer steps, no stacks, or a site that kept blocks across steps: a lead only."""
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    monkeypatch.setattr(Evidence, "trace_steps", property(lambda self: steps))
    monkeypatch.setattr(Evidence, "has_frames", property(lambda self: frames))
    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)
    ev.trend = None
    st = SiteStats(Site("/w/train.py", 80, "step"), bytes=GiB, count=4, traced=4, allocs_in_trace=4)
    ev.survivors = [Survivors(st, cycles=3 if kept_across else 0, gaps=3, freed_at_site=0)]
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) == capped
    assert any("a leak leaves the same holes" in s for s in f.facts) == capped


# ---------------------------------------------------------------- a cache that has just begun evicting
@pytest.mark.parametrize(
    ("freed", "after", "with_steps", "capped"),
    [(3, 0, False, True), (3, 1, False, False), (1, 0, False, False), (3, 0, True, False)],
)
def test_a_site_whose_oldest_blocks_were_freed(
    freed: int, after: int, with_steps: bool, capped: bool
) -> None:
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    st = SiteStats(
        Site("/w/train.py", 166, "step"), bytes=8 * GiB, count=12, traced=12, allocs_in_trace=12 + freed
    )
    ev = cuda(
        total_bytes=80 * GiB,
        request_bytes=29 * GiB,
        survivors=[Survivors(st, cycles=11, gaps=11, freed_at_site=freed, freed_after_first=after)],
    )
    if with_steps:  # the collector's samples: growing at every step
        ev.trend = _trend([{"step": i, "allocated_bytes": (40 + i) * GiB} for i in range(12)])
    f = tensor_leak.evaluate(ev)
    assert f is not None and f.leak_site is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("begun evicting" in s for s in f.facts) is capped


def test_a_cache_filling_then_a_bigger_batch_is_not_growth() -> None:
    """A cache of 4 fills in the first steps, stays flat, then the batch grows and the cache turns over at
    the new size: rises early and once at the end, none in the middle third."""
    values = [4, 8, 11, 15, *[15] * 9, 26, 36]
    batches = [134] * 13 + [522] * 2
    samples = [
        {"step": i, "allocated_bytes": v * GiB, "batch_size": b}
        for i, (v, b) in enumerate(zip(values, batches, strict=True))
    ]
    t = _trend(samples)
    assert t is not None and t.falling_fraction == 0 and t.rising_fraction >= 0.25
    assert not t.rises_throughout and not t.never_falls and not t.staircase
    # a tensor kept every other step rises in half of the steps, in every third of the run
    t = _trend([{"step": i, "allocated_bytes": (10 + i // 2) * GiB} for i in range(15)])
    assert t is not None and t.rises_throughout and t.never_falls


# ---------------------------------------------------------------- memory outside the allocator, nobody named
@pytest.mark.parametrize(("outside", "capped"), [(71 * GiB, True), (2 * GiB, False)])
def test_memory_outside_the_allocator_that_nobody_owns(outside: int, capped: bool) -> None:
    """torch 2.0's message has no process lines: a neighbour shows only as device memory nobody accounts for."""
    total = 80 * GiB
    reserved = total - outside - 100 * MiB
    ev = cuda(
        total_bytes=total,
        reserved_bytes=reserved,
        allocated_bytes=reserved - 50 * MiB,
        device_free_bytes=100 * MiB,
        request_bytes=GiB,
        step=0,
        non_pytorch_bytes=outside,  # total - free - reserved, as build_evidence derives it
    )
    w = workload_too_large.evaluate(ev)
    assert w is not None
    assert (w.score < CONFIDENT_MIN) is capped
    assert any("nothing says whose" in s for s in w.facts) is capped


# ---------------------------------------------------------------- a step unlike the earlier ones
@pytest.mark.parametrize(("peak_gib", "capped"), [(40, True), (69, False)])
def test_holes_convict_only_for_a_demand_met_before(peak_gib: int, capped: bool) -> None:
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag

    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)  # needs 64.5 GiB at the OOM
    ev.steps = _step_samples(
        [{"step": i, "allocated_bytes": 30 * GiB, "peak_allocated_bytes": peak_gib * GiB} for i in range(8)]
    )
    assert ev.earlier_peak_bytes == peak_gib * GiB
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("far more than" in s for s in f.facts) is capped


# ---------------------------------------------------------------- a small leak that did not cause this OOM
@pytest.mark.parametrize(
    ("kept", "with_steps", "capped"),
    [
        (270 * MiB, False, True),  # 1.3% of the job, could not have served 1.2 GiB: not what failed
        (2 * GiB, False, False),  # freed, it would have served the request: decisive
        (270 * MiB, True, False),  # the steps show the growth: the leak is the story
    ],
)
def test_a_small_leak_beside_an_oom_it_did_not_cause(kept: int, with_steps: bool, capped: bool) -> None:
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    st = SiteStats(Site("/w/train.py", 64, "train_step"), bytes=kept, count=7, traced=7, allocs_in_trace=7)
    ev = cuda(
        total_bytes=24 * GiB,
        reserved_bytes=22 * GiB,
        allocated_bytes=20 * GiB,
        device_free_bytes=0,
        request_bytes=int(1.2 * GiB),
        survivors=[Survivors(st, cycles=6, gaps=6, freed_at_site=0)],
    )
    if with_steps:
        ev.trend = _trend([{"step": i, "allocated_bytes": (10 * GiB) + i * 40 * MiB} for i in range(8)])
    f = tensor_leak.evaluate(ev)
    assert f is not None and f.leak_site is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("not what failed here" in s for s in f.facts) is capped


# ---------------------------------------------------------------- a leak made at the top of the loop
def _loop_trace(steps: int, leak_first: bool, keep_steps: int | None = None) -> dict[str, Any]:
    """A raw snapshot whose trace is ``steps`` training steps; each keeps one 8 MiB tensor from user code,
    made at the top of the loop (the step's low point) or in the middle of the forward (only the first
    ``keep_steps`` steps do, when given: a cache that filled)."""
    user = [{"filename": "/w/train.py", "line": 40, "name": "train_step"}]
    act = [{"filename": "/w/model.py", "line": 12, "name": "forward"}]
    trace: list[dict[str, Any]] = []
    addr = 1 << 30
    kept: list[int] = []

    def alloc(size: int, frames: list[dict[str, Any]]) -> int:
        nonlocal addr
        addr += 1 << 28
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames})
        return addr

    for k in range(steps):
        keep = keep_steps is None or k < keep_steps
        if leak_first and keep:
            kept.append(alloc(8 << 20, user))
        acts = [alloc(256 << 20, act) for _ in range(4)]
        if not leak_first and keep:
            kept.append(alloc(8 << 20, user))
        for a in reversed(acts):
            trace.append(
                {"action": "free_requested", "addr": a, "size": 256 << 20, "stream": 0, "frames": act}
            )
            trace.append(
                {"action": "free_completed", "addr": a, "size": 256 << 20, "stream": 0, "frames": act}
            )
    trace.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "device_free": 0, "frames": act})
    segments = [one_block_segment(0, a, 8 << 20, user) for a in kept]
    return {"segments": segments, "device_traces": [trace]}


@pytest.mark.parametrize("leak_first", [True, False])
def test_a_leak_is_found_wherever_in_the_step_it_is_made(leak_first: bool) -> None:
    snap = normalise(_loop_trace(8, leak_first), source="test", shared_frames=False)
    d, ev = diagnose_snapshot(snap)
    site = next(s for s in ev.survivors if s.site.line == 40)
    assert site.cycles == 7, site
    assert d.leak_site is not None and d.leak_site["line"] == 40


def _sites_after_growth(kept_traced: int) -> Evidence:
    """Live memory grew 1 GiB a step over 40 sampled steps (40 GiB); the trace reaches back two steps.
    Sites alive at the OOM: 42 blocks of 1 GiB from train.py:88 (``kept_traced`` of them in the trace),
    12 activation blocks of 3.5 GiB from model.py:31 (all in the trace: this step's), weights."""
    from types import SimpleNamespace

    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    samples = [
        {"step": s, "allocated_bytes": 10 * GiB + s * GiB, "peak_allocated_bytes": 60 * GiB + s * GiB}
        for s in range(41)
    ]
    sites = [
        SiteStats(Site("/w/train.py", 88, "train_step"), bytes=42 * GiB, count=42, traced=kept_traced),
        SiteStats(Site("/w/model.py", 31, "forward"), bytes=42 * GiB, count=12, traced=12),
        SiteStats(Site("/w/train.py", 30, "main"), bytes=10 * GiB, count=200, traced=0),
    ]
    ev = cuda(trend=_trend(samples), steps=_step_samples(samples), step=41, sites=sites)
    ev.timelines = [SimpleNamespace(entries=5000, device=0)]  # type: ignore[list-item]
    return ev


@pytest.mark.parametrize(("kept_traced", "named"), [(2, True), (30, False)])
def test_a_leak_site_older_than_the_trace_is_named_by_the_growth(kept_traced: int, named: bool) -> None:
    """The steps prove a leak; the trace is too short to show any site crossing steps. The one user site
    whose live bytes match the growth (0.8-1.5x) with most blocks older than the trace is the lead; the
    current step's activations match the bytes too but were all made in the trace. A kept site mostly
    in the trace is the survivors' to judge (cycles between its blocks), not this lead's: none is named."""
    from rules.base import Finding

    ev = _sites_after_growth(kept_traced)
    f = Finding(rule="tensor_leak", verdict="tensor_leak", score=0.9)
    tensor_leak._lead_by_growth(ev, f)
    if named:
        assert f.leak_site == {"filename": "/w/train.py", "line": 88, "name": "train_step"}
        assert any("as much as live memory grew over the 41 sampled steps" in s for s in f.facts)
    else:
        assert f.leak_site is None and not f.facts


TIMEOUT_LOG = """+ timeout --verbose -s KILL 4h python train.py
2026-03-02 13:59:58 | INFO | step 9110 | loss 1.2190
{killer}+ rc=137
+ echo 'training exited with code 137'
training exited with code 137
"""


@pytest.mark.parametrize(
    ("killer", "verdict"),
    [("timeout: sending signal KILL to command 'python'\n", "inconclusive"), ("", "host_memory_limit")],
)
def test_a_sigkill_from_a_time_limit_is_not_a_host_oom(killer: str, verdict: str) -> None:
    """Exit code 137 is any SIGKILL: GNU timeout's KILL exits 137 too. The line naming the sender leaves
    the host limit a candidate; without it, 137 alone still points at the OOM killer."""
    d, _ = diagnose_text(TIMEOUT_LOG.format(killer=killer))
    assert d.verdict == verdict
    assert "host_memory_limit" in [d.verdict, *d.candidates]


K8S_DESCRIBE = """    Last State:     Terminated
      Reason:       {reason}
      Exit Code:    137
Events:
  Warning  Unhealthy  12m (x3 over 12m)  kubelet  Liveness probe failed: Get "http://10.42.3.88:8080/healthz": context deadline exceeded
"""


@pytest.mark.parametrize(
    ("reason", "verdict"), [("Error", "inconclusive"), ("OOMKilled", "host_memory_limit")]
)
def test_kubernetes_says_oomkilled_when_memory_was_the_reason(reason: str, verdict: str) -> None:
    d, _ = diagnose_text(K8S_DESCRIBE.format(reason=reason))
    assert d.verdict == verdict, d.headline


@pytest.mark.parametrize(
    ("kills", "usage_gib", "candidate_only"),
    [(0, 41, True), (0, 250, False), (None, 41, False), (1, 41, False)],
)
def test_a_cgroup_that_never_killed_and_was_far_from_its_limit(
    kills: int | None, usage_gib: int, candidate_only: bool
) -> None:
    """A SIGKILL (exit 137) with the cgroup's oom_kill counter at 0 and usage far below the limit: the
    kernel did not kill for memory. Near the limit, with the counter unknown, or with a kill counted, the
    exit code keeps its weight."""
    ev = Evidence(
        kind="crash",
        exit_code=137,
        cgroup_limit_bytes=256 * GiB,
        cgroup_usage_bytes=usage_gib * GiB,
        oom_kill_count=kills,
    )
    f = host_memory_limit.evaluate(ev)
    assert f is not None
    assert (f.score <= CANDIDATE) is candidate_only


@pytest.mark.parametrize(("keep_steps", "stopped"), [(6, True), (None, False), (14, False)])
def test_a_site_that_filled_and_stopped_is_not_a_leak(keep_steps: int | None, stopped: bool) -> None:
    """16 steps in the trace. Kept in the first 6 steps only, then 10 steps without a new one: filled
    and stopped (a cache per shape, lazily created optimizer state), the leak is not the verdict. Kept in
    every step, or until two steps before the OOM: a leak."""
    snap = normalise(_loop_trace(16, False, keep_steps), source="test", shared_frames=False)
    d, ev = diagnose_snapshot(snap)
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert any("more steps without a new one" in s for s in f.facts) is stopped
    assert (f.score <= 0.4) is stopped
    assert (d.verdict == "tensor_leak") is not stopped


@pytest.mark.parametrize(("free_gib", "theirs_gib"), [(1, 19), (19.5, 0)])
def test_a_neighbour_whose_usage_nvml_could_not_report(free_gib: float, theirs_gib: int) -> None:
    """NVML reports N/A (pynvml: None) for some processes' usage. The device memory that neither the
    job's reservation, its own context nor any listed process accounts for is the unreported
    neighbour's; when nothing is left over, it holds nothing that matters."""
    from triage.evidence import build_evidence

    total, reserved = 80 * GiB, 59 * GiB
    bundle = {
        "kind": "cuda_oom",
        "workload": {"pid": 57, "pids": [57]},
        "device": {
            "total_bytes": total,
            "free_bytes": int(free_gib * GiB),
            "processes": [
                {"pid": 57, "used_bytes": reserved + 512 * MiB},
                {"pid": 90210, "used_bytes": None},
            ],
        },
        "allocator": {"memory_stats": {"reserved_bytes.all.current": reserved}},
    }
    ev = build_evidence(None, None, bundle)
    assert ev.reserved_bytes == reserved
    assert abs(ev.other_process_bytes - theirs_gib * GiB) <= 512 * MiB
    assert any("could not report" in n for n in ev.notes) is (theirs_gib > 0)


CAUGHT_THEN_SHM = """2026-03-02 09:00:10 | WARNING | eval: caught torch.OutOfMemoryError on batch 17, skipping: CUDA out of memory. Tried to allocate 5.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 4.19 GiB is free. Including non-PyTorch memory, this process has 74.90 GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 4.20 GiB is reserved by PyTorch but unallocated.
2026-03-02 09:30:44 | INFO | step 3100 | loss 1.50
ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
RuntimeError: DataLoader worker (pid 2417) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.
"""


@pytest.mark.parametrize("shm_last", [True, False])
def test_a_shm_failure_after_a_caught_cuda_oom_is_what_ended_the_job(shm_last: bool) -> None:
    """The last failure is the fatal one: a /dev/shm bus error after a CUDA OOM that an evaluation loop
    caught and skipped. The other way round (the bus error first, the CUDA OOM last), the CUDA OOM is."""
    lines = CAUGHT_THEN_SHM.splitlines(keepends=True)
    text = CAUGHT_THEN_SHM if shm_last else "".join(lines[1:] + lines[:1])
    _, ev = diagnose_text(text)
    assert ev.kind == ("shm_exhausted" if shm_last else "cuda_oom")


TWO_RANKS_ONE_GPU = """[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 520.01 MiB is free. Including non-PyTorch memory, this process has 39.29 GiB memory in use. Process 5102 has 39.30 GiB memory in use. Of the allocated memory 38.40 GiB is allocated by PyTorch, and 380.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
W0302 10:14:08.901000 140231 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {pid} closing signal SIGTERM
E0302 10:14:09.512000 140231 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 5101) of binary: /usr/bin/python3
"""


@pytest.mark.parametrize(("launched", "verdict"), [(5102, "inconclusive"), (5107, "other_process")])
def test_a_process_the_launcher_started_is_the_job_not_a_neighbour(launched: int, verdict: str) -> None:
    """torchrun names the job's workers (``Sending process N closing signal``, ``(pid: N)``): when the
    process beside the failing rank is one of them, two of the job's ranks share the GPU (the device was
    not set from LOCAL_RANK), which is not a neighbour to page the platform for."""
    d, ev = diagnose_text(TWO_RANKS_ONE_GPU.format(pid=launched))
    assert d.verdict == verdict
    assert any("one of the job's own workers" in n for n in ev.notes) is (verdict == "inconclusive")


TWO_RANKS_FAILED = """[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 422.81 MiB is free. Including non-PyTorch memory, this process has 78.68 GiB memory in use. Of the allocated memory 76.88 GiB is allocated by PyTorch, and 1.22 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 346.81 MiB is free. Including non-PyTorch memory, this process has 57.88 GiB memory in use. Process 77120 has 20.88 GiB memory in use. Of the allocated memory 56.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
Root Cause (first observed failure):
[0]:
  time      : 2026-03-04_10:12:01
  host      : node-17
  rank      : {root} (local_rank: {root})
  exitcode  : 1 (pid: 6102)
"""


@pytest.mark.parametrize(("root", "verdict"), [(2, "inconclusive"), (5, "other_process")])
def test_the_first_rank_to_fail_is_the_one_diagnosed(root: int, verdict: str) -> None:
    """Two ranks ran out. torchrun's summary names the first failure: rank 2 had the GPU to itself (a
    leak or a too-large step, the message cannot tell), so a neighbour beside rank 5 is not why the job
    died; named rank 5, the neighbour is."""
    d, ev = diagnose_text(TWO_RANKS_FAILED.format(root=root))
    assert ev.root_rank == root and ev.message is not None and ev.message.rank == root
    assert d.verdict == verdict


@pytest.mark.parametrize(
    ("peaks_gib", "capped"),
    [
        ([60] * 8, True),  # 64.5 GiB after eight steps of exactly 60: 7.5% above, beyond a range of 0
        ([50, 62, 55, 58, 61, 52, 60, 56], False),  # 4% above the top of steps that varied by 12 GiB
        ([52, 60, 48, 59, 53, 60, 50, 57], False),  # 7.5% above, within the 12 GiB the steps varied by
        ([63] * 8, False),  # 2.4% above: within what one step's rounding moves
    ],
)
def test_a_step_beyond_every_earlier_one_is_not_convicted_on_holes(
    peaks_gib: list[int], capped: bool
) -> None:
    """Holes convict only for a demand met before. A step that already wants more than the earlier
    steps ever peaked at, by more than they ever varied (a longer batch after steps of one size), and
    has not finished, may not fit at all, packed or not; variable-length steps whose failing one is
    within their usual spread are still the layout's fault."""
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag

    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)  # needs 64.5 GiB at the OOM
    ev.steps = _step_samples(
        [
            {"step": i, "allocated_bytes": 30 * GiB, "peak_allocated_bytes": p * GiB}
            for i, p in enumerate(peaks_gib)
        ]
    )
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("unlike the earlier ones" in s for s in f.facts) is capped


def _micro_steps(leak: int) -> list[dict[str, Any]]:
    """A sample at every micro-step of gradient accumulation over 4: the gradients (13 GiB) are held from
    the first micro-step until the optimizer step frees them; ``leak`` bytes kept per optimizer step."""
    out = []
    for opt in range(20):
        base = 40 * GiB + opt * leak
        for micro in range(4):
            live = base + (13 * GiB if micro < 3 else 0)
            out.append(
                {"step": 4 * opt + micro, "allocated_bytes": live, "peak_allocated_bytes": live + 8 * GiB}
            )
    return out


@pytest.mark.parametrize(("leak", "growing"), [(256 * MiB, True), (0, False)])
def test_samples_at_every_micro_step_are_read_one_per_period(leak: int, growing: bool) -> None:
    """Sampled at every micro-step, live memory saw-tooths by the gradients: half the changes up, half
    down, which hides a leak. Read one sample per period (every sample is at least the one four before
    it), the floor rises by the leak at every optimizer step; without a leak it is flat."""
    from triage.evidence import _phase_trend

    t = _phase_trend(_step_samples(_micro_steps(leak)))
    assert t is not None and t.steps == 20
    assert (t.rising_fraction == 1.0 and t.growth_bytes >= 18 * leak) is growing
    if not growing:
        assert t.growth_bytes == 0 and t.falling_fraction == 0
    assert _trend(_micro_steps(leak)).rising_fraction < 0.5  # read sample by sample: a saw-tooth


@pytest.mark.parametrize(
    ("tail", "leak"),
    [
        (12, True),  # flat for 40 steps, then +512 MiB at each of the last 12: a leak that began late
        (6, False),  # six rises: a cache of six entries filling looks the same
        (0, False),  # flat throughout
    ],
)
def test_a_leak_that_began_late_is_growth(tail: int, leak: bool) -> None:
    """A leak that starts after the first evaluation leaves the first steps flat: most changes are not
    rises and the first third never rose. Rising at every one of the last 8+ steps up to the OOM, and
    never falling, is still a leak."""
    samples = [
        {
            "step": s,
            "allocated_bytes": 40 * GiB + max(0, s - 40) * 512 * MiB,
            "peak_allocated_bytes": 70 * GiB,
        }
        for s in range(41 + tail)
    ]
    ev = cuda(trend=_trend(samples), steps=_step_samples(samples), step=41 + tail)
    f = tensor_leak.evaluate(ev)
    assert (f is not None and f.score >= CONFIDENT_MIN) is leak
    assert (f is not None and any(f"the last {tail} steps" in s for s in f.facts)) is leak


WORKER_LINES_AFTER_FATAL_OOM = """Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 300.00 MiB is free. Process 3321 has 41.02 GiB memory in use. Process 90877 has 37.66 GiB memory in use. Of the allocated memory 39.80 GiB is allocated by PyTorch, and 670.00 MiB is reserved by PyTorch but unallocated.
ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
"""


def test_worker_bus_errors_after_a_fatal_cuda_oom_do_not_replace_it() -> None:
    """A worker's own "Unexpected bus error" line printed after an uncaught CUDA OOM may be the workers
    dying with their parent: the CUDA OOM stays the failure diagnosed. Only the main process's own shm
    error after it (``DataLoader worker … killed by signal: Bus error``) ends the job instead."""
    _, ev = diagnose_text(WORKER_LINES_AFTER_FATAL_OOM)
    assert ev.kind == "cuda_oom"
    main_error = (
        "RuntimeError: DataLoader worker (pid 2417) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n"
    )
    _, ev = diagnose_text(WORKER_LINES_AFTER_FATAL_OOM + main_error)
    assert ev.kind == "shm_exhausted"


@pytest.mark.parametrize("loaded", [True, False])
def test_the_weights_loaded_before_the_first_step_are_not_the_growth(loaded: bool) -> None:
    """The weights (made loading the model, before any step) can match the growth in bytes as well as the
    leak does; loaded by ``from_pretrained`` they are not a candidate, and the leak is named. Made at an
    ordinary user line instead, two sites match and none is named."""
    from rules.base import Finding
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    ev = _sites_after_growth(2)
    load = [
        {
            "filename": "/usr/lib/python3.11/site-packages/transformers/modeling_utils.py",
            "line": 4225,
            "name": "from_pretrained",
        },
        {"filename": "/w/train.py", "line": 20, "name": "load_model"},
    ]
    weights = SiteStats(
        Site("/w/train.py", 20, "load_model"),
        bytes=40 * GiB,
        count=291,
        traced=0,
        stack=load if loaded else load[1:],
    )
    ev.sites = [*ev.sites[:2], weights]
    f = Finding(rule="tensor_leak", verdict="tensor_leak", score=0.9)
    tensor_leak._lead_by_growth(ev, f)
    if loaded:
        assert f.leak_site == {"filename": "/w/train.py", "line": 88, "name": "train_step"}
    else:
        assert f.leak_site is None


def _message_bundle(
    message: str, steps: list[dict[str, object]], device: dict[str, object]
) -> dict[str, object]:
    """A bundle whose snapshot failed to dump: the OOM message, the step samples at batch 8, the device."""
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-4000-8000-00000000f4a6",
        "occurred_at": "2026-11-30T10:00:00+00:00",
        "kind": "cuda_oom",
        "error": {"type": "torch.OutOfMemoryError", "message": message},
        "workload": {"pid": 1, "pids": [1], "step": len(steps), "batch_size": 8},
        "device": {"index": 0, **device},
        "timeline": steps,
        "snapshot": None,
    }


def _no_snapshot_bundle(*, peak_gib: float, growing: bool) -> dict[str, object]:
    """The message (8.39 GiB reserved but unallocated against a 2.50 GiB request, after the allocator
    released what it could) and nine step samples."""
    steps: list[dict[str, object]] = [
        {
            "step": s,
            "allocated_bytes": int((10.3 + (0.8 * s if growing else 0.0)) * GiB),
            "peak_allocated_bytes": int(peak_gib * GiB),
            "batch_size": 8,
        }
        for s in range(9)
    ]
    message = (
        "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
        "701.56 MiB is free. Process 1203388 has 78.46 GiB memory in use. Of the allocated memory 67.92 GiB "
        "is allocated by PyTorch, and 8.39 GiB is reserved by PyTorch but unallocated."
    )
    return _message_bundle(message, steps, {"name": "NVIDIA A100-SXM4-80GB", "total_bytes": 84_987_740_160})


@pytest.mark.parametrize(
    ("peak_gib", "growing", "verdict"),
    [(76.8, False, "fragmentation"), (69.0, False, "inconclusive"), (76.8, True, "tensor_leak")],
)
def test_without_a_snapshot_flat_steps_that_ran_higher_leave_the_split_segments(
    peak_gib: float, growing: bool, verdict: str
) -> None:
    """Without the snapshot the largest free block is unknown, but the allocator released every cached
    segment it could before it gave up: what it still held unallocated was in split segments. When the
    same steps ran higher before and live memory did not grow, those decided it; a step that needed more
    than any before, or steady growth, leave the holes a symptom."""
    from triage.pipeline import diagnose_bundle

    d, _ = diagnose_bundle(_no_snapshot_bundle(peak_gib=peak_gib, growing=growing))
    assert d.verdict == verdict, d.headline


def _longer_step_bundle(*, unallocated_gib: float) -> dict[str, object]:
    """An H100 job whose 12 flat steps peaked at 58 GiB; the failing step (a longer input) already holds
    far more and asks for 2 GiB with only a sliver of the device left."""
    free_gib = 1.70
    reserved_gib = 79.15 - 0.85 - free_gib  # the rest of the device: this process's, less its context
    steps: list[dict[str, object]] = [
        {"step": s, "allocated_bytes": 39 * GiB, "peak_allocated_bytes": 58 * GiB, "batch_size": 8}
        for s in range(12)
    ]
    message = (
        f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
        f"{free_gib:.2f} GiB is free. Including non-PyTorch memory, this process has {79.15 - free_gib:.2f} "
        f"GiB memory in use. Of the allocated memory {reserved_gib - unallocated_gib:.2f} GiB is allocated by "
        f"PyTorch, and {unallocated_gib:.2f} GiB is reserved by PyTorch but unallocated."
    )
    return _message_bundle(message, steps, {"name": "NVIDIA H100 80GB HBM3", "total_bytes": int(79.15 * GiB)})


@pytest.mark.parametrize(("unallocated_gib", "verdict"), [(2.6, "workload_too_large"), (8.0, "inconclusive")])
def test_a_longer_step_that_took_all_but_a_sliver_is_too_large(unallocated_gib: float, verdict: str) -> None:
    """Far more than every earlier step, with flat steps ruling out a leak: when it had taken all but a
    sliver of what the job could hold and packing the cache would have bought less than that, whatever the
    step ran, it is too large. With several GiB stranded, packing might have let it finish: undecided."""
    from triage.pipeline import diagnose_bundle

    d, _ = diagnose_bundle(_longer_step_bundle(unallocated_gib=unallocated_gib))
    assert d.verdict == verdict, d.headline


@pytest.mark.parametrize(
    ("peaks_gib", "capped"),
    [
        (
            [10, 55, 55, 56, 56, 56, 56, 56, 63, 63, 63, 63, 63, 63],
            True,
        ),  # a running peak's records, 2.4% above
        ([63] * 14, False),  # flat: every step's own peak, met before (rounding)
        ([50, 62, 55, 58, 61, 52, 60, 56, 57, 59, 62, 54, 58, 60], False),  # per-step peaks that vary
    ],
)
def test_a_new_record_of_a_peak_never_reset_is_not_convicted_on_holes(
    peaks_gib: list[int], capped: bool
) -> None:
    """Peaks that only ever rose, a few times, and stayed flat between: ``max_memory_allocated()`` never reset,
    which says when a step set a record, not what each step needed. A moment above the last record is a step
    longer than any before; with under 15% of room left for the rest of it, the holes do not decide it."""
    from rules import fragmentation
    from tests.rules.test_thresholds import _frag

    ev = _frag(largest=512 * MiB - 1, ru=6 * GiB)  # needs 64.5 GiB at the OOM, may hold 72 GiB
    ev.steps = _step_samples(
        [
            {"step": i, "allocated_bytes": 30 * GiB, "peak_allocated_bytes": p * GiB}
            for i, p in enumerate(peaks_gib)
        ]
    )
    assert ev.usable_bytes is not None and ev.usable_bytes < 1.15 * 64.5 * GiB
    f = fragmentation.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) is capped


@pytest.mark.parametrize(("request_gib", "capped"), [(28.0, True), (1.2, False)])
def test_a_small_steady_leak_beside_one_huge_request_is_not_what_failed(
    request_gib: float, capped: bool
) -> None:
    """Live memory rose by 192 KiB at every one of 1355 steps (pooled vectors kept on the GPU: a real leak),
    then one request of 28 GiB, most of what the job could hold, failed: freed, the 254 MiB kept would not have
    made room for it. Beside a 1.2 GiB request the steady growth is still the story."""
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    st = SiteStats(
        Site("/w/embed.py", 92, "encode_batch"), bytes=254 * MiB, count=1355, traced=3, allocs_in_trace=3
    )
    ev = cuda(
        total_bytes=44 * GiB,
        reserved_bytes=42 * GiB,
        allocated_bytes=int(30.8 * GiB),
        device_free_bytes=int(1.3 * GiB),
        request_bytes=int(request_gib * GiB),
        survivors=[Survivors(st, cycles=1354, gaps=1354, freed_at_site=0)],
    )
    ev.trend = _trend([{"step": i, "allocated_bytes": GiB + i * 192 * 1024} for i in range(1355)])
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("not what failed here" in s for s in f.facts) is capped


@pytest.mark.parametrize(("count", "capped"), [(2580, False), (64, True)])
def test_a_pile_of_one_lines_blocks_at_step_0_is_no_forward_pass(count: int, capped: bool) -> None:
    """An inference loop runs no optimizer step, so it reports step 0 all along. Its rounds at one line are
    passes of its first step only while the line holds what one forward pass makes (one block per layer); 2580
    blocks of one size holding most of the memory are a pile (frames appended to a list, never cleared)."""
    from triage.evidence import Survivors
    from triage.snapshot.frames import Site
    from triage.snapshot.sites import SiteStats

    size = int(30.2 * GiB) // count
    st = SiteStats(
        Site("/w/make_clip.py", 41, "keep"), bytes=size * count, count=count, traced=14, allocs_in_trace=14
    )
    ev = cuda(
        step=0,
        total_bytes=40 * GiB,
        reserved_bytes=int(38.6 * GiB),
        allocated_bytes=int(37.7 * GiB),
        device_free_bytes=300 * MiB,
        request_bytes=256 * MiB,
        survivors=[Survivors(st, cycles=13, gaps=13, freed_at_site=0)],
    )
    f = tensor_leak.evaluate(ev)
    assert f is not None
    assert (f.score < CONFIDENT_MIN) is capped
    assert any("passes within its first steps" in s for s in f.facts) is capped
