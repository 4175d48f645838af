"""A job that runs in a share of a GPU: a fraction cap or a vGPU limit it asked for, a cap that splits the
GPU between the job's own processes, and a neighbour outside the job's share.

Evidence is built field by field; each case pins both sides of the fact that moves the verdict.
"""

from __future__ import annotations

from typing import Any

from rules import gpu_quota, other_process
from rules.base import CANDIDATE, LIKELY
from triage.engine import diagnose
from triage.evidence import Evidence, Process
from triage.units import GiB, MiB


def half_gpu(**kw: Any) -> Evidence:
    """An 80 GB A100 capped at half: the job asks 3 GiB with 38 GiB reserved; the device has 1.7 GiB free."""
    base: dict[str, Any] = {
        "kind": "cuda_oom",
        "device_name": "NVIDIA A100-SXM4-80GB",
        "total_bytes": 80 * GiB,
        "fraction_cap_bytes": 40 * GiB,
        "device_free_bytes": int(1.7 * GiB),
        "reserved_bytes": 38 * GiB,
        "allocated_bytes": 34 * GiB,
        "request_bytes": 3 * GiB,
        "pid": 1,
        "own_pids": {1, 9, 10},
    }
    base.update(kw)
    return Evidence(**base)


def test_a_cap_the_job_was_declared_for_is_not_a_quota_below_it() -> None:
    """Declared for 40 GiB (a half-GPU product) and capped at 40 GiB: it got what it asked for. Declared
    for the whole 80 GiB and capped at half: the platform's limit."""
    asked = gpu_quota.evaluate(half_gpu(declared_total_bytes=40 * GiB, device_free_bytes=41 * GiB))
    assert asked is not None and asked.score <= CANDIDATE
    assert any("the share it asked for" in x for x in asked.facts)
    promised = gpu_quota.evaluate(half_gpu(declared_total_bytes=80 * GiB, device_free_bytes=41 * GiB))
    assert promised is not None and promised.score >= LIKELY


def test_a_cap_beside_the_jobs_own_process_holding_the_rest_is_the_jobs_split() -> None:
    """The job's own evaluation server (pid 9, one of its pids) holds the other half: the cap divides the
    job's GPU between its processes, not a platform limit. A stranger holding it leaves the cap a quota."""
    own = half_gpu(
        processes=[Process(1, 39 * GiB, True, "nvml"), Process(9, 38 * GiB, True, "nvml")],
        fraction_rejected=True,
    )
    f = gpu_quota.evaluate(own)
    assert own.own_others_bytes == 38 * GiB
    assert f is not None and f.score < LIKELY
    stranger = half_gpu(
        processes=[Process(1, 39 * GiB, True, "nvml"), Process(777, 38 * GiB, False, "nvml")],
        fraction_rejected=True,
    )
    assert stranger.own_others_bytes == 0
    g = gpu_quota.evaluate(stranger)
    assert g is not None and g.score >= LIKELY


def test_a_neighbour_beyond_the_jobs_own_cap_did_not_decide() -> None:
    """Reserved 38 GiB + 3 GiB is over the 40 GiB cap: the cap refused it whatever the other half held.
    Under the cap (30 GiB reserved) with the device full, the neighbour took what the job could have had."""
    procs = [Process(1, 39 * GiB, True, "nvml"), Process(777, 38 * GiB, False, "nvml")]
    at_cap = half_gpu(
        processes=procs,
        own_process_identified=True,
        other_process_bytes=38 * GiB,
        declared_total_bytes=40 * GiB,
    )
    assert at_cap.hit_own_limit
    f = other_process.evaluate(at_cap)
    assert f is not None and f.score <= CANDIDATE
    assert diagnose(at_cap).verdict != "other_process"
    under = half_gpu(
        processes=procs,
        own_process_identified=True,
        other_process_bytes=38 * GiB,
        reserved_bytes=30 * GiB,
        allocated_bytes=29 * GiB,
        device_free_bytes=200 * MiB,
    )
    assert not under.hit_own_limit
    g = other_process.evaluate(under)
    assert g is not None and g.score >= LIKELY


def test_a_vgpu_share_the_job_asked_for_is_not_a_quota() -> None:
    """HAMi limits the job to 16 GiB and the pod asked for 16 GiB (nvidia.com/gpumem): not a limit below
    what it was promised. Asking for 24 GiB and getting 16: the layer's limit."""
    ev = Evidence(
        kind="cuda_oom",
        device_name="NVIDIA L40S",
        total_bytes=16 * GiB,
        vgpu_limit_bytes=16 * GiB,
        declared_total_bytes=16 * GiB,
        device_free_bytes=388 * MiB,
        reserved_bytes=int(15.1 * GiB),
        allocated_bytes=int(14.6 * GiB),
        request_bytes=500 * MiB,
    )
    f = gpu_quota.evaluate(ev)
    assert f is not None and f.score <= CANDIDATE
    ev.declared_total_bytes = 24 * GiB
    g = gpu_quota.evaluate(ev)
    assert g is not None and g.score >= LIKELY


def _capped_bundle(set_by: str | None) -> dict[str, Any]:
    msg = (
        "CUDA out of memory. Tried to allocate 2.88 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
        "40.74 GiB is free. Including non-PyTorch memory, this process has 38.41 GiB memory in use. 39.58 GiB "
        "allowed; Of the allocated memory 37.90 GiB is allocated by PyTorch, and 1.55 MiB is reserved by "
        "PyTorch but unallocated."
    )
    alloc: dict[str, Any] = {"fraction": 0.5, "fraction_cap_bytes": 42493542400}
    if set_by is not None:
        alloc["fraction_set_by"] = {
            "fraction": 0.5,
            "device": 0,
            "filename": set_by,
            "line": 12,
            "function": "main",
        }
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": f"cap-{set_by}",
        "occurred_at": "2026-11-30T08:00:00Z",
        "kind": "cuda_oom",
        "error": {"type": "torch.OutOfMemoryError", "message": msg},
        "workload": {"step": 1, "batch_size": 15, "pid": 1, "pids": [1]},
        "device": {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "total_bytes": 84987084800},
        "allocator": alloc,
    }


def test_a_cap_the_jobs_own_code_set_is_its_own_limit() -> None:
    """The collector saw the job's train.py call set_per_process_memory_fraction: its own limit, so the
    step is too large for what it allowed itself. Set from a library (a platform wrapper) or with no record
    of the caller, the cap stays the platform's quota."""
    from triage.pipeline import diagnose_bundle

    own, ev = diagnose_bundle(_capped_bundle("/workspace/train.py"))
    assert ev.cap_set_by_job == "train.py:12 in main"
    assert own.verdict == "workload_too_large", own.headline
    wrapper, ev2 = diagnose_bundle(_capped_bundle("/usr/lib/python3.11/site-packages/platform_gpu/share.py"))
    assert ev2.cap_set_by_job is None and wrapper.verdict == "gpu_quota", wrapper.headline
    unknown, _ = diagnose_bundle(_capped_bundle(None))
    assert unknown.verdict == "gpu_quota", unknown.headline
