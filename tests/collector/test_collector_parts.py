"""The collector's parts in-process: public API, encoding, spool, delivery, host facts, classification."""

from __future__ import annotations

import gzip
import inspect
import io
import json
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

import collector
from collector import _capture, _config, _encode, _host, _send, _spool, _torch
from collector._state import State
from tests.collector.collector_harness import TriageServer, free_port

# --- public API ---------------------------------------------------------------------------------------


def test_public_api_is_small_and_pinned() -> None:
    assert collector.__all__ == ["flush", "install", "set_batch_size", "step"]
    assert str(inspect.signature(collector.install)) == (
        "(url: 'str | None' = None, *, token: 'str | None' = None, spool: 'str | None' = None, "
        "send_budget: 'float | None' = None, history: 'bool | None' = None, "
        "history_max_entries: 'int | None' = None) -> 'bool'"
    )
    assert str(inspect.signature(collector.set_batch_size)) == "(n: 'int | None') -> 'None'"
    assert str(inspect.signature(collector.step)) == "(n: 'int | None' = None) -> 'None'"
    assert str(inspect.signature(collector.flush)) == "(timeout: 'float | None' = None) -> 'bool'"


def test_the_collector_never_imports_the_server_side() -> None:
    root = Path(collector.__file__).parent
    banned = ("triage", "fastapi", "pydantic", "sqlalchemy", "jinja2", "requests", "httpx", "rich")
    for py in root.rglob("*.py"):
        for line in py.read_text().splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")):
                mod = s.split()[1].split(".")[0]
                assert mod not in banned, f"{py}: {s}"


# --- encoding -----------------------------------------------------------------------------------------


