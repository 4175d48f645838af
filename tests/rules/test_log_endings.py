"""What ended the job, read from a whole log: an OOM the job went on after, an eviction, a launcher's
kill, errors printed while the process shut down, and inputs that are not a log at all.

Each behaviour is pinned on both sides: the reading that changes the verdict, and the nearby log where
the old reading still holds. Kubernetes and Ray lines follow the shapes `kubectl describe pod` and Ray's
memory monitor print (no cluster runs here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from triage.evidence import PROGRESS_AFTER_OOM
from triage.messages import memory_samples, went_on_after
from triage.pipeline import diagnose_text

NEIGHBOUR_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.21 GiB is free. Process 12345 has 46.00 GiB memory in use. Including non-PyTorch "
    "memory, this process has 31.92 GiB memory in use. Of the allocated memory 30.10 GiB is allocated by "
    "PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
OWN_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 557.80 MiB is free. Including non-PyTorch memory, this process has 78.61 GiB memory in "
    "use. Of the allocated memory 77.20 GiB is allocated by PyTorch, and 0.90 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
TRACEBACK = """Traceback (most recent call last):
  File "/workspace/train.py", line 311, in <module>
    main()
  File "/workspace/train.py", line 198, in train_step
    out = model(**batch)
"""


def steps(first: int, n: int) -> str:
    return "".join(f"step {k:6d} | loss 0.8{k % 10} | lr 3.00e-04\n" for k in range(first, first + n))


def caught_oom_then(after: str, oom: str = NEIGHBOUR_OOM) -> str:
    return (
        steps(1, 30)
        + "WARNING: OOM in step 31, emptied cache, retrying with batch_size=8\n"
        + oom
        + "\n"
        + after
    )


# ------------------------------------------------------------------ an OOM the job went on after


def test_an_oom_the_job_went_on_after_did_not_end_it() -> None:
    log = caught_oom_then(
        steps(32, 2000)
        + TRACEBACK
        + "ValueError: Target is multiclass but average='binary'. Please choose another average setting.\n"
    )
    d, ev = diagnose_text(log)
    assert d.verdict == "inconclusive"
    assert not d.candidates
    assert ev.survived_oom is not None
    assert "2000 lines of training progress" in d.headline and "ValueError" in d.headline


def test_a_few_lines_after_an_oom_are_other_ranks_before_they_block() -> None:
    """Another rank may print a step or two before it blocks in the next collective: the OOM still ended
    the job, and its neighbour is still the verdict."""
    log = caught_oom_then(
        steps(32, PROGRESS_AFTER_OOM - 1)
        + "[E ProcessGroupNCCL.cpp:607] Watchdog caught collective operation timeout\n"
    )
    d, ev = diagnose_text(log)
    assert ev.survived_oom is None
    assert d.verdict == "other_process"


def test_progress_after_a_restart_belongs_to_the_next_attempt() -> None:
    log = caught_oom_then("[INFO] torch.distributed.elastic: Restarting worker group\n" + steps(1, 500))
    oom_line = log[: log.index("torch.OutOfMemoryError")].count("\n") + 1
    assert went_on_after(log, oom_line) == (0, None)
    d, _ = diagnose_text(log)
    assert d.verdict == "other_process"


def test_progress_is_counted_for_the_failing_rank_only() -> None:
    lines = [f"[rank1]: step {k} | loss 0.5" for k in range(200)]
    log = "[rank0]: " + NEIGHBOUR_OOM + "\n" + "\n".join(lines) + "\n"
    assert went_on_after(log, 1, 0) == (0, None)
    assert went_on_after(log, 1, 1)[0] == 200


def test_a_host_kill_after_a_survived_oom_is_the_failure() -> None:
    log = caught_oom_then(
        steps(32, 400)
        + "Memory cgroup out of memory: Killed process 4411 (python) total-vm:99999kB, anon-rss:62914560kB\n"
    )
    d, _ = diagnose_text(log)
    assert d.verdict == "host_memory_limit"


# ------------------------------------------------------------------ errors printed while shutting down


def test_workers_dying_at_shutdown_after_a_fatal_oom_are_not_the_failure() -> None:
    log = (
        steps(1, 20)
        + TRACEBACK
        + OWN_OOM
        + "\nERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
        + "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2b1c0d9e50>\n"
        + "Traceback (most recent call last):\n"
        + '  File "/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1479, in __del__\n'
        + "    self._shutdown_workers()\n"
        + "RuntimeError: DataLoader worker (pid 8812) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n"
    )
    d, ev = diagnose_text(log)
    assert ev.is_cuda_oom
    assert d.verdict == "inconclusive"
    assert "shm_exhausted" not in d.candidates


def test_a_bus_error_that_ended_the_job_after_a_caught_oom_is_the_failure() -> None:
    log = caught_oom_then(
        steps(32, 3)
        + TRACEBACK
        + "RuntimeError: DataLoader worker (pid 8812) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n",
        oom=OWN_OOM,
    )
    d, _ = diagnose_text(log)
    assert d.verdict == "shm_exhausted"


# ------------------------------------------------------------------ evictions and other senders of SIGKILL


def describe_pod(reason_line: str, extra_volume: str = "") -> str:
    return f"""Name:             llm-ft-7f9c4-worker-0
