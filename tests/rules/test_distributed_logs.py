"""Multi-rank logs and bundles: memory prints from every rank, a worker that outlived its attempt, an OOM
in model setup, and a CUDA error raised outside the caching allocator.

Each behaviour is pinned on both sides. The launcher lines follow torchrun's elastic agent and the ranks'
own prints as they appear in real logs (no cluster runs here).
"""

from __future__ import annotations

from typing import Any

from triage.messages import memory_samples, setup_frame
from triage.pipeline import diagnose_bundle, diagnose_text
from triage.units import GiB

OOM = (
    "{p}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 432.00 MiB. GPU 4 has a total capacity of "
    "79.15 GiB of which 164.00 MiB is free. Including non-PyTorch memory, this process has 78.99 GiB memory in "
    "use. Of the allocated memory 78.20 GiB is allocated by PyTorch, and 132.00 MiB is reserved by PyTorch but "
    "unallocated.\n"
)


def _all_ranks_log(growth_gb: float) -> str:
    out = []
    for k in range(1, 21):
        base = 16.0 + growth_gb * k
        for r in (3, 0, 2, 1):  # every rank prints the same step, a little apart, in no order
            out.append(
                f"worker-0: [rank {r}] step {k * 100} loss 0.66 mem allocated: {base + 0.03 * r:.2f} GB\n"
            )
    return "".join(out) + OOM.format(p="worker-0: ")


def test_the_same_step_printed_by_every_rank_is_one_sample() -> None:
    """Four ranks print each step: one sample per step (the largest), so a steady rise reads as one."""
    samples = memory_samples(_all_ranks_log(0.8))
    assert [s["step"] for s in samples] == [k * 100 for k in range(1, 21)]
    assert samples[0]["allocated_bytes"] == int(16.89 * 1e9)
    d, _ = diagnose_text(_all_ranks_log(0.8))
    assert d.verdict == "tensor_leak", d.headline
    flat, _ = diagnose_text(_all_ranks_log(0.0))
    assert flat.verdict != "tensor_leak"


def _restart_log(oom_pid: int) -> str:
    first = "".join(f"[rank{r}] pid={2203110 + r} device=cuda:{r} restart_count=0\n" for r in range(8))
    steps = "".join(f"[rank4] step {k} loss 3.0 mem_alloc 66.9GiB\n" for k in (50, 100, 150))
    teardown = "".join(
        f"W0512 17:21:44 api.py:897] Sending process {2203110 + r} closing signal SIGTERM\n" for r in range(8)
    )
    restart = "I0512 17:22:14 api.py:880] [default] Worker group FAILED. 3/3 attempts left; will restart worker group\n"
    second = "".join(f"[rank{r}] pid={2207297 + r} device=cuda:{r} restart_count=1\n" for r in range(8))
    oom = (
        "[rank4]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 4 has a total "
        "capacity of 79.15 GiB of which 614.00 MiB is free. Including non-PyTorch memory, this process has 7.21 GiB "
        f"memory in use. Process {oom_pid} has 71.34 GiB memory in use. Of the allocated memory 6.40 GiB is "
        "allocated by PyTorch, and 310.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    return first + steps + teardown + restart + second + oom


def test_a_worker_of_an_attempt_before_the_restart_is_a_leftover_not_the_job() -> None:
    """torchrun tore down attempt 0 and restarted; a pid of attempt 0 still holding 71 GiB is a zombie
    (other_process). A pid of the attempt that failed is the job's own placement (two ranks on one GPU)."""
    d, ev = diagnose_text(_restart_log(2203114))
    assert 2203114 in ev.earlier_attempt_pids
    assert d.verdict == "other_process", d.headline
    own, ev2 = diagnose_text(_restart_log(2207301))
    assert not ev2.earlier_attempt_pids & {2207301}
    assert own.verdict != "other_process", own.headline


DDP_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/home/nlp/finetune.py", line 131, in <module>\n'
    "    model = DDP(model, device_ids=[local_rank])\n"
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 795, in __init__\n'
    "    self._ddp_init_helper(\n"
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 1129, in _ddp_init_helper\n'
    "    self.reducer = dist.Reducer(\n"
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total capacity of "
    "39.39 GiB of which 44.00 MiB is free. Including non-PyTorch memory, this process has 39.35 GiB memory in use. "
    "Of the allocated memory 38.80 GiB is allocated by PyTorch, and 60.00 MiB is reserved by PyTorch but unallocated.\n"
)


def test_an_oom_while_the_model_is_wrapped_came_before_any_step() -> None:
    """Under DDP's __init__ with nothing trained yet: nothing could have leaked. The same traceback after
    the log printed training steps (a model re-wrapped mid-run) proves nothing about the first step."""
    log = "[rank 0] loaded llama-2-7b in float32 on cuda:0\n" + DDP_TRACE
    d, ev = diagnose_text(log)
    assert ev.setup_call == "distributed.py:795 in __init__"
    assert d.verdict == "workload_too_large", d.headline
    assert "tensor_leak" not in d.candidates
    later = "".join(f"step {k} loss 2.1\n" for k in range(100, 600, 100)) + DDP_TRACE
    d2, ev2 = diagnose_text(later)
    assert ev2.setup_call is None and setup_frame(later, later.count("\n"), None) is None
    assert d2.verdict == "inconclusive", d2.headline


def _cuda_error_bundle(reserved_gib: float) -> dict[str, Any]:
    msg = "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call.\n"
    steps = [
        {
            "step": k,
            "allocated_bytes": int((reserved_gib - 2.5) * GiB),
            "reserved_bytes": int(reserved_gib * GiB),
            "peak_allocated_bytes": int((reserved_gib - 0.5) * GiB),
            "time_us": 1_000_000 * k,
            "batch_size": 512,
        }
        for k in range(1, 6)
    ]
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": f"cuda-error-{reserved_gib}",
        "occurred_at": "2026-11-30T08:00:00Z",
        "kind": "cuda_oom",
        "error": {"type": "RuntimeError", "message": msg},
        "workload": {"step": 6, "batch_size": 512, "pid": 48, "pids": [48]},
        "device": {"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_bytes": 84944093184},
        "allocator": {
            "memory_stats": {
                "allocated_bytes.all.current": int((reserved_gib - 2.5) * GiB),
                "reserved_bytes.all.current": int(reserved_gib * GiB),
                "num_ooms": 0,
            }
        },
        "timeline": steps,
    }


def test_a_cuda_error_with_the_allocator_far_below_the_device_is_not_the_step_too_large() -> None:
    """`CUDA error: out of memory` comes from a CUDA call outside the caching allocator; with the allocator
    holding half the device after five flat steps, what filled the device is not in its figures. With the
    allocator at the device's limit, the flat steps still point at the step."""
    d, ev = diagnose_bundle(_cuda_error_bundle(41.2))
    assert ev.outside_allocator
    assert d.verdict == "inconclusive", d.headline
    assert {"workload_too_large", "other_process"} <= set(d.candidates)
    full, ev2 = diagnose_bundle(_cuda_error_bundle(77.0))
    assert not ev2.outside_allocator
    assert full.verdict == "workload_too_large", full.headline
