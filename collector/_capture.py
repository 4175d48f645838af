"""At the crash: decide whether it is ours to report, build the bundle, spool it, hand it to the sender."""

from __future__ import annotations

import io
import os
import re
import time
import traceback
import uuid
from datetime import UTC, datetime
from typing import Any

from collector import _encode, _host, _log, _nvml, _send, _spool, _torch
from collector._state import STATE, State

SCHEMA = "oom-triage/incident@1"
TRACEBACK_MAX_CHARS = 200_000
RECENT_OOM_S = 120.0  # an exception this soon after the observer fired is taken to be that OOM

_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|Allocation was preemptively rejected|NVML_SUCCESS == r INTERNAL ASSERT FAILED.*CUDACachingAllocator"
    r"|\] Device \d+ OOM",
    re.S,
)
_SHM = re.compile(
    r"unable to write to file </torch_|killed by signal: Bus error|insufficient shared memory"
    r"|unable to (?:open|mmap|allocate) shared memory|/dev/shm.*No space left on device"
    r"|No space left on device \(28\)"
)
_HOST_OOM = re.compile(
    r"DefaultCPUAllocator: can't allocate memory|killed by signal: Killed|Cannot allocate memory \(12\)"
)
_WORKER_DIED = re.compile(r"DataLoader worker \(pid\(s\)? [\d, ]+\) exited unexpectedly")


def type_name(t: type) -> str:
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def _chain(exc: BaseException, limit: int = 16) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < limit and all(cur is not e for e in out):
        out.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return out


def classify(exc: BaseException, st: State) -> tuple[str, BaseException] | None:
    """(kind, the exception in the chain that shows it), or None when this crash is not ours."""
    torch = _torch.torch_module()
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    chain = _chain(exc)
    for e in chain:
        if oom_type is not None and isinstance(e, oom_type):
            return "cuda_oom", e
    for e in chain:
        if not isinstance(e, (RuntimeError, OSError, MemoryError)):
            continue  # e.g. torchrun's ChildFailedError quotes a rank's OOM: that rank reports it
        text = str(e)
        if _CUDA_OOM.search(text):
            return "cuda_oom", e
        if _SHM.search(text):
            return "shm_exhausted", e
        if isinstance(e, MemoryError) or _HOST_OOM.search(text):
            return "host_oom", e
    if st.oom_events and time.monotonic() - st.oom_events[-1]["mono"] < RECENT_OOM_S:
        return "cuda_oom", exc  # a framework wrapped the OOM into its own exception
    for e in chain:
        if isinstance(e, RuntimeError) and _WORKER_DIED.search(str(e)):
            # torch saw the worker vanish before its SIGCHLD handler named the signal: ask the workers
            signals = {w.get("signal") for w in dead_workers(exc)}
            if "SIGBUS" in signals:
                return "shm_exhausted", e
            if "SIGKILL" in signals:
                return "host_oom", e
            return "crash", e
    for e in chain:
        if isinstance(e, ConnectionResetError | EOFError | BrokenPipeError):
            # the main process read from a worker's pipe as the worker died: no torch message at all
            signals = {w.get("signal") for w in dead_workers(exc)}
            if "SIGBUS" in signals:
                return "shm_exhausted", e
            if "SIGKILL" in signals:
                return "host_oom", e
    return None


def dead_workers(exc: BaseException) -> list[dict[str, Any]]:
    """DataLoader workers that died, with their exit signal, from the frames of the DataLoader code in
    the traceback (``failed_workers`` in ``_try_get_data``, else the iterator's ``_workers``)."""
    import signal

    seen: dict[int, dict[str, Any]] = {}
    for e in _chain(exc):
        for frame in _torch.traceback_frames(e):
            try:
                loc = frame.f_locals
            except Exception:
                continue
            workers = loc.get("failed_workers")
            if not isinstance(workers, list):
                workers = getattr(loc.get("self"), "_workers", None)
            if not isinstance(workers, list):
                continue
            for w in workers[:256]:
                code = getattr(w, "exitcode", None)
                pid = getattr(w, "pid", None)
                if isinstance(code, int) and isinstance(pid, int) and code != 0 and pid not in seen:
                    info: dict[str, Any] = {"pid": pid, "exitcode": code}
                    if code < 0:
                        try:
                            info["signal"] = signal.Signals(-code).name
                        except ValueError:
                            pass
                    seen[pid] = info
    return list(seen.values())


