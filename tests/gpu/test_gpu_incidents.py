"""The rules on real OOMs: each incident of tests/gpu/incidents.py runs on the GPU under ``triage-run``, and
the Diagnosis of the bundle the collector sent must name what really happened.

The truth comes from the GPU, never from the rules: the largest batch that fits is found by bisection
(two full training steps per try, a fresh model each time); a leak is the list the script appends to;
a neighbour is a second process this test starts; fragmentation is labelled from what the allocator
held at the OOM (the request fitted in the memory the job was allowed, and the cache held enough free
memory, but no free block was large enough).

Not collected by the normal test run (tests/gpu). With ``TRIAGE_GPU_OUT=DIR`` the bundles (gzip JSON)
and a summary (``incidents.json``: truth, verdict, max_batch_size estimate, headline) are written there.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.collector.collector_harness import TriageServer
from tests.gpu.harness import run_under_collector
from triage.pipeline import diagnose_bundle

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
torch = pytest.importorskip("torch")

SCRIPT = HERE / "incidents.py"
OUT = os.environ.get("TRIAGE_GPU_OUT")
RESULTS: dict[str, dict[str, Any]] = {}


def _py(*args: str, timeout: float = 600) -> str:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def _max_batch(seq: int, hi: int) -> int:
    out = _py("bisect", str(seq), str(hi))
    return int(re.search(r"MAXBATCH=(\d+)", out).group(1))  # type: ignore[union-attr]


def _incident(
    server: TriageServer, name: str, *args: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], Any]:
    """Run one incident under the collector; diagnose the one bundle it sent."""
    t0 = time.monotonic()
    p, bundles = run_under_collector(server, SCRIPT, *args, send_budget=60, timeout=900, env=env)
    wall = time.monotonic() - t0
    assert p.returncode == 1, f"{name}: rc {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}"
    assert len(bundles) == 1, f"{name}: {len(bundles)} bundles"
    b = bundles[0]
    d, _ = diagnose_bundle(b)
    RESULTS[name] = {
        "args": list(args),
        "wall_s": round(wall, 1),
        "step": (b.get("workload") or {}).get("step"),
        "batch_size": (b.get("workload") or {}).get("batch_size"),
        "capture_ms": (b.get("collector") or {}).get("capture_ms"),
        "verdict": d.verdict,
        "confidence": round(d.confidence, 3),
        "candidates": d.candidates,
        "leak_site": d.leak_site,
        "max_batch_size": d.max_batch_size,
        "max_batch_details": d.details.get("max_batch_size"),
        "headline": d.headline,
    }
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        with gzip.open(Path(OUT) / f"{name}.json.gz", "wt") as f:
            json.dump(b, f)
    _save()
    # the snapshot is the allocator at the OOM: what it holds allocated is what the message says
    assert b["collector"]["snapshot_at"] == "oom"
    held = sum(
        blk["size"]
        for seg in b["snapshot"]["segments"]
        for blk in seg["blocks"]
        if blk["state"] == "active_allocated"
    )
    said = re.search(r"Of the allocated memory ([\d.]+) GiB is allocated by PyTorch", b["error"]["message"])
    if said:
        assert abs(held / 1024**3 - float(said.group(1))) < 0.02, (held, said.group(0))
    return b, d


def _save() -> None:
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        (Path(OUT) / "incidents.json").write_text(json.dumps(RESULTS, indent=1, default=str))


@pytest.fixture(scope="module")
def max_batch() -> int:
    m = _max_batch(2048, 64)
    RESULTS.setdefault("_truth", {})["max_batch_seq2048"] = m
    assert m >= 8
    return m


def _line_of(marker: str) -> int:
    """The line whose comment starts with the marker (the module docstring names them too)."""
    return next(i for i, ln in enumerate(SCRIPT.read_text().splitlines(), 1) if f"# {marker}" in ln)


def test_leak(server: TriageServer) -> None:
    _, d = _incident(server, "leak", "leak")
    RESULTS["leak"]["truth"] = "tensor_leak"
    _save()
    assert d.verdict == "tensor_leak", d.headline
    site = d.leak_site or {}
    assert site.get("filename", "").endswith("incidents.py") and site.get("line") == _line_of("LOGITS-LINE")


def test_slow_leak(server: TriageServer, max_batch: int) -> None:
    """A leak of about 1/100 of the step's own memory per step: the OOM comes in a step's peak."""
    _, d = _incident(server, "slow_leak", "slow-leak", str(max(1, max_batch // 2)))
    RESULTS["slow_leak"]["truth"] = "tensor_leak"
    _save()
    assert d.verdict == "tensor_leak", d.headline
    site = d.leak_site or {}
    assert site.get("filename", "").endswith("incidents.py") and site.get("line") == _line_of(
        "SLOW-LEAK-LINE"
    )


def test_eval_leak(server: TriageServer) -> None:
    """Outputs kept from a validation loop without no_grad: each keeps its batch's graph. Within one eval
    pass there are no optimizer steps; the forward passes of the validation line's calls are still alive,
    and that line held none in the training steps: a leak named at the line that calls the model (the
    append makes a view and allocates nothing). Never a confident wrong answer."""
    _, d = _incident(server, "eval_leak", "eval-leak", "8")
    RESULTS["eval_leak"]["truth"] = "tensor_leak"
    _save()
    assert d.verdict in ("tensor_leak", "inconclusive"), d.headline
    if d.verdict == "tensor_leak":
        site = d.leak_site or {}
        assert site.get("filename", "").endswith("incidents.py")
        assert site.get("line") == _line_of("EVAL-CALL-LINE"), site


def _check_max_batch(d: Any, truth: int, batch: int) -> None:
    """Below the batch that failed; a ceiling (the failing step had not reached its peak) is not below
    what fits; an estimate from completed steps is within 10%."""
    est = d.max_batch_size
    assert est is not None and est < batch
    if d.details["max_batch_size"]["bound"] == "upper":
        assert est >= truth, (est, truth)
    else:
        assert abs(est - truth) <= 0.1 * truth, (est, truth)


def test_batch_grow(server: TriageServer, max_batch: int) -> None:
    """Completed steps at a smaller batch size, then the schedule's next batch: the collector sends the
    failing step's batch (the function whose locals gave the batch at the step probes is read again in
    the traceback), and the estimate comes from the completed steps unless the failing step already
    wanted more per sample, which makes it a ceiling."""
    big = int(max_batch * 1.3) + 1
    b, d = _incident(server, "batch_grow", "batch-grow", str(max(1, max_batch // 4)), str(big))
    RESULTS["batch_grow"].update(truth="workload_too_large", true_max_batch=max_batch)
    _save()
    assert d.verdict == "workload_too_large", d.headline
    assert b["workload"]["batch_size"] == big
    _check_max_batch(d, max_batch, big)


def test_too_large_near(server: TriageServer, max_batch: int) -> None:
    """A batch 15% above the largest that fits: the first step gets further before it fails."""
    batch = int(max_batch * 1.15) + 1
    _, d = _incident(server, "too_large_near", "too-large", str(batch))
    RESULTS["too_large_near"].update(truth="workload_too_large", true_max_batch=max_batch)
    _save()
    assert d.verdict == "workload_too_large", d.headline
    _check_max_batch(d, max_batch, batch)


def test_too_large_first_step(server: TriageServer, max_batch: int) -> None:
    batch = max_batch * 2
    b, d = _incident(server, "too_large", "too-large", str(batch))
    RESULTS["too_large"].update(truth="workload_too_large", true_max_batch=max_batch)
    _save()
    assert d.verdict == "workload_too_large", d.headline
    assert b["workload"]["batch_size"] == batch and not b["workload"]["step"]  # no optimizer step yet
    _check_max_batch(d, max_batch, batch)


def test_too_large_later(server: TriageServer, max_batch: int) -> None:
    long_max = _max_batch(4096, max(2, max_batch // 2))
    batch = min(max_batch, max(long_max + 1, int(long_max * 1.5)))
    b, d = _incident(server, "too_large_later", "too-large-later", str(batch), "512", "4096")
    RESULTS["too_large_later"].update(truth="workload_too_large", true_max_batch=long_max)
    _save()
    assert d.verdict == "workload_too_large", d.headline
    assert b["workload"]["step"] >= 6
    _check_max_batch(d, long_max, batch)


def test_neighbour(server: TriageServer, max_batch: int) -> None:
    total = torch.cuda.mem_get_info()[1]
    hold_gib = int(total * 0.7 / 1024**3)
    holder = subprocess.Popen(
        [sys.executable, str(SCRIPT), "hold", str(hold_gib)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert holder.stdout is not None and "HOLDING" in holder.stdout.readline()
        _, d = _incident(server, "neighbour", "neighbour", str(max(1, max_batch // 2)))
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    RESULTS["neighbour"].update(truth="other_process", holder_pid=holder.pid, holder_gib=hold_gib)
    _save()
    assert d.verdict == "other_process", d.headline


def test_fragmentation(server: TriageServer, max_batch: int) -> None:
    b, d = _incident(server, "fragmentation", "fragmentation", str(max(1, int(max_batch * 0.8))))
    # from the snapshot taken inside the observer (the allocator at the OOM; memory_stats are read later,
    # after the exception freed the step's tensors)
    req = b["allocator"]["observer"]["alloc_size"]
    segs = [seg for seg in b["snapshot"]["segments"] if seg["segment_type"] == "large" and seg["stream"] == 0]
    free_reserved = sum(blk["size"] for seg in segs for blk in seg["blocks"] if blk["state"] == "inactive")
    largest = max(
        (blk["size"] for seg in segs for blk in seg["blocks"] if blk["state"] == "inactive"), default=0
    )
    truth = "fragmentation" if free_reserved >= req and largest < req else "workload_too_large"
    RESULTS["fragmentation"].update(
        truth=truth, free_reserved=free_reserved, largest_free=largest, request=req
    )
    assert d.verdict in (truth, "inconclusive"), d.headline


EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_expandable_too_large(server: TriageServer) -> None:
    """With expandable segments the allocator maps pages into one growing segment per stream instead of
    caching separate segments: a batch far too large must still read as too large, and the Diagnosis
    must know the setting is on."""
    b, d = _incident(server, "exp_too_large", "too-large", "164", env=EXPANDABLE)
    RESULTS["exp_too_large"]["truth"] = "workload_too_large"
    _save()
    assert d.verdict == "workload_too_large", d.headline
    assert d.max_batch_size is not None and d.max_batch_size < 164
    assert any(seg.get("is_expandable") for seg in b["snapshot"]["segments"])


def test_expandable_leak(server: TriageServer) -> None:
    """The same leak as test_leak, with expandable segments: the site is the same line."""
    _, d = _incident(server, "exp_leak", "leak", env=EXPANDABLE)
    RESULTS["exp_leak"]["truth"] = "tensor_leak"
    _save()
    assert d.verdict == "tensor_leak", d.headline
    assert (d.leak_site or {}).get("line") == _line_of("LOGITS-LINE")


def test_fraction_cap_is_the_platform(server: TriageServer) -> None:
    """A batch of 24 needs about 40 GiB on this model, a third of the device; a cap of 0.2 of the device
    (28 GiB), set before the job starts as a platform's wrapper would, stops it: the job would fit the GPU
    it was given, so the quota is the cause."""
    b, d = _incident(server, "fraction_cap", "too-large", "24", env={"OOMT_FRACTION": "0.2"})
    RESULTS["fraction_cap"]["truth"] = "gpu_quota"
    _save()
    assert b["allocator"]["fraction"] == pytest.approx(0.2)
    assert d.verdict == "gpu_quota", d.headline
