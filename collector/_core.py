"""Installing the collector: hooks on the way out, a watcher for ``import torch``, fork safety.

Installed at once (standard library only, cheap): ``sys.excepthook`` and ``threading.excepthook``,
each chained to the hook it replaces, an ``atexit`` handler and an after-fork handler. The torch parts
(step hook, CUDA history and OOM observer) wait until the training code imports torch,
so a Python process that never does (pip, a shell helper) pays nothing but this module's import.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections import deque
from typing import Any

from collector import _config, _log
from collector._state import STATE, State

_STARTUP_FLUSH_BUNDLE_S = 30.0
_STARTUP_FLUSH_TOTAL_S = 300.0


def install(
    url: str | None = None,
    *,
    token: str | None = None,
    spool: str | None = None,
    send_budget: float | None = None,
    history: bool | None = None,
    history_max_entries: int | None = None,
) -> bool:
    """Activate the collector in this process (idempotent). True when it is active."""
    st = STATE
    try:
        with st.lock:
            if _config.disabled():
                return False
            cfg, complaints = _config.load(
                url=url,
                token=token,
                spool=spool,
                send_budget=send_budget,
                history=history,
                history_max_entries=history_max_entries,
            )
            _log.set_debug(cfg.debug)
            for c in complaints:
                _log.debug(c)
            if st.installed and st.pid == os.getpid():
                st.config = cfg  # explicit install() after the auto-activation: its arguments win
                _refresh_torch_settings(st)
                return st.active
            _reset_for_this_process(st)
            st.config = cfg
            st.timeline = deque(maxlen=cfg.timeline_max)
            st.peak_reset = cfg.step_peak == "reset"
            st.mp_child = _is_multiprocessing_child()
            st.installed = True
            st.active = True
            st.pid = os.getpid()
            _install_exit_hooks(st)
            torch = sys.modules.get("torch")
            if torch is not None and hasattr(torch, "cuda"):
                _on_torch(torch)
            else:
                _watch_for_torch()
            _log.debug(
                f"installed (pid {st.pid}, url {cfg.url}, spool {cfg.spool}, child={st.mp_child}, "
                f"torch {'loaded' if torch is not None else 'not yet imported'})"
            )
            return st.active
    except Exception as exc:
        _log.say(f"not installed ({type(exc).__name__}: {exc})")
        return False


def _reset_for_this_process(st: State) -> None:
    st.step = 0
    st.manual_steps = False
    st.opt_steps = {}
    st.oom_events.clear()
    st.last_oom_by_device = {}
    st.captured_ids = set()
    st.captures = 0
    st.crash_deadline = 0.0
    st.sender = None


def _is_multiprocessing_child() -> bool:
    if "--multiprocessing-fork" in getattr(sys, "argv", ()):
        return True
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and mp.parent_process() is not None
    except Exception:
        return False


def _refresh_torch_settings(st: State) -> None:
    cfg = st.config
    if cfg is None:
        return
    st.peak_reset = cfg.step_peak == "reset"
    if st.timeline.maxlen != cfg.timeline_max:
        st.timeline = deque(st.timeline, maxlen=cfg.timeline_max)


# --- the torch side ------------------------------------------------------------------------------------


def _on_torch(torch: Any) -> None:
    """torch has just been imported (or already was). Never raises."""
    st = STATE
    try:
        if st.torch_seen or not st.owns_process():
            return
        st.torch_seen = True
        from collector import _torch

        if not _torch.cuda_capable(torch):
            _deactivate(st)
            _log.say_once(
                "inert",
                f"torch {getattr(torch, '__version__', '?')} has no CUDA support (a CPU build): collector inactive",
            )
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
            _deactivate(st)
            _log.say_once(
                "inert", f"no CUDA device is visible (CUDA_VISIBLE_DEVICES={visible!r}): collector inactive"
            )
            return
        _torch.arm(torch, st)
        _start_startup_flush(st)
    except Exception as exc:
        _log.debug(f"torch setup failed: {type(exc).__name__}: {exc}")


def _deactivate(st: State) -> None:
    st.active = False
    if sys.excepthook is st.our_excepthook and st.prev_excepthook is not None:
        sys.excepthook = st.prev_excepthook
    if threading.excepthook is st.our_threading_excepthook and st.prev_threading_excepthook is not None:
        threading.excepthook = st.prev_threading_excepthook


class _TorchWatcher:
    """A ``sys.meta_path`` entry that runs ``_on_torch`` right after torch's own ``__init__`` finishes,
    by wrapping ``exec_module`` of the loader it finds for ``torch``. It stays in place until torch is
    really executed: libraries probe with ``importlib.util.find_spec("torch")`` without importing."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module
        watcher = self

        def exec_module(module: Any) -> None:
            try:
                del loader.exec_module  # back to the class's method
            except AttributeError:
                pass
            _unwatch(watcher)
            orig(module)
            _on_torch(module)

        try:
            loader.exec_module = exec_module
        except Exception:
            _log.debug("cannot watch torch's import (unusual loader); torch hooks not installed")
        return spec


