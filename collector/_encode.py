"""The bundle as gzip'd JSON, fast enough for a 100,000-entry allocator trace at crash time.

Two costs dominate, and both grow with the trace's stacks, not its entries: every trace entry carries its
own list of ~10-40 frame dicts, so the JSON text is ~2 KB per entry (200 MB for 100,000 entries), and
``json.dumps`` on it takes seconds. What keeps it fast:

- ``_snapshot()`` shares frame *dicts* between entries (a few hundred distinct ones), so each distinct
  stack is encoded once: entries are dumped with a short marker in place of their frames, in one C-speed
  ``json.dumps`` call, and the markers are then replaced by the cached text of their stack;
- the text is compressed at level 1 in 4 MiB chunks on a few threads (zlib releases the GIL), each chunk
  primed with the previous chunk's last 32 KiB, and the chunks joined into **one** ordinary gzip member
  (sync-flushed raw deflate, one CRC-32 and length): any gzip reader decodes it.

The output is exactly the JSON that ``json.dumps`` would give (tuples become lists), byte for byte in
meaning; nothing about the wire format is special.
"""

from __future__ import annotations

import gc
import json
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

CHUNK = 4 << 20
LEVEL = 1
_WINDOW = 32 << 10
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown

_dumps: Callable[[Any], str] = json.JSONEncoder(
    separators=(",", ":"), default=str, check_circular=False, allow_nan=True
).encode
# A marker json.dumps cannot produce from real data: \x01 is escaped to \u0001 inside a string.
_MARK = re.compile(r'"\\u0001(\d+)\\u0001"')


class GzipWriter:
    """Streams text into a single-member gzip file, compressing chunks on up to ``threads`` threads."""

    def __init__(
        self, out: IO[bytes], *, level: int = LEVEL, threads: int | None = None, chunk: int = CHUNK
    ) -> None:
        self._out = out
        self._level = level
        self._chunk = chunk
        self._buf: list[bytes] = []
        self._buffered = 0
        self._crc = 0
        self._size = 0
        self._tail = b""
        n = threads if threads is not None else min(4, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="oom-triage-gzip") if n > 1 else None
        self._pending: list[Future[bytes]] = []
        out.write(_GZIP_HEADER)

    def _deflate(self, data: bytes, zdict: bytes, final: bool) -> bytes:
        if zdict:
            co = zlib.compressobj(self._level, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
        else:
            co = zlib.compressobj(self._level, zlib.DEFLATED, -15)
        return co.compress(data) + co.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)

    def _emit(self, final: bool) -> None:
        data = b"".join(self._buf)
        self._buf.clear()
        self._buffered = 0
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        zdict, self._tail = self._tail, data[-_WINDOW:]
        if self._pool is None:
            self._out.write(self._deflate(data, zdict, final))
            return
        self._pending.append(self._pool.submit(self._deflate, data, zdict, final))
        # write finished chunks in order; bound the chunks in flight (memory)
        while self._pending and (self._pending[0].done() or len(self._pending) > 8):
            self._out.write(self._pending.pop(0).result())

    def write(self, text: str) -> None:
        b = text.encode("utf-8", "surrogatepass")
        self._buf.append(b)
        self._buffered += len(b)
        if self._buffered >= self._chunk:
            self._emit(False)

    def writelines(self, texts: Iterable[str]) -> None:
        for t in texts:
            self.write(t)

    def close(self) -> None:
        try:
            self._emit(True)
            while self._pending:
                self._out.write(self._pending.pop(0).result())
            self._out.write(struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)


def dumps(obj: Any) -> str:
    """Compact JSON; anything that is not JSON becomes its ``str``."""
    return _dumps(obj)


def snapshot_pieces(snap: dict[str, Any]) -> list[str]:
    """The JSON text of a ``_snapshot()`` dict, as pieces to write in order.

    Consumes ``snap``: frame lists inside it are replaced by markers while encoding (a fresh
    ``_snapshot()`` result belongs to us alone, and copying 100,000 entries would double the cost).
    """
    frame_text: dict[int, str] = {}
    by_list: dict[int, str] = {}
    by_frames: dict[tuple[int, ...], str] = {}
    stacks: list[str] = []
    keep: list[Any] = []  # keeps every keyed list alive, so no id() is reused while we encode

    def marker(frames: list[Any]) -> str:
        key = tuple(map(id, frames))
        m = by_frames.get(key)
        if m is None:
            parts = []
            for f in frames:
                t = frame_text.get(id(f))
                if t is None:
                    t = frame_text[id(f)] = _dumps(f)
                    keep.append(f)
                parts.append(t)
            m = by_frames[key] = f"\x01{len(stacks)}\x01"
            stacks.append("[" + ",".join(parts) + "]")
        return m

    refs = 0

    def swap(items: list[Any]) -> None:
        nonlocal refs
        get_list = by_list.get
        for e in items:
            if type(e) is not dict:
                continue
            fr = e.get("frames")
            if type(fr) is not list or not fr:
                continue
            m = get_list(id(fr))
            if m is None:
                m = by_list[id(fr)] = marker(fr)
                keep.append(fr)
            e["frames"] = m
            refs += 1

    traces = snap.get("device_traces")
    if type(traces) is list:
        for tr in traces:
            if type(tr) is list:
                swap(tr)
    segments = snap.get("segments")
    if type(segments) is list:
        swap(segments)
        for seg in segments:
            blocks = seg.get("blocks") if type(seg) is dict else None
            if type(blocks) is list:
                swap(blocks)
                for b in blocks:  # legacy (torch 2.0) blocks keep their frames in ``history``
                    if type(b) is dict and type(b.get("history")) is list:
                        swap(b["history"])
    text = _dumps(snap)
    if not stacks:
        return [text]
    pieces = _MARK.split(text)
    if (len(pieces) - 1) // 2 != refs:  # pragma: no cover - a string in the data looked like a marker
        raise ValueError("snapshot text holds marker-like strings")
    for i in range(1, len(pieces), 2):
        pieces[i] = stacks[int(pieces[i])]
    return pieces


def write_bundle(
    out: IO[bytes], head: dict[str, Any], snapshot: Any, tail: Callable[[], dict[str, Any]]
) -> None:
    """``{**head, "snapshot": snapshot, **tail()}`` as gzip'd JSON. ``tail`` is called after the snapshot is
    encoded, so it can report how long that took."""
    w = GzipWriter(out)
    gc_was_on = gc.isenabled()
    gc.disable()  # the encoding makes ~10^6 short-lived objects: no full collections over a big heap meanwhile
    try:
        h = _dumps(head)
        w.write(h[:-1] + ("," if len(h) > 2 else "") + '"snapshot":')
        if isinstance(snapshot, dict):
            try:
                pieces = snapshot_pieces(snapshot)
            except ValueError:
                pieces = [_dumps(snapshot)]  # pragma: no cover
            w.writelines(pieces)
        else:
            w.write(_dumps(snapshot))
        t = _dumps(tail())
        w.write(("," + t[1:]) if len(t) > 2 else "}")
    finally:
        if gc_was_on:
            gc.enable()
        w.close()
