"""Replay speed and memory against the anchors measured in the same run.

Generates a trace of N entries (≈20 frames each, frame dicts shared as in real files), pickles it, and
measures whole processes, each run REPEAT times (best time, its peak RSS):
- anchor: `python -c "pickle.load(f)"` (the plain load; nothing can be faster than that)
- `triage replay --json` (the full diagnosis) and `triage replay --json --no-rules` (load + accounting)
- `python -m torch.cuda._memory_viz stats` (torch's own tool; skipped without torch)
Then the 1,000,000-entry trace: replay time must grow linearly (≤ 11x the 100k time).

Targets: replay ≤ 2x the plain load; ≥ 3x faster than _memory_viz stats; peak RSS ≤ 1.5x the plain load's;
the rules add ≤ 30% to the replay time.

Usage: python bench/replay_large.py [--entries 100000] [--big 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(cmd: list[str], repeat: int) -> tuple[float, int]:
    """Best wall time (s) over `repeat` runs and that run's peak RSS (bytes)."""
    best = (float("inf"), 0)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode() if p.stderr else ""
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {err[-400:]}")
        if dt < best[0]:
            best = (dt, usage.ru_maxrss * 1024)
    return best


def make(entries: int, path: Path) -> None:
    """Generate in a child process: the measured processes are forked from this one, and a fork's peak RSS
    starts at its parent's, so the parent must stay small."""
    code = (
        "import pickle, sys\n"
        "from triage.simulate.scenarios import large_trace_snapshot\n"
        f"snap = large_trace_snapshot({entries}, frames_per_entry=20, seed=1)\n"
        f"open({str(path)!r}, 'wb').write(pickle.dumps(snap, protocol=4))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--big", type=int, default=1_000_000, help="0 to skip the linearity check")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    py = sys.executable
    # an installed package runs from bytecode (pip compiles it); where PYTHONDONTWRITEBYTECODE is set no
    # .pyc is ever written, and every measured process would compile every module from source first
    subprocess.run(
        [py, "-m", "compileall", "-q", "triage", "rules"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL
    )
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "trace.pickle"
        t0 = time.perf_counter()
        make(args.entries, f)
        print(
            f"generated {args.entries} entries in {time.perf_counter() - t0:.1f}s, {f.stat().st_size / 2**20:.1f} MiB"
        )
        load = measure([py, "-c", f"import pickle; pickle.load(open({str(f)!r}, 'rb'))"], args.repeat)
        replay = measure([py, "-m", "triage.cli", "replay", str(f), "--json"], args.repeat)
        norules = measure([py, "-m", "triage.cli", "replay", str(f), "--json", "--no-rules"], args.repeat)
        try:
            import torch  # noqa: F401

            viz: tuple[float, int] | None = measure(
                [py, "-m", "torch.cuda._memory_viz", "stats", str(f)], args.repeat
            )
        except ImportError:
            viz = None
        rows = [
            ("plain pickle.load (anchor)", load),
            ("triage replay --json", replay),
            ("triage replay --json --no-rules", norules),
        ]
        if viz:
            rows.append(("torch _memory_viz stats", viz))
        print(f"\n{'process':36} {'time s':>8} {'peak RSS MiB':>13}")
        for name, (t, rss) in rows:
            print(f"{name:36} {t:8.3f} {rss / 2**20:13.1f}")
        checks = [
            ("replay time / plain load", replay[0] / load[0], 2.0, "<="),
            ("replay peak RSS / plain load", replay[1] / load[1], 1.5, "<="),
            ("rules' share of replay time", replay[0] / norules[0] - 1, 0.30, "<="),
        ]
        if viz:
            checks.append(("_memory_viz stats time / replay", viz[0] / replay[0], 3.0, ">="))
        if args.big:
            g = Path(tmp) / "big.pickle"
            make(args.big, g)
            big = measure([py, "-m", "triage.cli", "replay", str(g), "--json"], 1)
            print(f"{'triage replay --json (' + str(args.big) + ')':36} {big[0]:8.3f} {big[1] / 2**20:13.1f}")
            checks.append((f"replay {args.big} / replay {args.entries} time", big[0] / replay[0], 11.0, "<="))
        print(f"\n{'ratio':40} {'measured':>9} {'target':>8}")
        ok = True
        for name, value, target, op in checks:
            good = value <= target if op == "<=" else value >= target
            ok &= good
            print(f"{name:40} {value:9.2f} {op}{target:<6} {'ok' if good else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