Namespace:        team-nlp
Status:           Failed
Reason:           Evicted
Message:          {reason_line}
Containers:
  trainer:
    Last State:     Terminated
      Reason:       ContainerStatusUnknown
      Exit Code:    137
    Mounts:
      /dev/shm from dshm (rw){extra_volume}
Events:
  Type     Reason     Age   From     Message
  ----     ------     ----  ----     -------
  Warning  Evicted    2m    kubelet  {reason_line}
"""


@pytest.mark.parametrize(
    ("resource", "verdict"), [("ephemeral-storage", "inconclusive"), ("memory", "host_memory_limit")]
)
def test_an_eviction_is_a_memory_kill_only_for_memory(resource: str, verdict: str) -> None:
    """The kubelet's eviction exits 137 whatever the resource: for disk, it is another sender of SIGKILL."""
    log = describe_pod(
        f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 88228Ki. Container "
        f"trainer was using 212Gi, request is 0."
    )
    d, ev = diagnose_text(log)
    assert d.verdict == verdict
    assert (ev.other_killer is not None) is (resource != "memory")


def test_a_shm_volume_over_its_size_limit_is_shm() -> None:
    d, _ = diagnose_text(describe_pod('Usage of EmptyDir volume "dshm" exceeds the limit "32Gi".'))
    assert d.verdict == "shm_exhausted"
    assert any("dshm" in e.fact for e in d.evidence)


def test_another_emptydir_over_its_size_limit_is_not_shm() -> None:
    d, _ = diagnose_text(
        describe_pod(
            'Usage of EmptyDir volume "scratch" exceeds the limit "100Gi".',
            "\n      /scratch from scratch (rw)",
        )
    )
    assert d.verdict == "inconclusive"
    assert "shm_exhausted" not in d.candidates


def test_torchrun_killing_a_hung_rank_is_not_the_kernel() -> None:
    tail = (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 30102 closing signal SIGTERM\n"
        "WARNING:torch.distributed.elastic.multiprocessing.api:Unable to shutdown process 30102 via "
        "Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\n"
        "/bin/sh: line 1: 30102 Killed                  python train.py\n"
    )
    d, _ = diagnose_text(TRACEBACK + NEIGHBOUR_OOM + "\n" + tail)
    assert d.verdict == "other_process"
    # the same shell line with nothing else naming a sender stays the kernel's kill
    d, _ = diagnose_text(steps(1, 5) + "/bin/sh: line 1: 30102 Killed                  python train.py\n")
    assert d.verdict == "host_memory_limit"


