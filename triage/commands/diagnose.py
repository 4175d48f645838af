"""`triage diagnose LOGFILE`: diagnose from the error text alone (a crash log, a pasted message)."""

from __future__ import annotations

import argparse

from triage.commands.common import positive_int


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diagnose",
        help="diagnose from a crash log or OOM message",
        description="Diagnose an OOM from its log text. Says `inconclusive` with the candidates when the "
        "text cannot decide (a leak and a too-large batch look the same at the moment of failure).",
    )
    p.add_argument("logfile", help="log file, or - for standard input")
    p.add_argument("--batch-size", type=positive_int, help="the batch size of the failing step")
    p.add_argument("--json", action="store_true", help="print the Diagnosis as JSON")
    p.add_argument("--html", metavar="OUT", help="also write a standalone HTML report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from triage.commands.common import emit, read_text
    from triage.pipeline import diagnose_text

    text = read_text(args.logfile)
    d, ev = diagnose_text(text, batch_size=args.batch_size)
    return emit(d, ev, args, title=f"triage diagnose {args.logfile}")
