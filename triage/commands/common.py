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
BINARY_SAMPLE = 65536  # bytes looked at to tell a binary file from a text
_TEXT_CONTROL = frozenset(b"\t\n\r\x0b\x0c\x08\x1b")  # control bytes a log may carry (tabs, colours, tqdm)


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
    if b"\x00" in data[:BINARY_SAMPLE] and not data.lstrip().startswith((b"{", b"[")):
        # runs of NULs in a text (a log rotated with copytruncate, a writer that crashed) are dropped
        sample = data[:BINARY_SAMPLE].replace(b"\x00", b"")
        control = sum(1 for c in sample if c < 0x20 and c not in _TEXT_CONTROL)
        if not sample.strip() or control > 0.02 * len(sample):
            raise InputError(
                f"{path}: binary data, not a log or error text (a snapshot is the argument of `triage replay`, not its --message-file)"
            )
        data = data.replace(b"\x00", b"")
    if not data.strip():
        raise InputError(f"{path}: empty: no log or error text in it")
    return data.decode("utf-8", errors="replace")


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (a batch size)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    return n


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