def test_rays_memory_monitor_is_a_host_memory_kill() -> None:
    log = (
        "(TorchTrainer pid=14301, ip=10.2.0.14) Started distributed worker processes:\n"
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.2.0.14, ID: 5f0a8c) where the task (actor ID: 9a1c, name=RayTrainWorker."
        "__init__, pid=14402, memory used=41.27GB) was running was 119.71GB / 125.80GB (0.951597), which exceeds "
        "the memory usage threshold of 0.95. Ray killed this worker (ID: 4b2e) because it was the most recently "
        "scheduled task.\n"
    )
    d, _ = diagnose_text(log)
    assert d.verdict == "host_memory_limit"
    assert any("Ray's memory monitor" in e.fact for e in d.evidence)


# ------------------------------------------------------------------ inputs that are not a log


def test_an_empty_log_is_an_input_error(tmp_path: Path) -> None:
    for name, data in (("empty.log", b""), ("blank.log", b"  \n\n\t\n")):
        p = tmp_path / name
        p.write_bytes(data)
        r = run_cli("diagnose", str(p))
        assert r.returncode == 2
        assert b"empty" in r.stderr and b"Traceback" not in r.stderr


def test_nul_padding_in_a_log_is_dropped_and_binary_is_still_refused(tmp_path: Path) -> None:
    padded = tmp_path / "rotated.log"
    padded.write_bytes(b"\x00" * 8192 + (TRACEBACK + NEIGHBOUR_OOM + "\n").encode())
    r = run_cli("diagnose", str(padded), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "other_process"
    binary = tmp_path / "snap.pickle"
    binary.write_bytes(bytes(range(256)) * 64)
    r = run_cli("diagnose", str(binary))
    assert r.returncode == 2 and b"binary data" in r.stderr


def test_a_batch_size_below_one_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "crash.log"
    p.write_text(TRACEBACK + OWN_OOM + "\n")
    for bad in ("0", "-8", "abc"):
        r = run_cli("diagnose", str(p), "--batch-size", bad)
        assert r.returncode == 2
        assert b"--batch-size" in r.stderr and b"Traceback" not in r.stderr


# ------------------------------------------------------------------ live memory the log printed per step


def deepspeed_log(ma_gib: list[float]) -> str:
    out = []
    for k, ma in enumerate(ma_gib):
        out.append(f"[2024-05-14 10:03:11,201] [INFO] [utils.py:781:see_memory_usage] after step {20 * k}")
        out.append(
            f"[2024-05-14 10:03:11,202] [INFO] [utils.py:782:see_memory_usage] MA {ma:.2f} GB         "
            f"Max_MA {ma + 6:.2f} GB         CA {ma + 7:.2f} GB         Max_CA {ma + 8:.0f} GB "
        )
    return "\n".join(out) + "\n" + TRACEBACK + OWN_OOM + "\n"


@pytest.mark.parametrize(
    ("ma", "verdict"), [([21.3 + 2.35 * k for k in range(20)], "tensor_leak"), ([21.3] * 20, None)]
)
def test_deepspeed_memory_prints_are_the_steps(ma: list[float], verdict: str | None) -> None:
    d, ev = diagnose_text(deepspeed_log(ma))
    assert len(ev.steps) == 20 and ev.steps[1].step == 20
    assert ev.steps[0].peak_allocated_bytes - ev.steps[0].allocated_bytes == 6 * 1024**3
    if verdict:
        assert d.verdict == verdict
    else:
        assert d.verdict != "tensor_leak" and "tensor_leak" not in d.candidates[:1]


def test_memory_allocated_printed_in_bytes_is_read_and_peaks_are_not_current() -> None:
    lines = [
        f"[it {10 * k}] loss=1.83 torch.cuda.max_memory_allocated()={40_000_000_000} "
        f"torch.cuda.memory_allocated()={9_663_676_416 + k * 67_108_864}"
        for k in range(300)
    ]
    samples = memory_samples("\n".join(lines))
    assert len(samples) == 300
    assert samples[0] == {"step": 0, "allocated_bytes": 9_663_676_416, "peak_allocated_bytes": 40_000_000_000}
    d, _ = diagnose_text("\n".join(lines) + "\n" + TRACEBACK + OWN_OOM + "\n")
    assert d.verdict == "tensor_leak"


def test_what_is_not_a_memory_sample() -> None:
    # peaks printed without live memory are peaks only: never a floor (see test_log_telemetry.py)
    assert memory_samples("step 4 | peak_allocated 30 GiB | max_mem_allocated 31 GiB") == [
        {"step": 4, "allocated_bytes": 30 * 1024**3, "peak_allocated_bytes": 30 * 1024**3, "peak_only": 1}
    ]
    assert memory_samples("GPU 0; 79.15 GiB total capacity; 76.10 GiB already allocated; 1.2 GiB free") == []
    assert memory_samples(OWN_OOM) == []
    assert memory_samples("epoch 3 allocated=512") == []  # a bare count, not bytes
    # three prints are not enough to be the job's steps
    d, ev = diagnose_text(deepspeed_log([20.0, 30.0, 40.0]))
    assert not ev.steps and d.verdict == "inconclusive"


def test_only_the_failing_ranks_prints_count() -> None:
    other = "\n".join(f"[rank1]: step {k} mem_allocated {10 + k} GiB" for k in range(30))
    mine = "\n".join(f"[rank0]: step {k} mem_allocated 10 GiB" for k in range(30))
    d, ev = diagnose_text(other + "\n" + mine + "\n[rank0]: " + OWN_OOM + "\n")
    assert ev.message is not None and ev.message.rank == 0
    assert ev.steps and {s.allocated_bytes for s in ev.steps} == {10 * 1024**3}
    assert d.verdict != "tensor_leak"


@pytest.mark.parametrize(
    "stop",
    [
        "# events: Normal Killing kubelet Stopping container trainer (node spot-a100-12 draining: spot interruption)\n",
        "W0606 03:14:10.004000 1 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
        "death signal, shutting down workers\n",
    ],
)
def test_a_graceful_stop_that_ran_out_its_grace_period_is_not_a_memory_kill(stop: str) -> None:
    """Exit code 137 after the pod was told to stop: the kubelet (or the spot reclaim) sent SIGTERM first and
    SIGKILL when the grace period ran out. The kernel's OOM killer sends no SIGTERM."""
    log = (
        "# lastState.terminated: reason=Error exitCode=137\n"
        + stop
        + steps(88100, 88120)
        + "I0606 03:14:38.900000 91 train.py] checkpoint upload 41% (17.2/41.9 GB)\n"
    )
    d, ev = diagnose_text(log)
    assert ev.other_killer
    assert d.verdict != "host_memory_limit", d.headline
    d, _ = diagnose_text("# lastState.terminated: reason=Error exitCode=137\n" + steps(88100, 88120))
    assert d.verdict == "host_memory_limit", d.headline  # nothing else named: the kernel's kill stands


def test_ranks_that_print_their_own_pids_are_the_job_not_neighbours() -> None:
    """Every rank loaded the checkpoint onto cuda:0 (``map_location='cuda:0'``): their 3 GiB on GPU 0 are the
    job's own processes, which the log ties to the ranks by pid."""
    pids = "".join(
        f"[rank{r}] pid={40111 + r} device=cuda:{r} loading checkpoint (map_location='cuda:0')\n"
        for r in range(4)
    )
    oom = (
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 456.00 MiB is free. Including non-PyTorch memory, this process has 69.40 "
        "GiB memory in use. Process 40112 has 3.05 GiB memory in use. Process 40113 has 3.05 GiB memory in use. "
        "Process 40114 has 3.05 GiB memory in use. Of the allocated memory 68.10 GiB is allocated by PyTorch, and "
        "600.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    d, ev = diagnose_text(pids + oom)
    assert {40112, 40113, 40114} <= ev.launcher_pids
    assert ev.other_process_bytes == 0
    assert d.verdict != "other_process", d.headline
    d, _ = diagnose_text(oom)  # without the ranks' own lines, the pids are strangers
    assert "other_process" in d.candidates


def test_a_loop_printing_alloc_per_step_shows_the_growth() -> None:
    log = "".join(
        f"step {k * 50:5d}/20000 | bs=8 | loss 3.0 | alloc {22.41 + 1.1 * k:.2f} GiB | reserved {23.5 + 1.1 * k:.2f} GiB\n"
        for k in range(1, 40)
    )
    samples = memory_samples(log)
    assert len(samples) == 39 and samples[-1]["step"] > samples[0]["step"]
    assert samples[0]["allocated_bytes"] == round(23.51 * (1 << 30))
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 20.00 MiB is free. Process 712001 has 79.12 GiB memory in use. Of the allocated memory "
        "77.60 GiB is allocated by PyTorch, and 500.00 MiB is reserved by PyTorch but unallocated.\n"
    )
    d, _ = diagnose_text(log + oom)
    assert d.verdict == "tensor_leak", d.headline


CPU_ALLOC = (
    "Traceback (most recent call last):\n"
    '  File "/opt/tts/data.py", line 97, in collate\n'
    "    mel = torch.zeros(len(batch), 80, max_len)\n"
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate {n} bytes. Error code 12 (Cannot allocate memory)\n"
)


def test_a_host_request_larger_than_any_host_is_not_a_memory_limit() -> None:
    # malloc refuses one request only when the node could not commit it at all; 10 TiB is a size computed
    # from bad data (a corrupt max_len), which no pod limit would have let through
    d, _ = diagnose_text(CPU_ALLOC.format(n=10 * 1024**4))
    assert d.verdict == "inconclusive", d.headline
    assert "host_memory_limit" in d.candidates
    assert any("more than any host has" in e.fact for e in d.evidence)
    assert not any("kernel's kill" in e.fact for e in d.evidence)  # the allocator refused; nothing was killed


def test_a_host_request_of_a_plausible_size_refused_is_the_host_memory() -> None:
    d, _ = diagnose_text(CPU_ALLOC.format(n=3 * 1024**3))
    assert d.verdict == "host_memory_limit", d.headline
    assert any("the host allocator's refusal" in e.fact for e in d.evidence)


SHM_MMAP = (
    "Epoch: [25][3097/5005]\tTime  0.547 ( 0.548)\tLoss 1.9593e+00 (2.1268e+00)\n"
    "Exception in thread Thread-52 (_pin_memory_loop):\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.10/dist-packages/torch/multiprocessing/reductions.py", line 541, in '
    "rebuild_storage_filename\n"
    "    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, handle, size)\n"
    "RuntimeError: unable to mmap 2048 bytes from file </torch_10182_3020184674_63991>: {err}\n"
)


def test_mapping_a_shared_memory_file_with_enomem_is_not_a_full_dev_shm() -> None:
    # mapping a /dev/shm file takes no room in it: ENOMEM is the mapping count (vm.max_map_count) running out
    d, _ = diagnose_text(SHM_MMAP.format(err="Cannot allocate memory (12)"))
    assert d.verdict == "inconclusive", d.headline
    assert "shm_exhausted" in d.candidates
    assert any("vm.max_map_count" in a for a in d.actions)


def test_a_shared_memory_file_with_no_space_left_is_a_full_dev_shm() -> None:
    d, _ = diagnose_text(SHM_MMAP.format(err="No space left on device (28)"))
    assert d.verdict == "shm_exhausted", d.headline


def test_enomem_beside_a_dev_shm_the_collector_saw_full_stays_shm() -> None:
    from triage.pipeline import diagnose_bundle

    bundle = {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-4000-8000-000000000001",
        "occurred_at": "2026-11-30T10:00:00+00:00",
        "kind": "shm_exhausted",
        "error": {"type": "RuntimeError", "message": SHM_MMAP.format(err="Cannot allocate memory (12)")},
        "host": {"shm_total_bytes": 64 << 20, "shm_used_bytes": 63 << 20},
    }
    assert diagnose_bundle(bundle)[0].verdict == "shm_exhausted"
    bundle["host"] = {"shm_total_bytes": 64 << 30, "shm_used_bytes": 2 << 30}
    assert diagnose_bundle(bundle)[0].verdict == "inconclusive"
