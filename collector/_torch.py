"""Everything that touches torch. Imported only once torch itself is (never imports it first).

The collector never initialises CUDA: the history and the OOM observer are set up from a call queued
with ``torch.cuda._lazy_call``, which torch runs inside its own lazy initialisation, i.e. when the
training code first uses the GPU (so ``CUDA_VISIBLE_DEVICES`` set by the script, fork-based workers and
``mp.spawn`` all behave exactly as without the collector). Both must happen after that initialisation
anyway: the allocator's per-device state, where the observer and the history live, only exists then.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from collector import _log
from collector._state import STATE, State

OOM_DEDUPE_WINDOW_S = 1.0  # the allocator may call the observer several times for one OOM
# The snapshot is taken inside the observer: the allocator's state at the OOM, before the exception unwinds
# the failing step and frees its tensors (a snapshot taken at the crash shows the holes they left). Some
# OOMs are caught and survived (cuDNN's workspace fallback, a batch-size finder), so at most this many per
# process, and not closer together than this: each costs about what ``_snapshot()`` takes (0.2 s for a
# 100,000-entry trace on an H200, tests/gpu).
OOM_SNAPSHOTS_MAX = 3
OOM_SNAPSHOT_MIN_GAP_S = 30.0


def torch_module() -> Any:
    return sys.modules.get("torch")


def cuda_capable(torch: Any) -> bool:
    """A CUDA (or ROCm) build of torch: the OOM observer exists. Never initialises CUDA."""
    return callable(getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None))


def arm(torch: Any, st: State) -> None:
    """Register the step hook now; the CUDA parts at CUDA's initialisation."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_on_optimizer_step)
    except Exception as exc:
        _log.debug(f"no optimizer step hook: {type(exc).__name__}: {exc}")
    try:
        torch.cuda._lazy_call(_on_cuda_init)
    except Exception as exc:
        _log.debug(f"could not queue the CUDA setup: {type(exc).__name__}: {exc}")
    _wrap_fraction_setter(torch)


def _wrap_fraction_setter(torch: Any) -> None:
    """Note who calls ``set_per_process_memory_fraction`` (the job's code or a platform wrapper): a cap
    the job set on itself is its own limit, not the platform's. The call itself is unchanged."""
    cuda = getattr(torch, "cuda", None)
    original = getattr(cuda, "set_per_process_memory_fraction", None)
    if not callable(original) or getattr(original, "_oom_triage_wrapped", False):
        return

    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> Any:
        _note_fraction_caller(fraction, device, sys._getframe(1))
        return original(fraction, device)

    set_per_process_memory_fraction.__doc__ = original.__doc__
    set_per_process_memory_fraction._oom_triage_wrapped = True  # type: ignore[attr-defined]
    for mod in (cuda, getattr(cuda, "memory", None)):
        if mod is not None and getattr(mod, "set_per_process_memory_fraction", None) is original:
            mod.set_per_process_memory_fraction = set_per_process_memory_fraction


def _note_fraction_caller(fraction: Any, device: Any, frame: Any) -> None:
    try:
        st = STATE
        if not st.active:
            return
        dev = getattr(device, "index", device)
        st.fraction_set_by = {
            "fraction": float(fraction),
            "device": int(dev) if isinstance(dev, int) else None,
            "filename": frame.f_code.co_filename,
            "line": int(frame.f_lineno),
            "function": frame.f_code.co_name,
        }
    except Exception:
        pass


def _on_cuda_init() -> None:
    """Runs inside torch.cuda._lazy_init (or at once if CUDA was already up). Must never raise."""
    st = STATE
    try:
        if not st.owns_process() or st.cuda_ready:
            return
        torch = torch_module()
        cfg = st.config
        if torch is None or cfg is None:
            return
        st.cuda_ready = True
        if cfg.history:
            try:
                if torch._C._cuda_isHistoryEnabled():
                    st.history_by_user = True  # the job records its own history: leave its settings alone
                else:
                    torch.cuda.memory._record_memory_history(
                        enabled="all",
                        context="all",
                        stacks=cfg.history_stacks,
                        max_entries=cfg.history_max_entries,
                    )
                    st.history_max_entries = cfg.history_max_entries
            except Exception as exc:
                _log.say_once("history", f"allocator history not enabled ({type(exc).__name__}: {exc})")
        try:
            torch._C._cuda_attach_out_of_memory_observer(_observer)
            st.observer_attached = True
        except Exception as exc:
            _log.say_once("observer", f"OOM observer not attached ({type(exc).__name__}: {exc})")
        _log.debug(f"CUDA initialised: history={st.history_max_entries} observer={st.observer_attached}")
    except Exception:
        pass


