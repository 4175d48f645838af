"""Lines on stderr, prefixed ``oom-triage:``. Writing can never raise (stderr may be closed at exit)."""

from __future__ import annotations

import os
import sys

PREFIX = "oom-triage: "
_debug = False
_said: set[str] = set()


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


def say(msg: str) -> None:
    line = PREFIX + msg.rstrip("\n") + "\n"
    try:
        err = sys.stderr
        if err is not None:
            err.write(line)
            err.flush()
            return
    except Exception:
        pass
    try:
        os.write(2, line.encode("utf-8", "replace"))
    except Exception:
        pass


def say_once(key: str, msg: str) -> None:
    """At most one line per ``key`` for the life of the process."""
    if key in _said:
        return
    _said.add(key)
    say(msg)


def debug(msg: str) -> None:
    if _debug:
        say("debug: " + msg)
