"""nvidia-smi's process listing printed in a log (its table, or the CSV of ``--query-compute-apps``): what was
on the GPU besides the job. A listing printed before the job showed any progress holds only others; one
printed while it ran or after it failed holds the job too, so it counts only when the job's own line is
known (its pid from its launcher's or NCCL's lines). Likewise NVML's list in a bundle whose job never
initialised CUDA (empty allocator statistics) holds only others when each holds more than a context. Each is
pinned on both sides.

The table and CSV lines follow nvidia-smi 535's output; the NCCL prefix is NCCL's own ``host:pid:tid [dev]``
(no GPU runs here).
"""

from __future__ import annotations

from typing import Any

from triage.messages import smi_listing
from triage.pipeline import diagnose_bundle, diagnose_text

MiB = 1 << 20

TABLE = """+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0   N/A  N/A   2219903      C   /home/bob/miniconda3/envs/llm/bin/python  14838MiB |
+---------------------------------------------------------------------------------------+"""

CUDA_ERROR = """Traceback (most recent call last):
  File "/srv/eval.py", line 41, in main
    model = model.to("cuda")
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1152, in to
    return self._apply(convert)
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", line 825, in _apply
    param_applied = fn(param)
RuntimeError: CUDA error: out of memory
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
"""


def test_the_table_and_the_csv_it_was_asked_for() -> None:
    rows = smi_listing("Tue Feb 20 15:22:09 2024\n" + TABLE + "\n")
    assert [(r.gpu, r.pid, r.used_bytes) for r in rows] == [(0, 2219903, 14838 * MiB)]
    assert rows[0].name.endswith("/bin/python")
    csv = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader\n1773302, tritonserver, 80904 MiB\n"
    assert [(r.pid, r.name, r.used_bytes) for r in smi_listing(csv)] == [
        (1773302, "tritonserver", 80904 * MiB)
    ]
    # a bare "pid, N MiB" line in a log that never asked nvidia-smi for it is not known to be a listing
    assert smi_listing("1773302, 80904 MiB\n") == []
    # the last listing is the one read
    two = csv + "step 1\nstep 2\nstep 3\n" + "41877, 72913 MiB\n43120, 1021 MiB\n"
    assert [r.pid for r in smi_listing(two)] == [41877, 43120]


def test_a_neighbour_listed_before_the_job_started_is_the_cause() -> None:
    pre = (
        "preflight: nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader\n"
        "1773302, tritonserver, 80904 MiB\n"
        "INFO starting eval harness, model=/models/qwen2.5-1.5b\n"
    )
    d, ev = diagnose_text(pre + CUDA_ERROR)
    assert ev.log_smi_before_start
    assert d.verdict == "other_process"
    # the same listing printed while the job trained holds the job's own process too, and none is known
    # to be the job's: nothing is known to be a neighbour
    during = "step 100 | loss 0.52\n" + pre + CUDA_ERROR
    d, ev = diagnose_text(during)
    assert not ev.log_smi_before_start
    assert ev.processes == []
    assert d.verdict != "other_process"


NCCL = """W1002 node-17 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 41877 closing signal SIGTERM
INFO torchrun: Restarting worker group
node-17:43120:43311 [3] NCCL INFO Channel 00/24 :    0   1   2   3
node-17:43120:43311 [3] include/alloc.h:124 NCCL WARN Cuda failure 'out of memory'
[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/pretrain.py", line 401, in main
[rank3]:     model = DDP(model, device_ids=[local_rank], bucket_cap_mb=100)
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank3]: Last error:
[rank3]: Cuda failure 'out of memory'
[rank3] on-failure diagnostics: nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader -i 3
41877, 72913 MiB
{own}, 1021 MiB
"""


def test_after_the_failure_the_jobs_own_line_known_by_its_nccl_pid_leaves_the_zombie() -> None:
    d, ev = diagnose_text(NCCL.format(own=43120))
    assert {p.pid: p.own for p in ev.processes} == {41877: False, 43120: True}
    assert d.verdict == "other_process"
    # the job's own pid not among the listed: which line is the job is not known, so neither is a neighbour
    d, ev = diagnose_text(NCCL.format(own=50001))
    assert ev.processes == []
    assert d.verdict != "other_process"


def _context_failed(stats: dict[str, int], used: int) -> dict[str, Any]:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-4000-8000-0000000c0de1",
        "occurred_at": "2026-11-30T10:00:00+00:00",
        "kind": "cuda_oom",
        "error": {"type": "RuntimeError", "message": "CUDA error: out of memory", "traceback": CUDA_ERROR},
        "workload": {"pid": 7719, "pids": [7719], "step": 0, "batch_size": 16},
        "device": {
            "index": 0,
            "name": "NVIDIA A10G",
            "total_bytes": 23_826_792_448,
            "free_bytes": 23_826_792_448 - used,
            "processes": [{"pid": 6120, "used_bytes": used, "name": "python3"}],
        },
        "allocator": {"memory_stats": stats},
    }


def test_a_job_that_never_initialised_cuda_is_none_of_the_listed_processes() -> None:
    d, ev = diagnose_bundle(_context_failed({}, 23_753_392_128))
    assert ev.own_absent and ev.others_known
    assert d.verdict == "other_process"
    # with allocator statistics the job had initialised CUDA: the listed process may be the job (its pid
    # seen from another PID namespace), so nothing is known to be a neighbour's
    stats = {"reserved_bytes.all.current": 23_300_000_000, "allocated_bytes.all.current": 23_100_000_000}
    d, ev = diagnose_bundle(_context_failed(stats, 23_753_392_128))
    assert not ev.own_absent
    assert d.verdict != "other_process"
    # a listed process holding no more than a context may be the job's own
    _, ev = diagnose_bundle(_context_failed({}, 500 << 20))
    assert not ev.own_absent


PRE21 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
    "{alloc:.2f} GiB already allocated; 1.10 GiB free; {res:.2f} GiB reserved in total by PyTorch)\n"
)


def _printed_after_load(used_mib: int, alloc: float, res: float) -> str:
    return (
        "INFO loaded the model; GPU before training:\n"
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader\n"
        f"40711, python, {used_mib} MiB\n"
        'Traceback (most recent call last):\n  File "/w/train.py", line 88, in main\n    loss = model(x).loss\n'
        + PRE21.format(alloc=alloc, res=res)
    )


def test_a_listing_the_job_may_have_printed_itself_before_its_first_step_is_not_a_neighbour() -> None:
    # the job printed nvidia-smi after loading its 15 GiB model: the line holds less than it held at the OOM
    d, ev = diagnose_text(_printed_after_load(15_360, 76.1, 77.9))
    assert ev.log_smi_before_start
    assert ev.processes == []
    assert d.verdict != "other_process"
    # a line holding more than the job's whole reservation at the OOM cannot be the job
    _, ev = diagnose_text(_printed_after_load(60_000, 16.1, 17.9))
    assert [(p.pid, p.own) for p in ev.processes] == [(40711, False)]
