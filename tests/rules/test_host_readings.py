"""Host-side readings: a pinned buffer the driver refused (``CUDA error: out of memory`` about host RAM),
the kubelet's eviction for node memory pressure, a DataLoader worker found dead while the process shut
down after a CUDA OOM, a worker SIGKILL the cgroup's own counter disowns, an exit 137 the incident names
another sender for, and a progress bar the traceback was printed on.

Each reading is pinned on both sides. Kubernetes lines follow the shapes the kubelet and `kubectl
describe pod` print (no cluster runs here); the bundles follow docs/bundle.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from triage.messages import parse_messages
from triage.pipeline import diagnose_bundle, diagnose_text
from triage.units import GiB

CUDA_ERROR_TAIL = (
    "RuntimeError: CUDA error: out of memory\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
)
PIN_THREAD = (
    "Traceback (most recent call last):\n"
    '  File "/srv/train.py", line 88, in <module>\n'
    "    for batch in loader:\n"
    '  File "/usr/lib/python3/dist-packages/torch/_utils.py", line 705, in reraise\n'
    "    raise exception\n"
    "RuntimeError: Caught RuntimeError in pin memory thread for device 0.\n"
    "Original Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/dist-packages/torch/utils/data/_utils/pin_memory.py", line 37, in do_one_step\n'
    "    data = pin_memory(data, device)\n"
    '  File "/usr/lib/python3/dist-packages/torch/utils/data/_utils/pin_memory.py", line 58, in pin_memory\n'
    "    return data.pin_memory(device)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^\n" + CUDA_ERROR_TAIL
)
MODEL_TO_DEVICE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/serve.py", line 19, in <module>\n'
    '    model = build().to("cuda")\n'
    '  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1158, in convert\n'
    "    return t.to(device, dtype if t.is_floating_point() else None, non_blocking)\n" + CUDA_ERROR_TAIL
)


def test_a_pinned_buffer_the_driver_refused_is_host_memory() -> None:
    [m] = parse_messages(PIN_THREAD)
    assert (m.kind, m.format) == ("host_oom", "host-pinned")
    d, _ = diagnose_text(PIN_THREAD)
    assert d.verdict == "host_memory_limit" and d.owner == "platform"
    assert 0.7 <= d.confidence < 0.85  # a refusal, not a kill the kernel logged
    assert any("pin host memory" in e.fact for e in d.evidence)


def test_the_same_error_moving_the_model_is_about_the_gpu() -> None:
    [m] = parse_messages(MODEL_TO_DEVICE)
    assert (m.kind, m.format) == ("cuda_oom", "cuda-error")
    d, _ = diagnose_text(MODEL_TO_DEVICE)
    assert d.verdict == "inconclusive"
    assert "host_memory_limit" not in d.candidates


EVICTED = (
    "Status:           Failed\n"
    "Reason:           Evicted\n"
    "Message:          The node was low on resource: memory. Threshold quantity: 100Mi, available: 81220Ki. "
    "Container worker was using 41943040Ki, request is 24Gi, has larger consumption of memory.\n"
    "Events:\n"
    "  Warning  Evicted  4m  kubelet  The node was low on resource: memory. Threshold quantity: 100Mi, "
    "available: 81220Ki. Container worker was using 41943040Ki, request is 24Gi, has larger consumption of "
    "memory.\n"
    "  Normal   Killing  4m  kubelet  Stopping container worker\n"
)


def test_an_eviction_for_node_memory_pressure() -> None:
    [m] = parse_messages(EVICTED)  # the status and the event are one eviction
    assert (m.kind, m.format) == ("host_oom", "host-evicted")
    assert m.extra == {"container": "worker", "used_bytes": str(41943040 * 1024)}
    d, _ = diagnose_text(EVICTED)
    assert d.verdict == "host_memory_limit"


def test_an_eviction_for_disk_is_not_memory() -> None:
    text = EVICTED.replace("resource: memory", "resource: ephemeral-storage").replace("memory.", "storage.")
    assert parse_messages(text) == []
    d, _ = diagnose_text(text)
    assert d.verdict == "inconclusive"


OOM_21 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacty of "
    "39.39 GiB of which 702.00 MiB is free. Including non-PyTorch memory, this process has 38.70 GiB memory in "
    "use. Of the allocated memory 22.10 GiB is allocated by PyTorch, and 16.04 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n"
)
WORKER_AT_SHUTDOWN = (
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f00c0a1b0d0>\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1478, in __del__\n'
    "    self._shutdown_workers()\n"
    '  File "/usr/lib/python3/dist-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler\n'
    "    _error_if_any_worker_fails()\n"
    "RuntimeError: DataLoader worker (pid 2210) is killed by signal: Killed.\n"
)
WORKER_IN_LOOP = WORKER_AT_SHUTDOWN.replace("Exception ignored in: <function", "During the epoch: <function")


@pytest.mark.parametrize(("tail", "host"), [(WORKER_AT_SHUTDOWN, False), (WORKER_IN_LOOP, True)])
def test_a_worker_found_dead_while_the_process_shut_down(tail: str, host: bool) -> None:
    """After a CUDA OOM, a worker death Python printed under "Exception ignored in" is the DataLoader
    going down with its parent; the same line raised in the loop is a kill that ended the job."""
    d, _ = diagnose_text(
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n' + OOM_21 + tail
    )
    assert (d.verdict == "host_memory_limit") is host
    if not host:
        assert "host_memory_limit" not in d.candidates


def bundle(kind: str, error: dict[str, Any], cgroup: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "host-reading",
        "occurred_at": "2026-11-30T10:00:00Z",
        "kind": kind,
        "error": error,
        "host": {"cgroup": cgroup} if cgroup is not None else None,
    }


WORKER_KILLED = {
    "type": "RuntimeError",
    "message": "DataLoader worker (pid(s) 3321) exited unexpectedly",
    "traceback": "RuntimeError: DataLoader worker (pid 3321) is killed by signal: Killed.\n",
    "exit_code": 1,
}


@pytest.mark.parametrize(
    ("kills", "usage_gib", "verdict"),
    [(0, 27, "inconclusive"), (0, 120, "host_memory_limit"), (1, 27, "host_memory_limit")],
)
def test_a_worker_sigkill_the_cgroup_disowns(kills: int, usage_gib: int, verdict: str) -> None:
    """A worker killed by SIGKILL names no sender. Read after the kill, a cgroup v2 counter at 0 with usage
    far below the limit says the OOM killer did not send it; near the limit, or with a kill counted, it did."""
    cgroup = {"version": 2, "memory_limit_bytes": 128 * GiB, "memory_usage_bytes": usage_gib * GiB}
    cgroup["oom_kill_count"] = kills
    d, _ = diagnose_bundle(bundle("crash", WORKER_KILLED, cgroup))
    assert d.verdict == verdict


@pytest.mark.parametrize(
    ("message", "verdict"),
    [
        (
            "container train of pod ml/nightly-4xk9z was killed (Error): exit code 137; job condition Failed "
            'reason=DeadlineExceeded message="Job was active longer than specified deadline"',
            "inconclusive",
        ),
        ("container train of pod ml/nightly-4xk9z was OOMKilled: exit code 137", "host_memory_limit"),
    ],
)
def test_an_exit_137_filed_as_a_host_oom(message: str, verdict: str) -> None:
    """The watcher files a container's exit 137 as a host OOM. When the runtime saw no OOM (reason Error)
    and the Job ran past its deadline, the SIGKILL had another sender; OOMKilled stays strong."""
    error = {"type": "ContainerTerminated", "message": message, "exit_code": 137}
    d, _ = diagnose_bundle(bundle("host_oom", error, {}))
    assert d.verdict == verdict


def test_the_progress_bar_the_traceback_was_printed_on() -> None:
    """A progress bar at 0/N redraws without a newline, so the traceback starts on its line: the first step
    had not finished."""
    text = (
        "  0%|          | 0/9375 [00:00<?, ?it/s]Traceback (most recent call last):\n"
        '  File "/opt/sft/run.py", line 281, in main\n'
        "    trainer.train()\n" + OOM_21.replace("16.04 GiB is reserved", "0.04 GiB is reserved")
    )
    _, ev = diagnose_text(text)
    assert ev.first_step_bar == "0/9375" and ev.step == 0
    _, ev = diagnose_text(text.replace("0/9375 [00:00<?", "12/9375 [00:31<6:40"))
    assert ev.first_step_bar is None and ev.step is None


def test_a_collector_bundle_of_a_refused_pinned_buffer() -> None:
    """The collector filed the exception as a CUDA OOM; its traceback says the pin memory thread raised it
    and the allocator recorded no OOM: the host ran short. Near its limit, the pod's memory decides."""
    error = {"type": "RuntimeError", "message": "CUDA error: out of memory", "traceback": PIN_THREAD}
    cgroup = {"version": 2, "memory_limit_bytes": 48 * GiB, "memory_usage_bytes": 48 * GiB - (20 << 20)}
    d, ev = diagnose_bundle(bundle("cuda_oom", error, cgroup))
    assert ev.kind == "host_oom"
    assert d.verdict == "host_memory_limit"
    error["traceback"] = MODEL_TO_DEVICE
    _, ev = diagnose_bundle(bundle("cuda_oom", error, cgroup))
    assert ev.kind == "cuda_oom"


@pytest.mark.parametrize(
    ("reason", "verdict"), [("OOMKilled", "host_memory_limit"), ("Error", "inconclusive")]
)
def test_the_watchers_bundle_of_an_exit_137_by_its_termination_reason(reason: str, verdict: str) -> None:
    """A pod the watcher saw end with exit code 137 and no collector: the kubelet calls a kill in the
    container's memory cgroup ``OOMKilled``; with reason ``Error`` the SIGKILL came from elsewhere (a
    preemption, a deadline, a stop past its grace period), so the pod's memory limit is not the answer.
    Built from the pod object the Kubernetes API documents (tests/k8s/k8sobjects.py), no API server."""
    from tests.k8s.k8sobjects import container_status, pod, terminated
    from triage.k8s.watcher import build_bundle, terminations

    p = pod("trainer-0", phase="Failed", statuses=[container_status(state=terminated(reason, 137))])
    (term,) = terminations(p, ["trainer"])
    d, ev = diagnose_bundle(build_bundle(p, None, term, "host_oom", log_text="step 8800 | loss 0.77\n"))
    assert d.verdict == verdict, d.headline
    assert (ev.other_killer is not None) is (reason == "Error")