def _snapshot_like() -> dict[str, Any]:
    fa = {"name": "forward", "filename": "/w/model.py", "line": 10}
    fb = {"name": "<module>", "filename": "/w/train.py", "line": 3}
    shared = [fa, fb]
    return {
        "segments": [
            {
                "device": 0,
                "address": 1 << 40,
                "total_size": 2 << 20,
                "segment_pool_id": (0, 0),  # tuples become lists
                "frames": shared,
                "blocks": [
                    {
                        "address": 1 << 40,
                        "size": 1024,
                        "requested_size": 1000,
                        "state": "active_allocated",
                        "frames": shared,
                    },
                    {
                        "size": 512,
                        "requested_size": 512,
                        "state": "inactive",
                        "history": [{"addr": 1, "real_size": 512, "frames": [fb]}],
                    },
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": 1, "size": 1000, "frames": shared, "user_metadata": "\x01 0\x01"},
                {
                    "action": "free_requested",
                    "addr": 1,
                    "size": 1000,
                    "frames": list(shared),
                },  # equal, not shared
                {"action": "oom", "device_free": 3, "size": 2 << 20, "frames": []},
                {"action": "snapshot", "addr": 0, "size": 0},
            ]
        ],
        "allocator_settings": {"expandable_segments": False, "weird": object()},
    }


def test_snapshot_encoding_is_plain_json_of_the_snapshot() -> None:
    snap = _snapshot_like()
    expected = json.loads(json.dumps(_snapshot_like(), default=str))
    expected["allocator_settings"]["weird"] = str(snap["allocator_settings"]["weird"])
    text = "".join(_encode.snapshot_pieces(snap))
    assert json.loads(text) == expected


def test_gzip_writer_makes_one_ordinary_gzip_member_across_threads() -> None:
    text = "".join(f'{{"i":{i},"s":"{"x" * (i % 50)}"}},' for i in range(60_000))
    out = io.BytesIO()
    w = _encode.GzipWriter(out, threads=3, chunk=64 << 10)
    for i in range(0, len(text), 7000):
        w.write(text[i : i + 7000])
    w.close()
    data = out.getvalue()
    assert gzip.decompress(data).decode() == text
    d = zlib.decompressobj(31)  # a single-member reader sees the whole text, nothing left over
    assert d.decompress(data).decode() == text and d.eof and d.unused_data == b""


def test_write_bundle_puts_the_snapshot_and_the_late_tail_in_one_object() -> None:
    out = io.BytesIO()
    _encode.write_bundle(
        out, {"schema": "s", "kind": "cuda_oom"}, _snapshot_like(), lambda: {"collector": {"capture_ms": 1.5}}
    )
    b = json.loads(gzip.decompress(out.getvalue()))
    assert list(b) == ["schema", "kind", "snapshot", "collector"]
    assert b["collector"]["capture_ms"] == 1.5 and b["snapshot"]["segments"][0]["segment_pool_id"] == [0, 0]
    out = io.BytesIO()
    _encode.write_bundle(out, {}, None, lambda: {})
    assert json.loads(gzip.decompress(out.getvalue())) == {"snapshot": None}


# --- spool --------------------------------------------------------------------------------------------


def _fill(text: str) -> Any:
    return lambda f: f.write(gzip.compress(text.encode()))


def test_spool_writes_atomically_and_one_sender_holds_a_bundle(tmp_path: Path) -> None:
    sp = _spool.Spool(str(tmp_path / "spool"))
    p1 = sp.write("a", _fill("1"))
    time.sleep(0.01)
    p2 = sp.write("b", _fill("2"))
    assert sp.pending() == [p1, p2]
    assert not [n for n in os.listdir(sp.path) if n.endswith(".tmp")]
    c = sp.claim(p1)
    assert c is not None and c.incident_id == "a"
    assert sp.claim(p1) is None  # a second sender (another descriptor, as another process) is refused
    assert gzip.decompress(c.read()) == b"1"
    c.delivered()
    assert sp.pending() == [p2] and sp.claim(p1) is None
    c2 = sp.claim(p2)
    assert c2 is not None
    c2.reject("HTTP 400: no")
    assert sp.pending() == []
    assert (tmp_path / "spool" / "rejected" / "b.json.gz").exists()
    assert (tmp_path / "spool" / "rejected" / "b.reason.txt").read_text() == "HTTP 400: no\n"


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    sp = _spool.Spool(str(tmp_path))

    def boom(f: Any) -> None:
        f.write(b"partial")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        sp.write("x", boom)
    assert os.listdir(tmp_path) == []


def test_the_spool_drops_its_oldest_bundles_beyond_its_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = _spool.Spool(str(tmp_path), max_bytes=2500)
    big = os.urandom(1000)
    for name in "abcd":
        sp.write(name, lambda f: f.write(big))
        time.sleep(0.01)
    names = [os.path.basename(p) for p in sp.pending()]
    assert names == ["b.json.gz", "c.json.gz", "d.json.gz"]
    assert "dropped the oldest bundle a" in capsys.readouterr().err


# --- delivery -----------------------------------------------------------------------------------------


BODY = gzip.compress(json.dumps({"incident_id": "9b2f4f7e-0000-4000-8000-000000000001"}).encode())


def test_post_outcomes(server: TriageServer) -> None:
    out = _send.post(server.url, "t", BODY, 5)
    assert (
        out.result == _send.DELIVERED
        and out.status == 202
        and out.answer
        and out.answer["verdict"] == "tensor_leak"
    )
    again = _send.post(server.url, "t", BODY, 5)
    assert again.result == _send.DELIVERED and again.status == 200
    server.mode = "reject"
    out = _send.post(server.url, None, BODY, 5)
    assert out.result == _send.REJECTED and "HTTP 400" in out.reason
    server.mode = "error"
    assert _send.post(server.url, None, BODY, 5).result == _send.RETRY
    assert _send.post(f"http://127.0.0.1:{free_port()}", None, BODY, 5).result == _send.RETRY


def test_deliver_retries_within_its_deadline_then_gives_up(server: TriageServer) -> None:
    server.mode = "error"
    t0 = time.monotonic()
    out = _send.deliver(server.url, None, BODY, time.monotonic() + 1.2)
    took = time.monotonic() - t0
    assert out.result == _send.RETRY and took <= 1.4
    assert len(server.received) >= 3  # backoff 0.2, 0.4, … with jitter
    assert {r.body for r in server.received} == {BODY}  # the same bytes every time


def test_deliver_stops_at_success_after_failures(server: TriageServer) -> None:
    server.mode = "error"

    def heal() -> None:
        time.sleep(0.5)
        server.mode = "ok"

    threading.Thread(target=heal).start()
    out = _send.deliver(server.url, None, BODY, time.monotonic() + 5)
    assert out.result == _send.DELIVERED and len(server.received) >= 2


def test_verdict_line() -> None:
    assert (
        _send.verdict_line("x", {"verdict": "gpu_quota", "ticket_url": "http://t/1"})
        == "incident x: verdict gpu_quota; ticket http://t/1"
    )
    assert "pending" in _send.verdict_line("x", {"verdict": None, "ticket_url": None})


# --- host facts ---------------------------------------------------------------------------------------


def test_cgroup_v2_and_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory cpu\n")
    (v2 / "kubepods" / "pod1" / "memory.max").write_text("17179869184\n")
    (v2 / "kubepods" / "pod1" / "memory.current").write_text("1000\n")
    (v2 / "kubepods" / "pod1" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert _host.cgroup(str(v2), "0::/kubepods/pod1\n") == {
        "version": 2,
        "memory_limit_bytes": 17179869184,
        "memory_usage_bytes": 1000,
        "oom_kill_count": 2,
    }
    (v2 / "memory.max").write_text("max\n")  # inside a cgroup namespace: the root is the pod
    assert _host.cgroup(str(v2), "0::/\n")["memory_limit_bytes"] is None  # type: ignore[index]
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(9223372036854771712))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5\n")
    (v1 / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert _host.cgroup(str(v1), "4:memory:/\n") == {
        "version": 1,
        "memory_limit_bytes": None,
        "memory_usage_bytes": 5,
        "oom_kill_count": 1,
    }


def test_workload_identity_from_the_downward_api(tmp_path: Path) -> None:
    (tmp_path / "labels").write_text(
        'batch.kubernetes.io/job-name="llm-pretrain-7"\ncontroller-uid="abc"\nteam="nlp"\ntraining.kubeflow.org/job-name="llm-pretrain"\n'
    )
    (tmp_path / "annotations").write_text(
        'kubernetes.io/config.source="api"\noom-triage.io/team="nlp-research"\n'
    )
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "POD_NAME": "llm-pretrain-worker-3",
        "POD_NAMESPACE": "ml",
        "NODE_NAME": "gpu-node-17",
        "RANK": "3",
        "LOCAL_RANK": "3",
        "WORLD_SIZE": "16",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    w = _host.workload(env, str(tmp_path))
    assert (w["namespace"], w["pod"], w["node"]) == ("ml", "llm-pretrain-worker-3", "gpu-node-17")
    assert (w["job"], w["owner_kind"], w["owner_name"]) == ("llm-pretrain", "PyTorchJob", "llm-pretrain")
    assert w["team"] == "nlp-research"
    assert (w["rank"], w["local_rank"], w["world_size"], w["restart_count"]) == (3, 3, 16, 1)
    assert w["labels"]["controller-uid"] == "abc"


def test_alloc_conf_settings() -> None:
    s = _host.alloc_conf_settings("expandable_segments:True,max_split_size_mb:512")
    assert s == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
        "expandable_segments": "True",
        "max_split_size_mb": "512",
    }


def test_shm_and_processes() -> None:
    s = _host.shm()
    assert s["shm_total_bytes"] >= s["shm_used_bytes"] >= 0
    assert _host.rss_bytes()
    assert os.getpid() in _host.child_pids(os.getppid())


# --- classification -----------------------------------------------------------------------------------


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (
            RuntimeError(
                "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity; …)"
            ),
            "cuda_oom",
        ),
        (
            RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
            "cuda_oom",
        ),
        (
            RuntimeError(
                'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":1127'
            ),
            "cuda_oom",
        ),
        (
            RuntimeError("unable to write to file </torch_6310_2947356098_0>: No space left on device (28)"),
            "shm_exhausted",
        ),
        (
            RuntimeError(
                "DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that …"
            ),
            "shm_exhausted",
        ),
        (RuntimeError("DataLoader worker (pid 77) is killed by signal: Killed."), "host_oom"),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory"
            ),
            "host_oom",
        ),
        (MemoryError(), "host_oom"),
        (RuntimeError("DataLoader worker (pid(s) 12, 13) exited unexpectedly"), "crash"),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), None),
        (ValueError("CUDA out of memory"), None),  # not an error type torch raises for it
        (KeyboardInterrupt(), None),
    ],
)
def test_classify(exc: BaseException, kind: str | None) -> None:
    found = _capture.classify(_raised(exc), State())
    assert (found[0] if found else None) == kind


