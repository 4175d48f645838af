"""The collector in real training processes: torch's CPU build, the CUDA stand-in, a real loopback service.

No GPU here: the CUDA calls a CPU build lacks (OOM observer, allocator history, snapshot, mem_get_info)
come from tests/collector/fake_cuda.py, whose snapshots are produced by the project's simulator
(``triage simulate``). tests/gpu/ holds the same checks for a real GPU.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.collector.collector_harness import (
    ROOT,
    TRAIN,
    Run,
    TriageServer,
    free_port,
    read_bundle,
    run_script,
    spooled,
    subprocess_env,
)
from triage.schemas import IncidentBundle


@pytest.fixture(scope="module")
def baseline_oom(pth_dir: Path) -> Run:
    """The same crash without the collector: what the user's stderr must look like."""
    r = run_script(subprocess_env(pth_dir, url=None), "oom")
    assert r.returncode == 1, r.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory" in r.stderr
    assert not r.triage_lines()
    return r


def _validated(path_or_bundle: Path | dict) -> IncidentBundle:
    b = read_bundle(path_or_bundle) if isinstance(path_or_bundle, Path) else path_or_bundle
    return IncidentBundle.model_validate(b)


def test_oom_with_the_service_down_is_spooled_then_sent_exactly_once_by_the_next_start(
    pth_dir: Path, tmp_path: Path, baseline_oom: Run
) -> None:
    spool = tmp_path / "spool"
    down = f"http://127.0.0.1:{free_port()}"
    env = subprocess_env(
        pth_dir,
        url=down,
        spool=spool,
        extra={
            "TRIAGE_SEND_BUDGET": "1",
            "RANK": "3",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "8",
            "POD_NAME": "trainer-0",
        },
    )
    r = run_script(env, "oom")

    # the user's crash is unchanged: exit code and traceback, byte for byte
    assert r.returncode == 1
    assert r.stderr_without_triage() == baseline_oom.stderr.rstrip("\n")
    lines = r.triage_lines()
    assert len(lines) == 1 and "not delivered yet" in lines[0] and str(spool) in lines[0], r.stderr

    files = spooled(spool)
    assert len(files) == 1
    raw = files[0].read_bytes()
    b = _validated(files[0])
    bundle = read_bundle(files[0])
    assert files[0].name == f"{b.incident_id}.json.gz"
    assert b.kind == "cuda_oom"
    assert b.error is not None and b.error.type == "torch.OutOfMemoryError" and b.error.exit_code == 1
    assert b.error.message is not None and b.error.message.startswith("CUDA out of memory. Tried to allocate")
    assert b.error.traceback is not None and "forward_that_ooms" in b.error.traceback
    assert b.error.traceback.rstrip("\n").splitlines()[-1] in baseline_oom.stderr
    # workload: ranks from torchrun's variables, progress from the optimizer hook and the DataLoader
    w = b.workload
    assert w is not None
    assert (w.rank, w.local_rank, w.world_size, w.pod) == (3, 0, 8, "trainer-0")
    assert w.step == 3 and w.batch_size == 16 and w.pid in (w.pids or [])
    # the allocator's evidence, as the stand-in's observer and history calls gave it
    a = b.allocator
    assert a is not None and a.observer is not None and a.memory_stats
    assert a.observer.device == 0 and a.observer.alloc_size and a.observer.device_free is not None
    assert a.settings is not None
    assert b.collector is not None and b.collector.history_max_entries == 100_000
    assert bundle["collector"]["observer_calls"] == 2  # deduplicated: the allocator called it twice
    assert b.collector.capture_ms is not None and b.collector.capture_ms < 5000
    assert b.device is not None and b.device.total_bytes and b.device.free_bytes is not None
    tl = b.timeline or []
    assert [s.step for s in tl] == [1, 2, 3]
    assert all(s.allocated_bytes and s.reserved_bytes and s.batch_size == 16 for s in tl)
    assert all(s.device == 0 for s in tl)  # the current device, the one sampled
    assert [s.allocated_bytes or 0 for s in tl] == sorted(s.allocated_bytes or 0 for s in tl)
    assert b.host is not None and b.host.shm_total_bytes and b.host.cpu_count
    assert b.environment is not None and b.environment.torch_version and b.environment.RANK == "3"
    # the snapshot is the stand-in's _snapshot() (the simulator's), tuples as lists
    from tests.collector import fake_cuda

    expected, _msg, _src = fake_cuda._scenario("tensor_leak", 0)
    import json

    # taken inside the observer: the allocator at the OOM, before the exception freed the step's tensors
    assert bundle["snapshot"] == json.loads(json.dumps(expected))
    assert bundle["collector"]["snapshot_at"] == "oom"

    # the next processes that start with the collector deliver it: two at once, exactly one POST
    srv = TriageServer().start()
    try:
        env2 = subprocess_env(pth_dir, url=srv.url, spool=spool)
        procs = [
            subprocess.Popen(
                [sys.executable, str(TRAIN), "next-start"],
                env=env2,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        assert all("SPOOL_LEFT=0" in o for o, _ in outs), outs
        assert srv.ids() == [str(b.incident_id)]
        assert srv.received[0].body == raw  # the spooled bytes, unchanged
        said = [ln for _, e in outs for ln in e.splitlines() if ln.startswith("oom-triage:")]
        assert said == [
            f"oom-triage: incident {b.incident_id}: verdict tensor_leak; ticket {srv.url}/tickets/{str(b.incident_id)[:8]}"
        ]
    finally:
        srv.stop()


def test_oom_delivered_during_the_crash_prints_the_verdict(
    pth_dir: Path, tmp_path: Path, server: TriageServer, baseline_oom: Run
) -> None:
    spool = tmp_path / "spool"
    r = run_script(
        subprocess_env(pth_dir, url=server.url, spool=spool, extra={"TRIAGE_TOKEN": "s3cret"}), "oom"
    )
    assert r.returncode == 1
    assert r.stderr_without_triage() == baseline_oom.stderr.rstrip("\n")
    assert len(server.received) == 1
    rec = server.received[0]
    assert rec.path == "/api/v1/incidents"
    assert rec.headers["content-encoding"] == "gzip"
    assert rec.headers["content-type"] == "application/json"
    assert rec.headers["authorization"] == "Bearer s3cret"
    b = _validated(rec.bundle)
    assert rec.headers["idempotency-key"] == str(b.incident_id)
    assert r.triage_lines() == [
        f"oom-triage: incident {b.incident_id}: verdict tensor_leak; ticket {server.url}/tickets/{str(b.incident_id)[:8]}"
    ]
    assert spooled(spool) == []


def _raise_to_exit(r: Run) -> float:
    return r.ended_at - float(r.marker("RAISE_AT") or "nan")


def test_a_slow_service_delays_the_crash_by_no_more_than_the_budget(
    pth_dir: Path, tmp_path: Path, baseline_oom: Run
) -> None:
    srv = TriageServer(mode="slow", delay=20).start()
    try:
        spool = tmp_path / "spool"
        budget = 1.5
        r = run_script(
            subprocess_env(pth_dir, url=srv.url, spool=spool, extra={"TRIAGE_SEND_BUDGET": str(budget)}),
            "oom",
        )
        assert r.returncode == 1
        # from the raise to the exit, against the same crash without the collector (printing the
        # traceback and tearing torch down take their own time either way)
        added = _raise_to_exit(r) - _raise_to_exit(baseline_oom)
        assert added <= budget + 0.75, (added, r.stderr)
        assert len(srv.received) == 1  # it was sent; the answer came too late
        assert len(spooled(spool)) == 1  # so it stays spooled (the service dedupes the later resend)
    finally:
        srv.stop()


def test_an_unwritable_spool_still_exits_normally_with_one_warning(
    pth_dir: Path, tmp_path: Path, server: TriageServer, baseline_oom: Run
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    r = run_script(subprocess_env(pth_dir, url=server.url, spool=blocker / "spool"), "oom")
    assert r.returncode == 1
    assert r.stderr_without_triage() == baseline_oom.stderr.rstrip("\n")
    warnings = [ln for ln in r.triage_lines() if "cannot write to the spool" in ln]
    assert len(warnings) == 1, r.stderr
    assert "Traceback" not in r.stderr.split("torch.OutOfMemoryError")[-1]
    assert len(server.received) == 1  # sent straight from memory instead
    _validated(server.received[0].bundle)


def test_a_dataloader_worker_killed_by_a_bus_error_is_reported_once_by_the_main_process(
    pth_dir: Path, tmp_path: Path, server: TriageServer
) -> None:
    r = run_script(
        subprocess_env(pth_dir, url=server.url, spool=tmp_path / "spool", scenario="gpu_quota"), "shm"
    )
    assert r.returncode == 1
    # torch's own wording depends on a race: its SIGCHLD handler names the signal ("DataLoader worker
    # (pid N) is killed by signal: Bus error"), or the main process reads the dead worker's pipe first
    # (ConnectionResetError); the collector must report both as the shared-memory failure they are
    assert ("DataLoader worker (pid" in r.stderr and "bus error" in r.stderr.lower()) or (
        "ConnectionResetError" in r.stderr
    )
    assert r.marker("CHILD_EXIT") == "1"  # the forked child's OOM was its own business: not reported
    assert len(server.received) == 1, [x.bundle["kind"] for x in server.received]
    b = _validated(server.received[0].bundle)
    assert b.kind == "shm_exhausted"
    # torch words it "killed by signal: Bus error" or, when it notices the dead worker first, "exited
    # unexpectedly"; either way the worker's exit signal is in the bundle
    assert b.error is not None and (
        (b.error.type == "RuntimeError" and "DataLoader worker" in (b.error.message or ""))
        or b.error.type == "ConnectionResetError"
    )
    dead = server.received[0].bundle["host"]["dead_dataloader_workers"]
    assert [d["signal"] for d in dead] == ["SIGBUS"]
    assert b.snapshot is None  # a host-side failure: no GPU snapshot
    assert b.host is not None and b.host.dataloader_workers == 2 and b.host.shm_total_bytes
    assert b.workload is not None and b.workload.batch_size == 8


def test_an_oom_in_a_thread_is_reported_and_the_process_goes_on(
    pth_dir: Path, tmp_path: Path, server: TriageServer
) -> None:
    r = run_script(
        subprocess_env(pth_dir, url=server.url, spool=tmp_path / "spool", scenario="gpu_quota"), "thread"
    )
    assert r.returncode == 0
    assert "MAIN_CONTINUES" in r.stdout
    assert "Exception in thread prefetch-gpu" in r.stderr and "torch.OutOfMemoryError" in r.stderr
    assert len(server.received) == 1
    b = _validated(server.received[0].bundle)
    assert b.error is not None and b.error.thread == "prefetch-gpu" and b.error.exit_code is None


def test_without_triage_url_nothing_is_installed(pth_dir: Path) -> None:
    r = run_script(subprocess_env(pth_dir, url=None, scenario=None), "check-nothing")
    assert r.returncode == 0, r.stderr
    assert r.marker("PROBLEMS") == ""
    assert r.stderr == ""


def test_a_cpu_build_stays_inert_with_one_line(pth_dir: Path, tmp_path: Path, server: TriageServer) -> None:
    spool = tmp_path / "spool"
    r = run_script(subprocess_env(pth_dir, url=server.url, scenario=None, spool=spool), "check-inert")
    assert r.returncode == 1
    assert r.marker("PROBLEMS") == ""  # hooks handed back, no optimizer hook, no DataLoader probe
    lines = r.triage_lines()
    assert len(lines) == 1 and "no CUDA support" in lines[0], r.stderr
    assert r.stderr.count("Traceback") == 1 and "torch.OutOfMemoryError: CUDA out of memory" in r.stderr
    assert spooled(spool) == [] and server.received == []


def test_triage_run_activates_the_collector_and_keeps_the_exit_code(pth_dir: Path, tmp_path: Path) -> None:
    env = subprocess_env(pth_dir, url=None, scenario=None)
    env.pop("OOMT_PTH_DIR")  # only triage-run's own activation, no .pth
    r = run_script(
        env,
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--spool",
        str(tmp_path / "spool"),
        "--",
        sys.executable,
        str(TRAIN),
        "check-inert",
        argv0=[sys.executable, "-m", "collector.run"],
    )
    assert r.returncode == 1  # the script's own exit code
    lines = r.triage_lines()
    assert len(lines) == 1 and "no CUDA support" in lines[0], r.stderr  # the collector ran in the child
    assert "torch.OutOfMemoryError" in r.stderr


def test_under_torchrun_each_rank_reports_its_own_oom(
    pth_dir: Path, tmp_path: Path, server: TriageServer
) -> None:
    env = subprocess_env(
        pth_dir,
        url=server.url,
        spool=tmp_path / "spool",
        scenario="gpu_quota",
        extra={"TRIAGE_SEND_BUDGET": "3"},
    )
    r = run_script(
        env,
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=0",
        str(TRAIN),
        "torchrun",
        argv0=[sys.executable, "-m", "torch.distributed.run"],
        timeout=120,
    )
    assert r.returncode != 0
    bundles = [_validated(x.bundle) for x in server.received]
    ranks = sorted(
        (b.workload.rank, b.workload.local_rank, b.workload.world_size) for b in bundles if b.workload
    )
    assert ranks == [(0, 0, 2), (1, 1, 2)], r.stderr[-3000:]
    assert len({b.incident_id for b in bundles}) == 2
    assert all(b.kind == "cuda_oom" for b in bundles)
    # rank 1 ran one step longer before its OOM (see train.py)
    steps = {b.workload.rank: b.workload.step for b in bundles if b.workload}
    assert steps == {0: 2, 1: 3}


def test_triage_flush_sends_what_is_spooled(tmp_path: Path, server: TriageServer) -> None:
    from collector import _encode, _spool

    spool = _spool.Spool(str(tmp_path / "spool"))
    ids = ["11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"]
    for iid in ids:
        head = {
            "schema": "oom-triage/incident@1",
            "incident_id": iid,
            "occurred_at": "2025-01-01T00:00:00+00:00",
            "kind": "cuda_oom",
        }
        spool.write(
            iid, lambda f, h=head: _encode.write_bundle(f, h, None, lambda: {"collector": {"version": "t"}})
        )
    cmd = [sys.executable, "-m", "triage.cli", "flush", "--spool", spool.path, "--url", server.url]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(server.ids()) == ids
    assert spool.pending() == []
    assert p.stdout.count("delivered") == 2
    assert time.monotonic() - t0 < 30

    server.mode = "reject"
    spool.write(ids[0], lambda f: _encode.write_bundle(f, {"incident_id": ids[0]}, None, lambda: {}))
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 1
    assert "rejected" in p.stdout
    rejected = Path(spool.path) / "rejected"
    assert (rejected / f"{ids[0]}.json.gz").exists()
    assert "HTTP 400" in (rejected / f"{ids[0]}.reason.txt").read_text()
