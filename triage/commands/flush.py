"""`triage flush`: send the incident bundles a collector left in its spool (the service was down).

Uses the collector's own spool and sender (standard library only), so it sends exactly what a
restarted training process would: the same bytes, the same incident ids, the same locking, so it is
safe to run while training processes on the node flush the same spool.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "flush",
        help="send spooled incident bundles to the triage service",
        description="Send the incident bundles left in a collector spool. Exit 0 when none is left.",
    )
    p.add_argument("--spool", help="spool directory (default: $TRIAGE_SPOOL or $TMPDIR/oom-triage-spool)")
    p.add_argument("--url", help="the triage service (default: $TRIAGE_URL)")
    p.add_argument("--token", help="bearer token (default: $TRIAGE_TOKEN)")
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="give up after this long (default 60)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from collector import _config, _send, _spool
    from triage.errors import InputError

    cfg, _ = _config.load(url=args.url, token=args.token, spool=args.spool)
    if cfg.url is None:
        raise InputError("no service URL: pass --url or set TRIAGE_URL")
    if not os.path.isdir(cfg.spool):
        print(f"nothing to send: {cfg.spool} does not exist")
        return 0
    spool = _spool.Spool(cfg.spool, cfg.spool_max_bytes)
    report = _send.flush_spool(spool, cfg.url, cfg.token, time.monotonic() + args.timeout, announce=False)
    for path, out in report[_send.DELIVERED]:
        iid = os.path.basename(path).removesuffix(_spool.SUFFIX)
        print(f"delivered {_send.verdict_line(iid, out.answer if out else None)}")
    for path, out in report[_send.REJECTED]:
        print(
            f"rejected {os.path.basename(path)}: {out.reason if out else ''} (moved to {cfg.spool}/rejected/)"
        )
    for path, out in report[_send.RETRY]:
        print(f"kept {os.path.basename(path)}: {out.reason if out else 'no time left'}")
    for path, _ in report["busy"]:
        print(f"skipped {os.path.basename(path)}: another process is sending it")
    left = spool.pending()
    if not any(report.values()):
        print(f"nothing to send in {cfg.spool}")
    return 0 if not left and not report[_send.REJECTED] else 1