def test_classify_follows_the_chain_and_a_recent_observer_call() -> None:
    import torch

    wrapped = _raised(
        RuntimeError("step failed"), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
    )
    found = _capture.classify(wrapped, State())
    assert found is not None and found[0] == "cuda_oom" and isinstance(found[1], torch.OutOfMemoryError)

    class TrainerError(Exception):
        pass

    st = State()
    assert _capture.classify(_raised(TrainerError("rank 3 failed")), st) is None
    st.oom_events.append({"mono": time.monotonic(), "device": 0})
    found = _capture.classify(_raised(TrainerError("rank 3 failed")), st)
    assert found is not None and found[0] == "cuda_oom"


def test_the_observer_snapshots_the_allocator_at_the_oom_within_its_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside the observer the failing step's tensors are still allocated; at the crash they are not. The
    observer takes the snapshot, at most OOM_SNAPSHOTS_MAX per process and OOM_SNAPSHOT_MIN_GAP_S apart
    (OOMs that are caught and survived must not cost a snapshot each), only the latest event keeps one,
    and the next optimizer step (the job went on) lets it go."""
    import types

    taken: list[int] = []

    def fake_snapshot(torch: Any) -> tuple[dict[str, Any], float]:
        taken.append(1)
        return {"segments": [], "n": len(taken)}, 12.5

    clock = [1000.0]
    monkeypatch.setattr(_torch, "snapshot", fake_snapshot)
    monkeypatch.setattr(_torch, "torch_module", lambda: types.SimpleNamespace())
    monkeypatch.setattr(_torch.time, "monotonic", lambda: clock[0])
    st = State()
    st.active = True
    st.config, _ = _config.load({})
    monkeypatch.setattr(_torch, "STATE", st)

    _torch._observer(0, 2 << 20, 80 << 30, 1 << 20)
    _torch._observer(0, 2 << 20, 80 << 30, 1 << 20)  # the allocator's second call for the same OOM
    assert len(taken) == 1 and st.oom_events[-1]["snapshot"]["n"] == 1 and st.oom_events[-1]["calls"] == 2
    clock[0] += 5  # another OOM, too soon: recorded, no snapshot; the earlier one keeps its own
    _torch._observer(0, 4 << 20, 80 << 30, 1 << 20)
    assert len(taken) == 1 and "snapshot" not in st.oom_events[-1] and "snapshot" in st.oom_events[0]
    for k in range(4):
        clock[0] += _torch.OOM_SNAPSHOT_MIN_GAP_S + 1
        _torch._observer(0, (8 + k) << 20, 80 << 30, 1 << 20)
    assert len(taken) == _torch.OOM_SNAPSHOTS_MAX
    assert [("snapshot" in e) for e in st.oom_events] == [False, False, False, True, False, False]
    _torch._on_optimizer_step(object(), (), {})  # survived: nothing held any more
    assert not any("snapshot" in e for e in st.oom_events)
    # without the history (TRIAGE_HISTORY=0) the snapshot has no trace to roll a late one back with: the
    # observer's is the only one that shows the OOM, and it is cheap
    st2 = State()
    st2.active, st2.config = True, _config.load({"TRIAGE_HISTORY": "0"})[0]
    monkeypatch.setattr(_torch, "STATE", st2)
    clock[0] += 1000
    _torch._observer(0, 2 << 20, 80 << 30, 1 << 20)
    assert len(taken) == _torch.OOM_SNAPSHOTS_MAX + 1 and "snapshot" in st2.oom_events[-1]


def test_type_name() -> None:
    import torch

    assert _capture.type_name(torch.OutOfMemoryError) == "torch.OutOfMemoryError"
    assert _capture.type_name(RuntimeError) == "RuntimeError"


# --- torch helpers ------------------------------------------------------------------------------------


def test_leading_dim_and_the_loop_frame_probe() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    assert _torch.leading_dim(torch.zeros(7, 3)) == 7
    assert _torch.leading_dim({"input_ids": torch.zeros(5, 9), "labels": torch.zeros(5)}) == 5
    assert _torch.leading_dim([(torch.zeros(()), torch.zeros(4, 2))]) == 4
    assert _torch.leading_dim("text") is None

    st = State()
    loader = DataLoader(TensorDataset(torch.zeros(40, 2)), batch_size=12, num_workers=0)
    batch = next(iter(loader))
    _torch.probe_frames(st, [inspect.currentframe()])
    assert (st.loader_batch_size, st.dataloader_workers, st.leading_dim_batch_size) == (12, 0, 12)
    assert batch[0].shape[0] == 12


def test_a_batch_size_schedule_is_followed_to_the_failing_step() -> None:
    """Without a DataLoader the batch is read from the loop's locals. The function that gave it at the
    first probe gives it at every later one and at the OOM (whose traceback runs outermost first), so a
    step at a larger batch than the last probe saw is reported with its own batch."""
    import torch

    st = State()

    def step_hook() -> None:  # what the optimizer hook sees: innermost first, the loop's frame among them
        _torch.probe_frames(st, _torch._caller_frames(2))

    def forward(x: Any) -> Any:
        h = torch.zeros(x.shape[0] * 4, 8)  # an activation: its leading dimension is not the batch
        if x.shape[0] > 30:
            raise RuntimeError("CUDA out of memory.")
        return h

    def train(schedule: list[int]) -> None:
        for n in schedule:
            batch = torch.zeros(n, 3)
            forward(batch)
            step_hook()

    seen: list[int | None] = []
    try:
        for n in (20, 24):
            train([n])
            seen.append(st.leading_dim_batch_size)
        train([107])
    except RuntimeError as e:
        _torch.probe_frames(st, _torch.traceback_frames(e))
    assert seen == [20, 24] and st.leading_dim_batch_size == 107 and st.batch_size() == 107


def test_config_falls_back_on_malformed_values() -> None:
    cfg, complaints = _config.load(
        {
            "TRIAGE_URL": " http://svc:8080/ ",
            "TRIAGE_SEND_BUDGET": "soon",
            "TRIAGE_HISTORY_MAX_ENTRIES": "-5",
            "TRIAGE_HISTORY": "off",
        }
    )
    assert cfg.url == "http://svc:8080" and cfg.send_budget == 5.0 and cfg.history_max_entries == 100_000
    assert cfg.history is False and len(complaints) == 2
    cfg, _ = _config.load({}, url="http://x", send_budget=1.0, history_max_entries=10)
    assert (cfg.url, cfg.send_budget, cfg.history_max_entries, cfg.token) == ("http://x", 1.0, 10, None)
    assert _config.disabled({"TRIAGE_DISABLE": "1"}) and not _config.disabled({})


def test_a_pipe_reset_by_a_worker_killed_by_sigbus_is_shared_memory(monkeypatch: Any) -> None:
    """When the main process reads a dead worker's pipe before torch names the signal, the only trace is
    a ConnectionResetError: the workers' exit signals decide (SIGBUS: /dev/shm; SIGKILL: host memory)."""
    exc = _raised(ConnectionResetError(104, "Connection reset by peer"))
    monkeypatch.setattr(_capture, "dead_workers", lambda _e: [{"pid": 7, "signal": "SIGBUS"}])
    found = _capture.classify(exc, State())
    assert found is not None and found[0] == "shm_exhausted"
    monkeypatch.setattr(_capture, "dead_workers", lambda _e: [{"pid": 7, "signal": "SIGKILL"}])
    found = _capture.classify(exc, State())
    assert found is not None and found[0] == "host_oom"
    monkeypatch.setattr(_capture, "dead_workers", lambda _e: [])
    assert _capture.classify(exc, State()) is None  # an ordinary network error is not ours