def _traceback_text(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = f"{type_name(type(exc))}: {exc}\n"
    if len(text) > TRACEBACK_MAX_CHARS:
        half = TRACEBACK_MAX_CHARS // 2
        text = text[:half] + f"\n… {len(text) - 2 * half} characters left out …\n" + text[-half:]
    return text


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def build(
    exc: BaseException, kind: str, shown: BaseException, *, thread: str | None, exit_code: int | None
) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """(head, snapshot, collector info) of the bundle. Every section is best effort."""
    st = STATE
    cfg = st.config
    torch = _torch.torch_module()
    ev = st.oom_events[-1] if st.oom_events else None
    recent = ev is not None and time.monotonic() - ev["mono"] < RECENT_OOM_S
    head: dict[str, Any] = {
        "schema": SCHEMA,
        "incident_id": str(uuid.uuid4()),
        "occurred_at": _iso(ev["time"] if recent and ev is not None and kind == "cuda_oom" else time.time()),
        "kind": kind,
    }
    head["error"] = {
        "type": type_name(type(shown)),
        "message": str(shown)[:TRACEBACK_MAX_CHARS],
        "traceback": _traceback_text(exc),
        "exit_code": exit_code,
        "thread": thread,
    }
    workload: dict[str, Any] = {}
    try:
        workload = _host.workload()
    except Exception as e:
        _log.debug(f"workload: {e!r}")
    if torch is not None:
        try:
            _torch.probe_frames(st, _torch.traceback_frames(exc))  # the failing step's batch
        except Exception:
            pass
    pid = os.getpid()
    workload.update(step=st.step or None, batch_size=st.batch_size(), pid=pid)
    try:
        workload["pids"] = sorted({pid, os.getppid(), *_host.child_pids(pid)})
    except Exception:
        workload["pids"] = [pid]
    head["workload"] = workload

    device: dict[str, Any] = {}
    allocator: dict[str, Any] = {}
    env = _host.environment()
    snap: Any = None
    snapshot_ms = None
    snapshot_at = None
    if torch is not None:
        env["torch_version"] = str(getattr(torch, "__version__", "")) or None
        env["cuda_version"] = getattr(getattr(torch, "version", None), "cuda", None)
        if _torch.cuda_up(torch):
            index = ev["device"] if recent and ev is not None else None
            device, allocator = _torch.device_facts(torch, index)
            if kind == "cuda_oom":
                if recent and ev is not None and ev.get("snapshot") is not None:
                    snap, snapshot_ms, snapshot_at = ev["snapshot"], ev.get("snapshot_ms"), "oom"
                else:
                    snap, snapshot_ms = _torch.snapshot(torch)
                    snapshot_at = "capture"
    try:
        nv = _nvml.facts(device.get("uuid"), device.get("index"))
    except Exception:
        nv = {}
    driver = nv.pop("driver_version", None)
    if driver:
        env["driver_version"] = driver
    for k, v in nv.items():
        if v is not None:
            device[k] = v
    if recent and ev is not None:
        allocator["observer"] = {
            k: ev[k] for k in ("device", "alloc_size", "device_total_or_cap", "device_free")
        }
    settings = snap.get("allocator_settings") if isinstance(snap, dict) else None
    allocator["settings"] = (
        settings
        if isinstance(settings, dict)
        else _host.alloc_conf_settings(
            os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
        )
    )
    head["device"] = device or None
    head["allocator"] = allocator
    head["timeline"] = [
        {
            "step": s[0],
            "allocated_bytes": s[1],
            "reserved_bytes": s[2],
            "peak_allocated_bytes": s[3],
            "time_us": s[4],
            "batch_size": s[5],
            "device": s[6] if len(s) > 6 else None,
        }
        for s in list(st.timeline)
    ]
    try:
        head["host"] = _host.host(st.dataloader_workers)
        dead = dead_workers(exc) if kind != "cuda_oom" else []
        if dead:
            head["host"]["dead_dataloader_workers"] = dead
    except Exception:
        head["host"] = None
    head["environment"] = env
    info: dict[str, Any] = {
        "version": _version(),
        "history_max_entries": st.history_max_entries,
        "history_by_user": st.history_by_user or None,
        "snapshot_ms": None if snapshot_ms is None else round(snapshot_ms, 1),
        "snapshot_at": snapshot_at if snap is not None else None,
        "observer_calls": ev["calls"] if recent and ev is not None else None,
        "peak_scope": "step" if st.peak_reset else "run",
        "spool": cfg.spool if cfg else None,
    }
    return head, snap, info


def _version() -> str:
    from collector import __version__

    return __version__


def capture(
    exc: BaseException, *, source: str, thread: str | None = None, exit_code: int | None = None
) -> None:
    """Report ``exc`` if it is an OOM/shm/host-memory crash of this process. Never raises."""
    st = STATE
    try:
        if not st.owns_process() or st.config is None:
            return
        with st.lock:
            if id(exc) in st.captured_ids:
                return
            st.captured_ids.add(id(exc))
        torch = _torch.torch_module()
        if st.mp_child and torch is not None and _torch.in_dataloader_worker(torch):
            return  # DataLoader workers never report: the main process sees their failure
        found = classify(exc, st)
        if found is None:
            return
        kind, shown = found
        with st.lock:
            if st.captures >= _config_max_captures():
                _log.say_once(
                    "max-captures", "already reported the maximum number of incidents for this process"
                )
                return
            st.captures += 1
        _capture(exc, kind, shown, source=source, thread=thread, exit_code=exit_code, pid=os.getpid())
    except Exception as e:  # the collector must never raise into the training process
        try:
            _log.say(f"capture failed ({type(e).__name__}: {e}); the crash itself is unaffected")
        except Exception:
            pass


def _config_max_captures() -> int:
    from collector._config import MAX_CAPTURES_PER_PROCESS

    return MAX_CAPTURES_PER_PROCESS


def _capture(
    exc: BaseException,
    kind: str,
    shown: BaseException,
    *,
    source: str,
    thread: str | None,
    exit_code: int | None,
    pid: int,
) -> None:
    st = STATE
    cfg = st.config
    assert cfg is not None
    t0 = time.monotonic()
    deadline = t0 + cfg.send_budget
    st.crash_deadline = max(st.crash_deadline, deadline)
    head, snap, info = build(exc, kind, shown, thread=thread, exit_code=exit_code)
    iid = head["incident_id"]
    info["source"] = source

    def tail() -> dict[str, Any]:
        info["capture_ms"] = round((time.monotonic() - t0) * 1000, 1)
        return {"collector": info}

    spool = _spool.Spool(cfg.spool, cfg.spool_max_bytes)
    path: str | None = None
    try:
        path = spool.write(iid, lambda f: _encode.write_bundle(f, head, snap, tail))
    except Exception as e:
        _log.say(
            f"cannot write to the spool {cfg.spool} ({type(e).__name__}: {e}); sending incident {iid} directly"
        )
    _log.debug(f"{kind} incident {iid} captured in {(time.monotonic() - t0) * 1000:.0f} ms ({source})")
    if cfg.url is None:
        if path is not None:
            _log.say(
                f"incident {iid} ({kind}) spooled to {path}; no TRIAGE_URL: send it with `triage flush --url …`"
            )
        return
    sender = st.sender
    if sender is None:
        sender = st.sender = _send.Sender(cfg.url, cfg.token)
    if path is not None:
        sender.submit_path(spool, path, deadline)
        return
    buf = io.BytesIO()
    _encode.write_bundle(buf, head, snap, tail)
    sender.submit_body(iid, buf.getvalue(), deadline)
