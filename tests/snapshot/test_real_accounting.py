"""Totals on every real snapshot equal what torch's own `python -m torch.cuda._memory_viz stats` prints.

torch (CPU build, from the dev extra) is the oracle here only: our loader never imports it.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REAL_SNAPSHOTS, real_snapshot_paths
from triage.snapshot.accounting import account
from triage.snapshot.loader import load_raw, load_snapshot
from triage.snapshot.timeline import replay


def torch_format(num: float) -> str:
    """torch.cuda._memory_viz._format_size, reproduced to compare printed values."""
    for unit in ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"]:
        if abs(num) < 1024.0:
            return f"{num:3.1f}{unit}B"
        num /= 1024.0
    return f"{num:.1f}YiB"


def torch_stats(path: Path) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    got = {}
    for key in ("segments", "total_reserved", "total_allocated", "total_free"):
        m = re.search(rf"^{key}: (\S+)", out, re.M)
        assert m, f"torch printed no {key}: {out[-500:]}"
        got[key] = m.group(1)
    return got


@pytest.mark.parametrize("path", real_snapshot_paths(), ids=lambda p: p.name[:48])
def test_totals_match_torch_memory_viz(path: Path) -> None:
    oracle = torch_stats(path)
    acc = account(load_snapshot(path))
    t = acc.total
    assert oracle["segments"] == str(t.segments)
    assert oracle["total_reserved"] == torch_format(t.reserved_bytes)
    # torch's total_allocated is the requested bytes of active_allocated blocks
    assert oracle["total_allocated"] == torch_format(t.requested_bytes)
    assert oracle["total_free"] == torch_format(t.reserved_bytes - t.requested_bytes)


def test_exact_totals_of_one_file_by_independent_count() -> None:
    """Exact integers, counted independently from the raw decoded structure."""
    path = REAL_SNAPSHOTS / "Maphsge4__select_n__1f2f5480__snapshot.pickle"
    raw = load_raw(path)
    reserved = sum(s["total_size"] for s in raw["segments"])
    allocated = sum(
        b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    )
    requested = sum(
        b["requested_size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    )
    s = account(load_snapshot(path)).summary()
    assert (s["reserved_bytes"], s["allocated_bytes"], s["requested_bytes"]) == (
        reserved,
        allocated,
        requested,
    )
    assert s["free_in_reserved_bytes"] == reserved - allocated
    assert s["reserved_bytes"] == 2776629248


def test_legacy_blocks_use_history_real_size() -> None:
    path = REAL_SNAPSHOTS / "Yiyi-philosophy__LLM-inference__log1__1.3b_snapshot.pickle"
    snap = load_snapshot(path)
    assert snap.era == "legacy"
    raw = load_raw(path)
    want = sum(
        b["history"][0]["real_size"]
        for s in raw["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    )
    assert account(snap).total.requested_bytes == want
    # legacy blocks get their address from the history
    blk = next(b for b in snap.blocks() if b.allocated)
    assert blk.address >= blk.segment.address if blk.segment else False


def test_segments_only_list_is_accepted(tmp_path: Path) -> None:
    """`torch.cuda.memory_snapshot()` returns the segments list alone; both we and torch accept it."""
    raw = load_raw(REAL_SNAPSHOTS / "silmont2000__assignment2-systems__133f0643__mem_snapshot.pickle")
    p = tmp_path / "segments.pickle"
    p.write_bytes(pickle.dumps(raw["segments"], protocol=4))
    snap = load_snapshot(p)
    assert snap.era == "segments-only"
    assert torch_stats(p)["total_reserved"] == torch_format(account(snap).total.reserved_bytes)


def test_frames_stay_shared() -> None:
    path = REAL_SNAPSHOTS / "Maphsge4__select_n__04d383cd__snapshot.pickle"
    snap = load_snapshot(path)
    frames = [fr for e in snap.device_traces[0] for fr in e.get("frames", [])]
    assert len(frames) > 500_000
    assert len({id(f) for f in frames}) < 2_000


def test_json_and_gzip_forms_give_the_same_accounting(tmp_path: Path) -> None:
    import gzip
    import json

    src = REAL_SNAPSHOTS / "silmont2000__assignment2-systems__0f94da4e__memory_forward_fp32_128.pickle"
    raw = load_raw(src)
    want = account(load_snapshot(src)).summary()
    (tmp_path / "s.json").write_text(json.dumps(raw))
    (tmp_path / "s.json.gz").write_bytes(gzip.compress(json.dumps(raw).encode()))
    (tmp_path / "s.pickle.gz").write_bytes(gzip.compress(src.read_bytes()))
    for name in ("s.json", "s.json.gz", "s.pickle.gz"):
        snap = load_snapshot(tmp_path / name)
        assert account(snap).summary() == want, name
    # JSON has no sharing: equal frames are interned into one object
    snap = load_snapshot(tmp_path / "s.json")
    frames = [fr for e in snap.device_traces[0] for fr in e.get("frames", [])]
    assert len({id(f) for f in frames}) == len({(f["name"], f["filename"], f["line"]) for f in frames})


@pytest.mark.parametrize("path", real_snapshot_paths(), ids=lambda p: p.name[:48])
def test_trace_replay_is_consistent_with_final_segments(path: Path) -> None:
    snap = load_snapshot(path)
    for tl in replay(snap):
        assert tl.consistency.ok, tl.consistency.to_dict()
        if tl.entries:
            assert tl.level_at(tl.entries - 1) == tl.end_allocated
            assert tl.peak_allocated >= tl.end_allocated


def test_progress_reports_every_byte_of_a_pickle() -> None:
    path = REAL_SNAPSHOTS / "Maphsge4__select_n__04d383cd__snapshot.pickle"
    seen: list[tuple[int, int]] = []
    snap = load_snapshot(path, progress=lambda done, total: seen.append((done, total)))
    size = path.stat().st_size
    assert len(seen) > 1 and all(t == size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == size
    assert account(snap).summary() == account(load_snapshot(path)).summary()
