"""Scenarios: every family runs and carries honest truth; determinism; batch-size truth by simulation;
leak sites; bundles; the big-trace generator; torch's own viewer on a simulated snapshot; the CLI."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REAL_SNAPSHOTS
from tests.test_simulate import check_invariants, check_snapshot_replay, close, parse_oom, replay
from triage.errors import InputError
from triage.simulate import scenarios as S
from triage.simulate.allocator import format_size
from triage.simulate.scenarios import (
    ScenarioResult,
    labelled_set,
    large_trace_snapshot,
    legacy_snapshot,
    run_scenario,
    scenario_names,
)
from triage.snapshot.loader import load_raw, load_snapshot

VERDICT = {
    "healthy": {"inconclusive"},
    "tensor_leak": {"tensor_leak"},
    "workload_too_large": {"workload_too_large"},
    "fragmentation": {"fragmentation", "workload_too_large"},
    "other_process": {"other_process"},
    "gpu_quota": {"gpu_quota"},
    "shm_exhausted": {"shm_exhausted"},
    "host_memory_limit": {"host_memory_limit"},
    "bounded_cache": {"workload_too_large"},
    "small_request_big_hole": {"fragmentation", "other_process", "workload_too_large"},
    "leak_like_big_batch": {"tensor_leak"},
    "leak_no_frames": {"tensor_leak"},
    "eval_leak": {"tensor_leak", "workload_too_large"},
    "carried_graph": {"tensor_leak"},
}
HARD_NEGATIVES = {"bounded_cache", "small_request_big_hole", "leak_like_big_batch", "leak_no_frames"}

_CACHE: dict[tuple[str, int, str], ScenarioResult] = {}


def get(name: str, seed: int = 0, **params: Any) -> ScenarioResult:
    key = (name, seed, json.dumps(params, sort_keys=True))
    if key not in _CACHE:
        _CACHE[key] = run_scenario(name, seed, **params)
    return _CACHE[key]


def innermost_user(frames: list[dict[str, Any]], torch_root: str = "/torch/") -> dict[str, Any] | None:
    for f in frames:
        fn = f["filename"]
        if not fn.startswith("/") or fn.endswith((".c", ".h", ".cpp")) or "/torch/" in fn or "runpy" in fn:
            continue
        if "/python3." in fn and "site-packages" not in fn and fn.endswith(".py") and "/lib/" in fn:
            continue
        return {"filename": fn, "line": f["line"], "name": f["name"]}
    return None


def test_registry() -> None:
    names = scenario_names()
    assert set(VERDICT) == set(names)
    with pytest.raises(InputError, match="unknown scenario"):
        run_scenario("no_such_scenario")
    with pytest.raises(InputError, match="unknown parameter"):
        run_scenario("healthy", bogus=1)
    with pytest.raises(InputError, match="unknown variant"):
        run_scenario("gpu_quota", variant="vgpu")


@pytest.mark.parametrize("name", sorted(VERDICT))
def test_every_scenario_runs_with_its_truth(name: str) -> None:
    r = get(name)
    t = r.truth
    assert set(t) == {"verdict", "owner", "leak_site", "max_batch_size", "family", "hard_negative", "notes"}
    assert t["verdict"] in VERDICT[name]
    assert t["family"] == name
    variant_negative = name in ("fragmentation", "eval_leak") and t["hard_negative"]
    assert t["hard_negative"] == (name in HARD_NEGATIVES or variant_negative)
    owner = {"tensor_leak": "algorithm", "workload_too_large": "algorithm", "fragmentation": "algorithm"}
    assert t["owner"] == owner.get(t["verdict"], None if t["verdict"] == "inconclusive" else "platform")
    b = r.bundle
    assert b["schema"] == "oom-triage/incident@1"
    assert b["incident_id"] == get(name).bundle["incident_id"]
    assert b["occurred_at"].endswith("Z")
    if name in ("shm_exhausted", "host_memory_limit"):
        assert r.snapshot is None and b["snapshot"] is None
        assert b["kind"] == ("shm_exhausted" if name == "shm_exhausted" else "host_oom")
        return
    snap = r.snapshot
    assert snap is not None
    assert r.allocator is not None
    check_invariants(r.allocator)
    w = b["workload"]
    assert {"batch_size", "step", "pid", "pids", "rank", "world_size"} <= set(w)
    assert w["pid"] in w["pids"]
    dev = b["device"]
    assert dev["total_bytes"] > 0 and dev["name"]
    assert b["allocator"]["memory_stats"]["reserved_bytes.all.current"] == sum(
        s["total_size"] for s in snap["segments"]
    )
    if name == "healthy":
        assert b["kind"] == "crash"
        assert all(e["action"] != "oom" for e in snap["device_traces"][dev["index"]])
        assert len(b["timeline"]) == w["step"]
        return
    assert b["kind"] == "cuda_oom"
    assert r.message and (r.message.startswith("CUDA out of memory.") or "INTERNAL ASSERT" in r.message)
    # the snapshot round-trips through the project's safe loader, JSON bundle included
    loaded = load_raw(pickle.dumps(snap, protocol=4))
    assert len(loaded["segments"]) == len(snap["segments"])
    load_snapshot(json.dumps(b["snapshot"]).encode())


@pytest.mark.parametrize("name", ["workload_too_large", "other_process", "tensor_leak", "fragmentation"])
def test_oom_message_matches_state(name: str) -> None:
    r = get(name, 1)
    a = r.allocator
    assert a is not None and r.message is not None
    p = parse_oom(r.message)
    obs = r.bundle["allocator"]["observer"]
    assert p["alloc"] == format_size(obs["alloc_size"])
    assert p["device"] == obs["device"] == r.bundle["device"]["index"]
    assert close(p["total"], r.bundle["device"]["total_bytes"])
    assert close(p["free"], obs["device_free"])
    assert close(p["allocated"], a.allocated_bytes)
    stats = r.bundle["allocator"]["memory_stats"]
    unalloc = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    assert close(p["unallocated"], unalloc) or p["unallocated"] == f"{unalloc} bytes"
    ooms = [e for e in r.snapshot["device_traces"][obs["device"]] if e["action"] == "oom"]  # type: ignore[index]
    assert ooms and ooms[-1]["device_free"] == obs["device_free"]
    assert stats["num_ooms"] == 1
    pids = [int(pid) for pid, _ in p["procs"] if pid]
    assert pids == sorted(pids)
    assert r.bundle["workload"]["pid"] in pids or r.bundle["device"]["mig_profile"]
    nvml = {q["pid"] for q in r.bundle["device"]["processes"]}
    assert set(pids) <= nvml


def test_determinism_per_seed() -> None:
    for name in ("workload_too_large", "small_request_big_hole"):
        a, b = run_scenario(name, 2), run_scenario(name, 2)
        assert a.truth == b.truth and a.message == b.message
        assert json.dumps(a.bundle, sort_keys=True) == json.dumps(b.bundle, sort_keys=True)
        assert pickle.dumps(a.snapshot) == pickle.dumps(b.snapshot)
    assert run_scenario("workload_too_large", 3).message != get("workload_too_large", 2).message


@pytest.mark.parametrize(
    ("name", "seed"), [("workload_too_large", 0), ("workload_too_large", 1), ("bounded_cache", 0)]
)
def test_max_batch_size_is_found_by_simulation(name: str, seed: int) -> None:
    r = get(name, seed)
    best = r.truth["max_batch_size"]
    assert isinstance(best, int) and best >= 1
    assert r.probe is not None
    assert r.probe(best)
    assert not r.probe(best + 1)
    assert r.bundle["workload"]["batch_size"] > best
    assert not r.probe(r.bundle["workload"]["batch_size"])


def test_leak_site_is_the_user_line_that_allocated_the_leak() -> None:
    for seed in range(2):
        r = get("tensor_leak", seed)
        site = r.truth["leak_site"]
        assert site is not None and site["filename"].startswith("/") and site["line"] > 0
        a = r.allocator
        assert a is not None
        # the live blocks allocated at that line outnumber a step's worth: the leak
        sites = [innermost_user(a.frames_of(addr)) for addr in a.live_blocks()]
        assert sum(1 for s in sites if s == site) >= 3
        timeline = r.bundle["timeline"]
        assert len(timeline) >= 3
        assert timeline[-1]["allocated_bytes"] > timeline[1]["allocated_bytes"]


def test_eval_leak_keeps_every_validation_output_with_its_graph() -> None:
    """The validation loop's outputs keep their forward passes alive: the live blocks made under the
    validation function's model call are several batches' activations; the big-batch variant keeps none."""
    r = get("eval_leak", 0, variant="kept")
    site = r.truth["leak_site"]
    assert r.truth["verdict"] == "tensor_leak" and site is not None and site["name"] == "evaluate"
    a = r.allocator
    assert a is not None
    under_eval = [
        addr for addr in a.live_blocks() if any(f.get("line") == site["line"] for f in a.frames_of(addr))
    ]
    steps = len(r.bundle["timeline"])
    assert steps >= 3 and r.bundle["workload"]["step"] == steps  # no optimizer step since
    kept = int(r.truth["notes"].split()[0])
    assert kept >= 4 and len(under_eval) >= 4 * kept  # every layer's saved activations, per kept output
    neg = get("eval_leak", 0, variant="big_batch")
    assert neg.truth["verdict"] == "workload_too_large" and neg.truth["hard_negative"]
    assert neg.truth["leak_site"] is None


def test_a_carried_graph_keeps_every_step_s_saved_activations() -> None:
    """Each step's backward keeps its saved tensors (the graph is retained and still referenced): live
    memory after the steps rises by about a forward pass a step, and the same job without it runs."""
    r = get("carried_graph", 1)
    assert r.truth["verdict"] == "tensor_leak" and r.truth["leak_site"] is not None
    timeline = r.bundle["timeline"]
    assert len(timeline) >= 4
    rises = [b["allocated_bytes"] - a["allocated_bytes"] for a, b in itertools.pairwise(timeline)]
    assert all(d > 0 for d in rises[1:])  # every step after the first keeps its graph
    a = r.allocator
    assert a is not None
    site = r.truth["leak_site"]
    under_call = [
        addr for addr in a.live_blocks() if any(f.get("line") == site["line"] for f in a.frames_of(addr))
    ]
    assert len(under_call) >= 4 * len(timeline)  # several saved activations per kept step


def test_leak_without_frames() -> None:
    r = get("leak_no_frames")
    assert r.truth["verdict"] == "tensor_leak" and r.truth["leak_site"] is None
    snap = r.snapshot
    assert snap is not None
    assert all(b["frames"] == [] for s in snap["segments"] for b in s["blocks"])
    assert all(e["frames"] == [] for t in snap["device_traces"] for e in t)
    assert sum(len(t) for t in snap["device_traces"]) > 0


def test_small_ring_buffer_does_not_hold_the_run() -> None:
    r = get("tensor_leak", 4, small_ring=True)
    a = r.allocator
    assert a is not None and a.max_entries is not None and a.max_entries <= 10_000
    trace = r.snapshot["device_traces"][a.device]  # type: ignore[index]
    assert len(trace) == a.max_entries
    assert trace[-1]["action"] == "oom"
    assert r.bundle["collector"]["history_max_entries"] == a.max_entries


def test_full_trace_replays_to_the_snapshot() -> None:
    r = get("healthy", 1, steps=6)
    a = r.allocator
    assert a is not None
    a_max = a.max_entries
    snap = r.snapshot
    assert snap is not None
    trace = snap["device_traces"][a.device]
    if a_max is None or len(trace) < a_max:
        check_snapshot_replay(snap, a.device)


def test_frames_are_shared_and_varied() -> None:
    files: set[str] = set()
    for name, seed in (
        ("tensor_leak", 0),
        ("tensor_leak", 1),
        ("workload_too_large", 0),
        ("fragmentation", 0),
    ):
        r = get(name, seed)
        snap = r.snapshot
        assert snap is not None
        refs = 0
        dicts: set[int] = set()
        for t in snap["device_traces"]:
            for e in t:
                refs += len(e["frames"])
                dicts.update(id(f) for f in e["frames"])
        assert refs > 0
        assert len(dicts) < 400 and len(dicts) * 5 < refs
        for t in snap["device_traces"]:
            for e in t:
                site = innermost_user(e["frames"])
                if site:
                    files.add(site["filename"])
    assert len(files) >= 4


def test_variants_and_hard_negatives() -> None:
    mig = get("gpu_quota", 0, variant="mig")
    assert mig.bundle["device"]["mig_profile"] and " MIG " in mig.bundle["device"]["name"]
    assert mig.bundle["device"]["declared_total_bytes"] > mig.bundle["device"]["total_bytes"]
    frac = get("gpu_quota", 0, variant="fraction")
    assert frac.message is not None and " allowed; " in frac.message
    cap = frac.bundle["allocator"]["fraction_cap_bytes"]
    assert cap and frac.bundle["allocator"]["observer"]["device_total_or_cap"] == cap
    small = get("gpu_quota", 0, variant="smaller_device")
    assert small.bundle["device"]["declared_total_bytes"] > small.bundle["device"]["total_bytes"]
    mid = get("other_process", 0, variant="mid_run")
    assert mid.bundle["workload"]["step"] > 1
    assert any(p["pid"] != mid.bundle["workload"]["pid"] for p in mid.bundle["device"]["processes"])
    exp = get("fragmentation", 0, expandable=True)
    assert exp.bundle["allocator"]["settings"]["expandable_segments"] is True
    assert exp.truth["hard_negative"] is True
    frag = get("fragmentation", 1, expandable=False)
    assert frag.truth["verdict"] == "fragmentation"
    a = frag.allocator
    assert a is not None and frag.message is not None
    req = frag.snapshot["device_traces"][a.device][-1]["size"]  # type: ignore[index]
    assert a.reserved - a.allocated_bytes > req > a.largest_free_block()
    hole = get("small_request_big_hole", 0)
    assert hole.message is not None and "Tried to allocate 2.00 MiB" in hole.message
    assert hole.allocator is not None and hole.allocator.largest_free_block() >= 32 * 2**20
    big = get("leak_like_big_batch", 0)
    assert big.bundle["allocator"]["observer"]["alloc_size"] >= 256 * 2**20


def test_host_side_incidents() -> None:
    shm = get("shm_exhausted", 1)
    h = shm.bundle["host"]
    assert h["shm_total_bytes"] <= 1 << 30 and h["shm_used_bytes"] >= 0.97 * h["shm_total_bytes"]
    assert shm.message and ("Bus error" in shm.message or "No space left on device" in shm.message)
    host = get("host_memory_limit", 1)
    cg = host.bundle["host"]["cgroup"]
    assert cg["oom_kill_count"] >= 1 and cg["memory_usage_bytes"] >= 0.97 * cg["memory_limit_bytes"]
    assert host.message and ("Killed" in host.message or "137" in host.message or "-9" in host.message)


def test_labelled_set_covers_every_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "run_scenario", get)  # the same cases as above, computed once
    cases = labelled_set([0])
    assert len(cases) == len(scenario_names()) + 2
    assert {c.truth["family"] for c in cases} == set(scenario_names())
    # five seeds give well over 60 cases
    assert 5 * (len(scenario_names()) + 2) >= 60


def test_layout_matches_a_real_torch_snapshot() -> None:
    """Same keys as a snapshot torch wrote on a real GPU in 2026 (trace entries add only the
    compile_context/user_metadata keys newer torch writes)."""
    real = load_raw(REAL_SNAPSHOTS / "silmont2000__assignment2-systems__133f0643__mem_snapshot.pickle")
    sim = get("workload_too_large", 0).snapshot
    assert sim is not None
    assert set(sim) == set(real)
    assert set(sim["segments"][0]) == set(real["segments"][0])
    assert set(sim["segments"][0]["blocks"][0]) == set(real["segments"][0]["blocks"][0])
    assert set(sim["allocator_settings"]) == set(real["allocator_settings"])
    assert set(sim["allocator_settings"]["roundup_power2_divisions"]) == set(
        real["allocator_settings"]["roundup_power2_divisions"]
    )
    real_entry = real["device_traces"][0][0]
    sim_entry = next(e for t in sim["device_traces"] for e in t)
    assert set(real_entry) <= set(sim_entry) <= set(real_entry) | {"compile_context", "user_metadata"}
    assert set(
        sim["segments"][0]["frames"][0] if sim["segments"][0]["frames"] else real["segments"][0]["frames"][0]
    ) == {
        "name",
        "filename",
        "line",
    }


def test_legacy_layout_of_a_scenario() -> None:
    r = get("workload_too_large", 0)
    legacy = legacy_snapshot(r)
    assert legacy is not None and set(legacy) == {"segments", "device_traces"}
    assert all(
        "history" in b for s in legacy["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    )


# --------------------------------------------------------------------------- big trace


def test_large_trace_snapshot_is_fast_shared_and_consistent() -> None:
    t0 = time.perf_counter()
    snap = large_trace_snapshot(200_000, frames_per_entry=20, seed=1)
    elapsed = time.perf_counter() - t0
    trace = snap["device_traces"][0]
    assert 190_000 <= len(trace) <= 200_000
    assert elapsed < 5
    ids = {id(f) for e in trace[:50_000] for f in e["frames"]}
    assert len(ids) < 400
    mean = sum(len(e["frames"]) for e in trace[:1000]) / 1000
    assert 18 <= mean <= 22
    assert {e["action"] for e in trace} == {"segment_alloc", "alloc", "free_requested", "free_completed"}
    active, mapped = replay(trace)
    want = {
        b["address"]: b["requested_size"]
        for s in snap["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    }
    assert active == want
    assert sum(mapped.values()) == sum(s["total_size"] for s in snap["segments"])
    for s in snap["segments"]:
        assert s["total_size"] == sum(b["size"] for b in s["blocks"])


# --------------------------------------------------------------------------- torch's viewer


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_memory_viz_stats_accepts_a_simulated_snapshot(tmp_path: Path) -> None:
    files = []
    for name, seed in (("fragmentation", 0), ("small_request_big_hole", 0)):
        f = tmp_path / f"{name}.pickle"
        f.write_bytes(pickle.dumps(get(name, seed).snapshot, protocol=4))
        files.append(f)
    legacy = tmp_path / "legacy.pickle"
    legacy.write_bytes(pickle.dumps(legacy_snapshot(get("workload_too_large", 0)), protocol=4))
    files.append(legacy)
    # `python -m torch.cuda._memory_viz stats FILE` for each file, in one interpreter (torch imports once)
    code = (
        "import runpy, sys\n"
        "for f in sys.argv[1:]:\n"
        "    sys.argv = ['_memory_viz', 'stats', f]\n"
        "    runpy.run_module('torch.cuda._memory_viz', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("total_reserved:") == len(files)
    assert "Memory accounting error" not in proc.stderr


# --------------------------------------------------------------------------- CLI


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from triage.cli import main

    assert main(["simulate", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert set(scenario_names()) <= set(listed) and "large" in listed

    out = tmp_path / "w.pickle"
    assert main(["simulate", "workload_too_large", "--seed", "0", "--out", str(out)]) == 0
    truth = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        truth["verdict"] == "workload_too_large"
        and truth["max_batch_size"] == get("workload_too_large").truth["max_batch_size"]
    )
    assert load_raw(out)["segments"]

    bundle = tmp_path / "b.json.gz"
    assert (
        main(["simulate", "gpu_quota", "--param", "variant=fraction", "--bundle", "--out", str(bundle)]) == 0
    )
    data = json.loads(gzip.decompress(bundle.read_bytes()))
    assert data["schema"] == "oom-triage/incident@1" and data["kind"] == "cuda_oom"
    assert isinstance(data["snapshot"]["segments"][0]["segment_pool_id"], list)
    capsys.readouterr()

    js = tmp_path / "h.json"
    assert (
        main(["simulate", "healthy", "--legacy", "--json-snapshot", "--param", "steps=3", "--out", str(js)])
        == 0
    )
    assert '"history"' in js.read_text()
    capsys.readouterr()

    big = tmp_path / "big.pickle"
    assert main(["simulate", "large", "--entries", "3000", "--out", str(big)]) == 0
    assert len(load_raw(big)["device_traces"][0]) > 2900
    capsys.readouterr()

    assert main(["simulate", "no_such", "--out", str(tmp_path / "x")]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert main(["simulate", "shm_exhausted", "--out", str(tmp_path / "y")]) == 2


def test_incident_ids_differ_by_seed_and_params() -> None:
    ids = {
        get("workload_too_large", 0).bundle["incident_id"],
        get("workload_too_large", 1).bundle["incident_id"],
        get("gpu_quota", 0, variant="mig").bundle["incident_id"],
        get("gpu_quota", 0, variant="fraction").bundle["incident_id"],
    }
    assert len(ids) == 4
    assert S.SCHEMA == "oom-triage/incident@1"
