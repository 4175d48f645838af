"""`triage replay PATH`: diagnose a saved snapshot offline (never imports torch)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from triage.commands.common import positive_int

if TYPE_CHECKING:
    from triage.snapshot.model import Snapshot


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="diagnose a snapshot saved with torch.cuda.memory._dump_snapshot",
        description="Diagnose a CUDA memory snapshot (.pickle, .pickle.gz, .json, .json.gz) offline. "
        "Exit codes: 0 ok, 2 bad input.",
    )
    p.add_argument("path", help="snapshot file")
    p.add_argument("--message-file", help="file with the OOM error text or log (adds the message's facts)")
    p.add_argument(
        "--batch-size", type=positive_int, help="the batch size of the failing step (for max_batch_size)"
    )
    p.add_argument("--json", action="store_true", help="print the Diagnosis as JSON")
    p.add_argument("--html", metavar="OUT", help="also write a standalone HTML report")
    p.add_argument(
        "--user-code", action="append", default=[], metavar="GLOB", help="paths that count as user code"
    )
    p.add_argument(
        "--library", action="append", default=[], metavar="GLOB", help="extra paths that are not user code"
    )
    p.add_argument("--top", type=int, default=8, help="allocation sites to show")
    p.add_argument(
        "--no-rules",
        action="store_true",
        help="accounting, timeline and allocation sites only (verdict stays inconclusive)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        help="refuse inputs (or their decompressed form) larger than this (default: $TRIAGE_MAX_SNAPSHOT_BYTES or 4 GiB)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gc

    gc.disable()  # a one-shot process over millions of acyclic objects: the cyclic collector only costs time
    from triage.commands.common import emit, read_text
    from triage.errors import NotASnapshot
    from triage.pipeline import diagnose_bundle, diagnose_snapshot
    from triage.snapshot.frames import FrameClassifier

    message = read_text(args.message_file) if args.message_file else None
    classifier = FrameClassifier.with_patterns(args.user_code, args.library)
    max_bytes = _max_bytes(args.max_bytes)
    try:
        snapshot = _load_with_progress(args.path, quiet=args.json, max_bytes=max_bytes)
    except NotASnapshot:
        # an incident bundle (what the collector spools, or the service's bundle.json download) replays too
        bundle = _bundle_or_none(args.path, max_bytes)
        if bundle is None:
            raise
        if args.batch_size:
            bundle.setdefault("workload", {})["batch_size"] = args.batch_size
        if message:
            bundle.setdefault("error", {})["message"] = message
        d, ev = diagnose_bundle(bundle, classifier=classifier)
        return emit(d, ev, args, title=f"triage replay {args.path}")
    d, ev = diagnose_snapshot(
        snapshot, message=message, batch_size=args.batch_size, classifier=classifier, rules=not args.no_rules
    )
    return emit(d, ev, args, title=f"triage replay {args.path}")


def _bundle_or_none(path: str, max_bytes: int) -> dict[str, Any] | None:
    from triage.snapshot.loader import load_raw

    raw = load_raw(path, max_bytes=max_bytes)
    if isinstance(raw, dict) and raw.get("schema") == "oom-triage/incident@1":
        if not isinstance(raw.get("workload"), dict):
            raw["workload"] = {}
        if not isinstance(raw.get("error"), dict):
            raw["error"] = {}
        return raw
    return None


def _max_bytes(arg: int | None) -> int:
    import os

    from triage.errors import InputError
    from triage.snapshot.loader import DEFAULT_MAX_BYTES

    if arg is not None:
        return arg
    env = os.environ.get("TRIAGE_MAX_SNAPSHOT_BYTES")
    if env:
        try:
            return int(env)
        except ValueError:
            raise InputError(f"TRIAGE_MAX_SNAPSHOT_BYTES={env!r} is not a number of bytes")
    return DEFAULT_MAX_BYTES


def _load_with_progress(path: str, quiet: bool, max_bytes: int) -> Snapshot:
    import os

    from triage.snapshot.loader import load_snapshot

    size = 0
    try:
        size = os.path.getsize(path)
    except OSError:
        pass
    if quiet or size < 32 * 1024 * 1024:
        return load_snapshot(path, max_bytes=max_bytes)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("loading"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("load", total=size)
        return load_snapshot(
            path, max_bytes=max_bytes, progress=lambda done, _total: bar.update(task, completed=done)
        )