def test_the_caller_of_set_per_process_memory_fraction_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap the job's code set on itself is its own limit, not the platform's: the collector wraps the
    setter (under ``torch.cuda`` and ``torch.cuda.memory``, the same function), notes its caller's file and
    line, passes the call through unchanged, and reports the caller beside the cap."""
    import inspect
    import types

    calls: list[tuple[float, Any]] = []

    def original(fraction: float, device: Any = None) -> None:
        calls.append((fraction, device))

    memory = types.SimpleNamespace(set_per_process_memory_fraction=original)
    cuda = types.SimpleNamespace(
        set_per_process_memory_fraction=original,
        memory=memory,
        get_per_process_memory_fraction=lambda idx: 0.4,
        mem_get_info=lambda idx: (10 << 30, 80 << 30),
    )
    fake = types.SimpleNamespace(cuda=cuda)
    st = State()
    st.active = True
    monkeypatch.setattr(_torch, "STATE", st)
    _torch._wrap_fraction_setter(fake)
    _torch._wrap_fraction_setter(fake)  # armed twice: wrapped once
    assert cuda.set_per_process_memory_fraction is memory.set_per_process_memory_fraction
    assert cuda.set_per_process_memory_fraction is not original
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    fake.cuda.set_per_process_memory_fraction(0.4, 0)
    assert calls == [(0.4, 0)]
    assert st.fraction_set_by == {
        "fraction": 0.4,
        "device": 0,
        "filename": __file__,
        "line": line,
        "function": "test_the_caller_of_set_per_process_memory_fraction_is_noted",
    }
    _, alloc = _torch.device_facts(fake, 0)
    assert alloc["fraction"] == 0.4 and alloc["fraction_cap_bytes"] == int(0.4 * (80 << 30))
    assert alloc["fraction_set_by"]["line"] == line
    _, other = _torch.device_facts(fake, 1)  # a cap on device 0 says nothing of device 1's
    assert "fraction_set_by" not in other
