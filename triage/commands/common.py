"""Shared pieces of the commands: reading text input, printing a Diagnosis."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from triage.errors import InputError

if TYPE_CHECKING:
    from triage.diagnosis import Diagnosis
    from triage.evidence import Evidence

MAX_TEXT_BYTES = 256 * 1024 * 1024


def read_text(path: str) -> str:
    """A log or message file ('-' for stdin), decoded leniently; a clear error when unreadable."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        else:
            p = Path(path)
            if p.is_dir():
                raise InputError(f"{path}: is a directory")
            with p.open("rb") as f:
                data = f.read(MAX_TEXT_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})")
    if len(data) > MAX_TEXT_BYTES:
        raise InputError(f"{path}: larger than {MAX_TEXT_BYTES} bytes")
    if b"\x00" in data[:4096] and not data.lstrip().startswith((b"{", b"[")):
        raise InputError(
            f"{path}: binary data, not a log or error text (a snapshot is the argument of `triage replay`, not its --message-file)"
        )
    return data.decode("utf-8", errors="replace")


def emit(d: Diagnosis, ev: Evidence, args: argparse.Namespace, *, title: str) -> int:
    if getattr(args, "html", None):
        from triage.render import render_html

        try:
            Path(args.html).write_text(render_html(d, ev, title), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{args.html}: cannot write the HTML report ({exc.strerror or exc})")
    if args.json:
        sys.stdout.write(json.dumps(d.to_dict(), indent=2, default=str))
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    from triage.render import render_terminal

    render_terminal(d, ev, Console(), top=getattr(args, "top", 8))
    return 0
