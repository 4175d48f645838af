"""``triage simulate``: write a simulated snapshot (or incident bundle) with its ground truth.

    triage simulate SCENARIO --out FILE [--seed N] [--param key=value ...] [--bundle] [--legacy]
                             [--json-snapshot]
    triage simulate large --entries N --out FILE [--frames-per-entry K] [--seed N]
    triage simulate --list

The snapshot is written as a pickle of plain builtins (protocol 4, like torch's ``_dump_snapshot``),
or as JSON with ``--json-snapshot``; ``--bundle`` writes the incident bundle as gzip'd JSON. The truth
is printed as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
from pathlib import Path
from typing import Any

from triage.errors import InputError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="write a simulated OOM snapshot or incident bundle with its ground truth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", help="scenario name (see --list), or 'large' for a big trace")
    p.add_argument("--out", "-o", help="output file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scenario parameter (repeatable; values are parsed as JSON when they can be)",
    )
    p.add_argument("--bundle", action="store_true", help="write the incident bundle (gzip'd JSON)")
    p.add_argument("--legacy", action="store_true", help="torch 2.0 snapshot layout (block history)")
    p.add_argument("--json-snapshot", action="store_true", help="write the snapshot as JSON, not pickle")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--entries", type=int, default=1_000_000, help="trace entries (scenario 'large')")
    p.add_argument("--frames-per-entry", type=int, default=20, help="frames per entry (scenario 'large')")
    p.set_defaults(func=run)


def _params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--param wants KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _jsonable(obj: Any) -> Any:
    """JSON-ready copy of a snapshot: tuples become lists (frames stay shared until dumped)."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def _write(path: Path, data: bytes) -> None:
    if str(path) == "-":
        sys.stdout.buffer.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def run(args: argparse.Namespace) -> int:
    from triage.simulate.scenarios import large_trace_snapshot, run_scenario, scenario_names

    if args.list:
        for name in scenario_names():
            print(name)
        print("large")
        return 0
    if not args.scenario:
        raise InputError("a scenario name is required (see --list)")
    if not args.out:
        raise InputError("--out FILE is required")
    out = Path(args.out)
    if args.scenario == "large":
        if args.entries <= 0:
            raise InputError("--entries must be positive")
        snap = large_trace_snapshot(args.entries, args.frames_per_entry, args.seed)
        if args.json_snapshot:
            _write(out, json.dumps(_jsonable(snap)).encode())
        else:
            _write(out, pickle.dumps(snap, protocol=4))
        n = len(snap["device_traces"][0])
        print(json.dumps({"scenario": "large", "seed": args.seed, "trace_entries": n}))
        return 0
    result = run_scenario(args.scenario, args.seed, **_params(args.param))
    if args.bundle:
        bundle = result.bundle
        if args.legacy and result.snapshot is not None:
            from triage.simulate import scenarios

            legacy = scenarios.legacy_snapshot(result)
            bundle = {**bundle, "snapshot": legacy}
        _write(out, gzip.compress(json.dumps(_jsonable(bundle)).encode(), mtime=0))
    else:
        if result.snapshot is None:
            raise InputError(
                f"scenario {args.scenario} is a host-side incident with no snapshot; use --bundle"
            )
        snap = result.snapshot
        if args.legacy:
            from triage.simulate import scenarios

            snap = scenarios.legacy_snapshot(result) or snap
        if args.json_snapshot:
            _write(out, json.dumps(_jsonable(snap)).encode())
        else:
            _write(out, pickle.dumps(snap, protocol=4))
    truth = dict(result.truth)
    truth.update({"scenario": result.name, "seed": result.seed, "message": result.message})
    print(json.dumps(truth, sort_keys=True), file=sys.stderr if str(out) == "-" else sys.stdout)
    return 0