def _watch_for_torch() -> None:
    if not any(isinstance(f, _TorchWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchWatcher())


def _unwatch(w: _TorchWatcher) -> None:
    try:
        sys.meta_path.remove(w)
    except ValueError:
        pass


def _start_startup_flush(st: State) -> None:
    """Bundles left by earlier processes (the service was down) go out now, in the background. One
    process per node does it: not spawn children, not ranks other than local rank 0."""
    cfg = st.config
    if cfg is None or cfg.url is None or st.mp_child:
        return
    if os.environ.get("LOCAL_RANK", "0").strip() not in ("", "0"):
        return

    def run() -> None:
        try:
            from collector import _send, _spool

            spool = _spool.Spool(cfg.spool, cfg.spool_max_bytes)
            if not spool.pending():
                return
            assert cfg.url is not None
            _send.flush_spool(
                spool,
                cfg.url,
                cfg.token,
                time.monotonic() + _STARTUP_FLUSH_TOTAL_S,
                per_bundle_s=_STARTUP_FLUSH_BUNDLE_S,
            )
        except Exception as exc:
            _log.debug(f"startup flush failed: {type(exc).__name__}: {exc}")

    threading.Thread(target=run, name="oom-triage-flush", daemon=True).start()


# --- hooks on the way out ------------------------------------------------------------------------------


def _install_exit_hooks(st: State) -> None:
    if st.our_excepthook is None:
        st.prev_excepthook = sys.excepthook

        def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
            prev = STATE.prev_excepthook or sys.__excepthook__
            try:
                prev(tp, value, tb)  # the user's traceback first, exactly as without us
            finally:
                if STATE.active and isinstance(value, BaseException):
                    _capture(value, source="excepthook", exit_code=1)

        st.our_excepthook = excepthook
        sys.excepthook = excepthook
    if st.our_threading_excepthook is None:
        st.prev_threading_excepthook = threading.excepthook

        def threading_excepthook(args: Any) -> None:
            prev = STATE.prev_threading_excepthook or threading.__excepthook__
            try:
                prev(args)
            finally:
                value = getattr(args, "exc_value", None)
                if STATE.active and isinstance(value, BaseException):
                    t = getattr(args, "thread", None)
                    _capture(value, source="threading", thread=getattr(t, "name", None))

        st.our_threading_excepthook = threading_excepthook
        threading.excepthook = threading_excepthook
    global _process_hooks_registered
    if not _process_hooks_registered:
        _process_hooks_registered = True
        atexit.register(_at_exit)
        try:
            os.register_at_fork(after_in_child=_after_fork_in_child)
        except Exception:
            pass


_process_hooks_registered = False


def _capture(
    value: BaseException, *, source: str, thread: str | None = None, exit_code: int | None = None
) -> None:
    try:
        from collector import _capture as cap

        cap.capture(value, source=source, thread=thread, exit_code=exit_code)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    """Forked children (DataLoader workers, helpers) never capture or send."""
    STATE.active = False


def _at_exit() -> None:
    st = STATE
    try:
        if not st.owns_process():
            return
        # the main thread's uncaught exception, which Python records before calling sys.excepthook
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if st.torch_seen and isinstance(exc, BaseException) and id(exc) not in st.captured_ids:
            _capture(exc, source="atexit", exit_code=1)  # our excepthook was replaced by someone else's
        sender = st.sender
        if sender is not None and st.crash_deadline and not sender.wait(st.crash_deadline):
            _log.debug("send budget spent; what is left stays spooled")
    except Exception:
        pass


# --- progress ------------------------------------------------------------------------------------------


def set_batch_size(n: int | None) -> None:
    try:
        STATE.explicit_batch_size = int(n) if n is not None else None
    except Exception:
        pass


def step(n: int | None = None) -> None:
    st = STATE
    try:
        st.manual_steps = True
        st.step = int(n) if n is not None else st.step + 1
        if st.active and os.getpid() == st.pid:
            from collector import _torch

            _torch.sample(st)
    except Exception:
        pass


def flush(timeout: float | None = None) -> bool:
    """Send spooled bundles now (blocking up to ``timeout`` s, default the send budget). True when none
    is left to send."""
    try:
        from collector import _send, _spool

        cfg = STATE.config
        if cfg is None:
            cfg, _ = _config.load()
        spool = _spool.Spool(cfg.spool, cfg.spool_max_bytes)
        if STATE.sender is not None:
            STATE.sender.wait(time.monotonic() + (cfg.send_budget if timeout is None else timeout))
        if cfg.url is None:
            return not spool.pending()
        _send.flush_spool(
            spool, cfg.url, cfg.token, time.monotonic() + (cfg.send_budget if timeout is None else timeout)
        )
        return not spool.pending()
    except Exception as exc:
        _log.debug(f"flush failed: {type(exc).__name__}: {exc}")
        return False
