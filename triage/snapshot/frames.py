"""Which frames are *user code*: the training script, not torch, not libraries, not C++.

A frame is user code unless one of these says otherwise (first match wins, in this order):
1. it is a C++ frame: ``filename`` is ``"??"`` or empty, or ``line`` is 0;
2. its filename matches one of ``user`` patterns → user code (to claim a vendored package as yours);
3. its filename matches one of ``library`` patterns → not user code;
4. it is a console-script wrapper pip wrote (``…/bin/NAME`` with no extension: ``torchrun``, ``accelerate``,
   ``deepspeed``, ``vllm``) → not user code: it only calls a package's entry point.

The default library patterns are the places Python code comes from that is not the job's own:
``site-packages``, ``dist-packages``, the standard library (``/lib/pythonX.Y/``), frozen and
generated modules (``<frozen …>``, ``<string>``), and a ``torch/`` package directory anywhere.
Windows paths (backslashes) are matched after normalising to ``/``. Patterns are ``fnmatch`` globs
on the normalised path; add your own with ``triage replay --user-code GLOB --library GLOB``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triage.snapshot.model import frame_fields

DEFAULT_LIBRARY_PATTERNS: tuple[str, ...] = (
    "*/site-packages/*",
    "*/dist-packages/*",
    "*/lib/python[0-9]*/*",
    "*/lib/pypy*/*",
    "<*>",
    "*/torch/*",
    "torch/*",
    "*/conda/pkgs/*",
)

_RE_SCRIPT = re.compile(r"/bin/[^/.]+$")  # a console-script wrapper: ``/usr/local/bin/torchrun``
_CPP_NAMES = re.compile(r"\.(cpp|cc|cxx|c|h|hpp|cu|cuh)$")


@dataclass(frozen=True, slots=True)
class Site:
    """An allocation site: the innermost user-code frame of a stack (or the best stand-in)."""

    filename: str
    line: int
    name: str
    kind: str = "user"  # "user" | "library" (no user frame) | "native" (C++ only) | "unknown" (no stack)

    @property
    def label(self) -> str:
        if self.kind == "unknown":
            return "<no stack recorded>"
        if self.kind == "native":
            return "<C++ frames only>"
        short = self.filename.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{short}:{self.line} in {self.name}"

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "line": self.line, "name": self.name}


UNKNOWN_SITE = Site("", 0, "", kind="unknown")
NATIVE_SITE = Site("", 0, "", kind="native")


@dataclass
class FrameClassifier:
    library: Sequence[str] = DEFAULT_LIBRARY_PATTERNS
    user: Sequence[str] = ()
    _cache: dict[int, tuple[bool, bool]] = field(default_factory=dict, repr=False)
    _keep: list[Any] = field(default_factory=list, repr=False)
    _stack_cache: dict[int, Site] = field(default_factory=dict, repr=False)

    @classmethod
    def with_patterns(cls, user: Iterable[str] = (), library: Iterable[str] = ()) -> FrameClassifier:
        return cls(library=(*DEFAULT_LIBRARY_PATTERNS, *library), user=tuple(user))

    def classify(self, frame: dict[str, Any]) -> tuple[bool, bool]:
        """(is_python, is_user) for one frame dict; cached by object identity (frames are shared)."""
        key = id(frame)
        got = self._cache.get(key)
        if got is not None:
            return got
        filename = frame.get("filename") or ""
        line = frame.get("line") or 0
        name = frame.get("name")
        if not isinstance(filename, str) or not isinstance(line, int) or not isinstance(name, str | None):
            # an untrusted file put something else in the frame: it reads as unknown, here once for every
            # reader of this frame
            frame["name"], frame["filename"], frame["line"] = frame_fields(frame)
            filename, line = frame["filename"], frame["line"]
        is_python = filename not in ("??", "") and isinstance(line, int) and line > 0
        if is_python and _CPP_NAMES.search(filename):
            is_python = False
        is_user = False
        if is_python:
            path = filename.replace("\\", "/")
            if any(fnmatch.fnmatchcase(path, p) for p in self.user):
                is_user = True
            else:
                is_user = not any(
                    fnmatch.fnmatchcase(path, p) for p in self.library
                ) and not _RE_SCRIPT.search(path)
        got = (is_python, is_user)
        self._cache[key] = got
        self._keep.append(frame)  # keep the id stable while cached
        return got

    def site(self, frames: Sequence[dict[str, Any]] | None) -> Site:
        """The innermost user frame; else the innermost Python frame; else the innermost frame."""
        if not frames:
            return UNKNOWN_SITE
        key = id(frames)
        got = self._stack_cache.get(key)
        if got is not None:
            return got
        first_python: dict[str, Any] | None = None
        chosen: Site | None = None
        for fr in frames:
            if not isinstance(fr, dict):
                continue
            is_python, is_user = self.classify(fr)
            if is_user:
                chosen = _site(fr, "user")
                break
            if is_python and first_python is None:
                first_python = fr
        if chosen is None:
            chosen = _site(first_python, "library") if first_python is not None else NATIVE_SITE
        self._stack_cache[key] = chosen
        self._keep.append(frames)
        return chosen

    def user_stack(self, frames: Sequence[dict[str, Any]] | None, limit: int = 12) -> list[dict[str, Any]]:
        """The Python frames of a stack, innermost first, C++ frames dropped, each marked user or not."""
        out: list[dict[str, Any]] = []
        for fr in frames or ():
            if not isinstance(fr, dict):
                continue
            is_python, is_user = self.classify(fr)
            if is_python:
                out.append(
                    {
                        "filename": fr.get("filename"),
                        "line": fr.get("line"),
                        "name": fr.get("name"),
                        "user": is_user,
                    }
                )
                if len(out) >= limit:
                    break
        return out


def _site(fr: dict[str, Any], kind: str) -> Site:
    line = fr.get("line")
    return Site(
        str(fr.get("filename") or ""), line if isinstance(line, int) else 0, str(fr.get("name") or ""), kind
    )
