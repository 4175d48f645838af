"""`triage diagnose` on a long log, against the anchor measured in the same run.

Generates a log of N lines (8 ranks printing progress and memory at every step, tqdm redraws, an OOM at
the end) and measures whole processes, each run REPEAT times (best time):
- anchor: `python -c` that reads the file and runs one regular expression over every line (the least any
  line-by-line reader does)
- `triage diagnose --json LOG`

Prints the ratio; there is no hard target: it shows what reading a whole log costs beside one pass.

Usage: python bench/diagnose_log.py [--lines 150000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OOM = (
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
    "capacity of 79.15 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 77.92 GiB "
    "memory in use. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 7.20 GiB is reserved by "
    "PyTorch but unallocated."
)


def write_log(path: Path, lines: int) -> None:
    rng = random.Random(0)
    out = []
    for s in range(lines):
        out.append(
            f"[rank{s % 8}]: 2026-11-30 10:{s % 60:02d}:00 | INFO | step {s // 8} | loss {rng.random():.4f} | "
            f"lr 1e-4 | tok/s 12345 | mem_allocated 31.{s % 10} GiB"
        )
        if s % 1000 == 0:
            out.append(
                "  0%|          | 0/500 [00:00<?, ?it/s]\r 10%|#         | 50/500 [00:05<00:45, 10.0it/s]"
            )
    out.append(OOM)
    path.write_text("\n".join(out) + "\n")


def best(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "train.log"
        write_log(log, args.lines)
        size = log.stat().st_size
        anchor = best(
            [
                sys.executable,
                "-c",
                "import re, sys; p = re.compile(r'out of memory', re.I); "
                "print(sum(1 for ln in open(sys.argv[1]) if p.search(ln)))",
                str(log),
            ],
            args.repeat,
        )
        diag = best([sys.executable, "-m", "triage.cli", "diagnose", "--json", str(log)], args.repeat)
    print(f"log: {args.lines} lines, {size / 2**20:.1f} MiB")
    print(f"{'one regex pass (anchor)':32} {anchor:8.3f} s")
    print(f"{'triage diagnose --json':32} {diag:8.3f} s")
    print(f"{'ratio':32} {diag / anchor:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