def _observer(device: int, alloc_size: int, device_total_or_cap: int, device_free: int) -> None:
    """torch's OOM observer: only records (deduplicated per device). If it raised, its exception would
    replace the OOM, so nothing may escape."""
    try:
        st = STATE
        if not st.active:
            return
        now = time.monotonic()
        last = st.last_oom_by_device.get(device)
        if last is not None and now - last["mono"] < OOM_DEDUPE_WINDOW_S:
            last["calls"] += 1
            last["mono"] = now
            return
        ev = {
            "device": int(device),
            "alloc_size": int(alloc_size),
            "device_total_or_cap": int(device_total_or_cap),
            "device_free": int(device_free),
            "time": time.time(),
            "mono": now,
            "calls": 1,
        }
        st.last_oom_by_device[device] = ev
        st.oom_events.append(ev)
        _snapshot_at_oom(st, ev, now)
    except Exception:
        pass


def _snapshot_at_oom(st: State, ev: dict[str, Any], now: float) -> None:
    """Keep the allocator's snapshot of this OOM on the event (only the latest event keeps one)."""
    if st.oom_snapshots >= OOM_SNAPSHOTS_MAX or now - st.last_oom_snapshot_mono < OOM_SNAPSHOT_MIN_GAP_S:
        return
    torch = torch_module()
    if torch is None:
        return
    st.oom_snapshots += 1
    st.last_oom_snapshot_mono = now
    if st.oom_snapshot_event is not None:
        st.oom_snapshot_event.pop("snapshot", None)
    snap, ms = snapshot(torch)
    if snap is not None:
        ev["snapshot"], ev["snapshot_ms"] = snap, ms
        st.oom_snapshot_event = ev


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global optimizer post-hook: count steps (the most-stepped optimizer's count) and sample memory."""
    st = STATE
    if st.manual_steps or not st.active:
        return
    try:
        if st.oom_snapshot_event is not None:  # the job went on after that OOM: let the memory go
            st.oom_snapshot_event.pop("snapshot", None)
            st.oom_snapshot_event = None
        k = id(optimizer)
        opt_steps = st.opt_steps
        n = opt_steps.get(k, 0) + 1
        if len(opt_steps) > 256:
            opt_steps.clear()
        opt_steps[k] = n
        if n > st.step:
            st.step = n
            if n in _PROBE_STEPS or n % _PROBE_EVERY == 0:
                probe_frames(st, _caller_frames(2))
            sample(st)
    except Exception:
        pass


def sample(st: State) -> None:
    """One timeline sample: (step, allocated, reserved, peak allocated, time_us, batch size, device)."""
    alloc = reserved = peak = dev = None
    if st.cuda_ready:
        try:
            torch = torch_module()
            dev = torch.cuda.current_device()
            s = torch.cuda.memory_stats_as_nested_dict(dev)
            if s:
                a = s["allocated_bytes"]["all"]
                alloc, peak = a["current"], a["peak"]
                reserved = s["reserved_bytes"]["all"]["current"]
                if st.peak_reset:
                    torch.cuda.reset_peak_memory_stats(dev)
        except Exception:
            pass
    st.timeline.append((st.step, alloc, reserved, peak, time.time_ns() // 1000, st.batch_size(), dev))


# --- batch size and workers from the DataLoader in use (read from the loop's frames) ------------------------------------------------


def leading_dim(data: Any, depth: int = 0) -> int | None:
    """The first dimension of the first tensor in a batch (tensor, dict, list or tuple of them)."""
    shape = getattr(data, "shape", None)
    if shape is not None and hasattr(data, "dim"):
        try:
            return int(shape[0]) if len(shape) else None
        except Exception:
            return None
    if depth >= 3:
        return None
    items: Any = None
    if isinstance(data, dict):
        items = data.values()
    elif isinstance(data, (list, tuple)):
        items = data
    if items is None:
        return None
    for i, x in enumerate(items):
        if i >= 16:
            break
        d = leading_dim(x, depth + 1)
        if d is not None:
            return d
    return None


_BATCH_NAMES = ("batch", "inputs", "input_ids", "x", "data", "images", "features", "sample", "samples")
_PROBE_STEPS = frozenset((1, 2, 3, 5, 10, 20, 50))
_PROBE_EVERY = 100
_MAX_FRAMES = 16


def _lead_in(loc: dict[str, Any], tensor_cls: Any, param_cls: Any) -> int | None:
    named = [loc[n] for n in _BATCH_NAMES if n in loc]
    for v in [*named, *loc.values()]:
        if isinstance(v, param_cls) or not isinstance(v, (tensor_cls, dict, list, tuple)):
            continue
        d = leading_dim(v)
        if d:
            return d
    return None


def probe_frames(st: State, frames: Any) -> None:
    """Batch size and DataLoader workers from the training loop's own frames (their locals): the
    DataLoader in use and the batch it yielded. Reads only; nothing is wrapped, so tracebacks and
    the data path stay exactly torch's.

    The function whose locals gave the batch once gives it at every later probe, and at the OOM (whose
    traceback holds the failing step's frames): a batch-size schedule is followed, and the failing step
    is told with its own batch, not the one the last step probe saw."""
    torch = torch_module()
    try:
        loader_cls = torch.utils.data.DataLoader
        tensor_cls = torch.Tensor
        param_cls = torch.nn.Parameter
    except Exception:
        return
    first: tuple[int, Any] | None = None  # (leading dimension, code) of the first frame with a batch
    same: int | None = None  # from the function that gave it before
    for i, f in enumerate(frames):
        if (i >= _MAX_FRAMES and (same is not None or st.batch_code is None)) or i >= 4 * _MAX_FRAMES:
            break
        try:
            loc = f.f_locals
        except Exception:
            continue
        module_level = f.f_code.co_name == "<module>"  # globals: constants, not the batch
        lead = None if module_level else _lead_in(loc, tensor_cls, param_cls)
        if lead and same is None and st.batch_code is not None and _code_id(f.f_code) == st.batch_code:
            same = lead
        if i >= _MAX_FRAMES:
            continue
        if lead and first is None:
            first = (lead, f.f_code)
        if any(isinstance(v, loader_cls) for v in list(loc.values())):
            dl = next(v for v in list(loc.values()) if isinstance(v, loader_cls))
            bs = getattr(dl, "batch_size", None)
            if not isinstance(bs, int):
                bs = getattr(getattr(dl, "batch_sampler", None), "batch_size", None)
            st.loader_batch_size = bs if isinstance(bs, int) and bs > 0 else None
            try:
                st.dataloader_workers = int(dl.num_workers)
            except Exception:
                pass
            if lead:  # the batch beside its DataLoader
                first = (lead, f.f_code)
            break
    if same is not None:
        st.leading_dim_batch_size = same
    elif first is not None and (st.leading_dim_batch_size is None or st.loader_batch_size is not None):
        st.leading_dim_batch_size = first[0]
        st.batch_code = _code_id(first[1])


def _code_id(code: Any) -> tuple[str, str, int]:
    return (code.co_filename, code.co_name, code.co_firstlineno)


def _caller_frames(depth: int) -> Any:
    f: Any = sys._getframe(depth)
    while f is not None:
        yield f
        f = f.f_back


def traceback_frames(exc: BaseException) -> list[Any]:
    """The frames of an exception's traceback, outermost first (where the training loop is)."""
    out: list[Any] = []
    tb = exc.__traceback__
    while tb is not None and len(out) < 256:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def in_dataloader_worker(torch: Any) -> bool:
    try:
        return torch.utils.data.get_worker_info() is not None
    except Exception:
        return False


# --- facts at capture time --------------------------------------------------------------------------------


def cuda_up(torch: Any) -> bool:
    try:
        return bool(STATE.cuda_ready or torch.cuda.is_initialized())
    except Exception:
        return False


def device_facts(torch: Any, index: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(device, allocator) sections from torch. Only call when CUDA is initialised."""
    dev: dict[str, Any] = {}
    alloc: dict[str, Any] = {}
    try:
        idx = int(index) if index is not None else int(torch.cuda.current_device())
    except Exception:
        return dev, alloc
    dev["index"] = idx
    try:
        p = torch.cuda.get_device_properties(idx)
        dev["name"] = str(p.name)
        dev["total_bytes"] = int(p.total_memory)
        u = getattr(p, "uuid", None)
        if u is not None:
            dev["uuid"] = str(u)
    except Exception:
        pass
    try:
        free, total = torch.cuda.mem_get_info(idx)
        dev["free_bytes"], dev["total_bytes"] = int(free), int(total)
    except Exception:
        pass
    try:
        alloc["memory_stats"] = {str(k): v for k, v in torch.cuda.memory_stats(idx).items()}
    except Exception:
        pass
    try:
        frac = float(torch.cuda.get_per_process_memory_fraction(idx))
        alloc["fraction"] = frac
        if frac < 1.0 and dev.get("total_bytes"):
            alloc["fraction_cap_bytes"] = int(frac * dev["total_bytes"])
        by = STATE.fraction_set_by
        if frac < 1.0 and by is not None and by.get("device") in (None, idx):
            alloc["fraction_set_by"] = dict(by)
    except Exception:
        pass
    return dev, alloc


def snapshot(torch: Any) -> tuple[dict[str, Any] | None, float]:
    """``torch.cuda.memory._snapshot()`` and how long it took (ms)."""
    t0 = time.perf_counter()
    try:
        snap = torch.cuda.memory._snapshot()
    except Exception as exc:
        _log.debug(f"no snapshot: {type(exc).__name__}: {exc}")
        return None, (time.perf_counter() - t0) * 1000
    if isinstance(snap, list):  # some builds give the segments list only
        snap = {"segments": snap}
    return (snap if isinstance(snap, dict) else None), (time.perf_counter() - t0) * 1000
