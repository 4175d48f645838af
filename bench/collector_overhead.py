"""What the collector costs a training job: the step hook on every step, and capture+spool at the crash.

1. Step hook: the global optimizer post-hook as torch calls it after each ``optimizer.step()`` (count the
   step, record one memory sample into the ring, read the loop's DataLoader at a few steps). Timed on
   torch's CPU build as installed here (no CUDA: the sample has no allocator numbers) and with a
   stand-in for ``torch.cuda.memory_stats_as_nested_dict`` (our work around the call; the C++ call
   itself is measured on a GPU by tests/gpu). Reported in µs per step and as a fraction of a 50 ms
   step. Target: < 0.1%.
2. Capture+spool: what the collector does after ``torch.cuda.memory._snapshot()`` returns, for a
   100,000-entry trace with 20-frame Python stacks (``triage.simulate.scenarios.large_trace_snapshot``):
   build the bundle, encode it as JSON, gzip it, write it to the spool atomically (fsync, rename).
   Frame lists unshared (as torch's own ``_snapshot()`` gives them) and shared. Target: < 1 s.
   A table over trace sizes shows the trade-off behind the default ``history_max_entries``.

Usage: python bench/collector_overhead.py [--entries 100000] [--sizes 25000,50000,100000,200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEP_S = 0.050
MiB = 1024**2


def _setup_state(spool: str) -> Any:
    from collector import _config
    from collector._state import STATE

    cfg, _ = _config.load({"TRIAGE_SPOOL": spool})
    STATE.config = cfg
    STATE.active = True
    STATE.pid = os.getpid()
    return STATE


def bench_step_hook(n: int, repeat: int) -> dict[str, float]:
    import torch

    from collector import _torch

    st = _setup_state(tempfile.mkdtemp())
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = _torch._on_optimizer_step

    def empty(o: Any, a: Any, k: Any) -> None:
        return None

    def timed(fn: Any) -> float:
        best = float("inf")
        for _ in range(repeat):
            st.step = 0
            st.opt_steps.clear()
            st.timeline.clear()
            t0 = time.perf_counter()
            for _ in range(n):
                fn(opt, (), {})
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    base = timed(empty)
    out = {"cpu": timed(hook) - base}
    nested = {
        "allocated_bytes": {"all": {"current": 1 << 30, "peak": 2 << 30}},
        "reserved_bytes": {"all": {"current": 3 << 30}},
    }
    real = (torch.cuda.current_device, torch.cuda.memory_stats_as_nested_dict)
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    torch.cuda.memory_stats_as_nested_dict = lambda device=None: nested  # type: ignore[assignment]
    st.cuda_ready = True
    try:
        out["cuda_standin"] = timed(hook) - base
    finally:
        torch.cuda.current_device, torch.cuda.memory_stats_as_nested_dict = real  # type: ignore[assignment]
        st.cuda_ready = False
    return out


def _snapshot(entries: int, shared: bool) -> dict[str, Any]:
    from triage.simulate.scenarios import large_trace_snapshot

    snap = large_trace_snapshot(entries, frames_per_entry=20, seed=1)
    if not shared:  # torch's _snapshot(): frame dicts shared, one list per trace entry
        for tr in snap.get("device_traces") or []:
            for e in tr:
                if isinstance(e.get("frames"), list):
                    e["frames"] = list(e["frames"])
    return snap


def capture_spool_once(snap: dict[str, Any], spool_dir: str) -> tuple[float, int]:
    """Seconds and bundle bytes for build + encode + gzip + atomic spool write."""
    from collector import _capture, _encode, _spool

    _setup_state(spool_dir)
    try:
        raise RuntimeError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
        )
    except RuntimeError as e:
        exc = e
    t0 = time.perf_counter()
    head, _none, info = _capture.build(exc, "cuda_oom", exc, thread=None, exit_code=1)

    def tail() -> dict[str, Any]:
        info["capture_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return {"collector": info}

    sp = _spool.Spool(spool_dir)
    path = sp.write(head["incident_id"], lambda f: _encode.write_bundle(f, head, snap, tail))
    dt = time.perf_counter() - t0
    size = os.path.getsize(path)
    os.unlink(path)
    return dt, size


def bench_capture(entries: int, shared: bool, repeat: int) -> tuple[float, int]:
    best = (float("inf"), 0)
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeat):
            snap = None
            snap = _snapshot(entries, shared)  # encoding consumes the snapshot: a fresh one per run
            dt, size = capture_spool_once(snap, d)
            if dt < best[0]:
                best = (dt, size)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument(
        "--sizes",
        default="25000,50000,100000,200000",
        help="trace sizes for the trade-off table ('' to skip)",
    )
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    print(f"cores: {os.cpu_count()}  python {sys.version.split()[0]}")
    hook = bench_step_hook(args.steps, args.repeat)
    ok = True
    for name, label in (("cpu", "CPU build (no CUDA)"), ("cuda_standin", "with CUDA stats (stand-in call)")):
        us = hook[name] * 1e6
        frac = hook[name] / STEP_S
        ok &= frac < 0.001
        print(
            f"step hook, {label:32s}: {us:6.2f} µs/step = {frac * 100:.4f}% of a 50 ms step  (target < 0.1%)"
        )

    for shared in (False, True):
        dt, size = bench_capture(args.entries, shared, args.repeat)
        ok &= shared or dt < 1.0
        kind = "shared frame lists" if shared else "per-entry frame lists (torch)"
        print(
            f"capture+spool, {args.entries:,} entries, {kind:30s}: {dt:.3f} s, bundle {size / MiB:.1f} MiB  (target < 1 s)"
        )

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if sizes:
        print("\ntrade-off for history_max_entries (per-entry frame lists, 20 frames):")
        print(f"{'entries':>10} {'capture+spool s':>16} {'bundle MiB':>11} {'µs/entry':>9}")
        for n in sizes:
            dt, size = bench_capture(n, False, 1)
            print(f"{n:>10,} {dt:>16.3f} {size / MiB:>11.1f} {dt / n * 1e6:>9.2f}")
    print("\nresult:", "all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
