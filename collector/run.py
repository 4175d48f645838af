"""``triage-run [options] -- COMMAND [ARGS…]``: run a training command with the collector active.

The command replaces this process (``exec``), so its exit code, signals and output are its own. The
collector is activated in every Python process it starts (torchrun ranks included) through the
environment: ``TRIAGE_*`` variables and a ``sitecustomize`` put first on ``PYTHONPATH``, which works
whether or not the package's auto-activation ``.pth`` is installed in the command's Python.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triage-run",
        description="Run a training command with the oom-triage collector active in its Python processes.",
        epilog="Example: triage-run --url http://oom-triage:8080 -- torchrun --nproc-per-node 8 train.py",
    )
    p.add_argument("--url", help="the triage service (default: $TRIAGE_URL)")
    p.add_argument(
        "--token", help="bearer token (default: $TRIAGE_TOKEN); prefer the variable: argv is visible"
    )
    p.add_argument("--spool", help="spool directory (default: $TRIAGE_SPOOL or $TMPDIR/oom-triage-spool)")
    p.add_argument(
        "--send-budget",
        type=float,
        metavar="SECONDS",
        help="how long a crash may wait for delivery (default 5)",
    )
    p.add_argument(
        "--history-max-entries", type=int, metavar="N", help="allocator trace ring size (default 100000)"
    )
    p.add_argument("--no-history", action="store_true", help="do not record the allocator's history")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    return p


def child_env(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if args.url:
        env["TRIAGE_URL"] = args.url
    if args.token:
        env["TRIAGE_TOKEN"] = args.token
    if args.spool:
        env["TRIAGE_SPOOL"] = args.spool
    if args.send_budget is not None:
        env["TRIAGE_SEND_BUDGET"] = str(args.send_budget)
    if args.history_max_entries is not None:
        env["TRIAGE_HISTORY_MAX_ENTRIES"] = str(args.history_max_entries)
    if args.no_history:
        env["TRIAGE_HISTORY"] = "0"
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOT]
    env["PYTHONPATH"] = os.pathsep.join([BOOT, *parts])
    env["TRIAGE_COLLECTOR_SRC"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given (triage-run [options] -- COMMAND [ARGS…])")
    env = child_env(args, dict(os.environ))
    if not env.get("TRIAGE_URL", "").strip():
        print("triage-run: no service URL (--url or TRIAGE_URL): the collector stays off", file=sys.stderr)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"triage-run: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
