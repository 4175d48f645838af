"""Reading a stored bundle back in bounded memory: gunzip with a size cap and a hash, then a JSON scan
that keeps the small top-level fields and only checks the snapshot's syntax.

A bundle can be hundreds of MB, nearly all of it the allocator snapshot. The scan decodes JSON with the
standard library's C decoder one element at a time: any value that does not fit in the window is
descended into and its children decoded and dropped, so memory stays around the window whatever the
size, and no snapshot is ever built in the server's memory (the worker loads it in a child process).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from typing import IO, Any

from triage.errors import InputError, InputTooLarge

READ_CHUNK = 256 * 1024
WINDOW_CHARS = 1 << 20  # a value larger than this is descended into instead of decoded whole
FIELD_CHARS = 4 << 20  # a top-level field (other than the snapshot) kept up to this size
MAX_DEPTH = 200
SKIPPED_KEYS = frozenset({"snapshot"})

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class BadBundle(InputError):
    """The body is not gzip'd JSON of the right shape; the message says where."""


class _TooLarge(Exception):
    pass


class GunzipReader:
    """A file-like `read(n)` over a gzip (or plain) file: decompresses with a cap, counts and hashes."""

    def __init__(self, raw: IO[bytes], *, gzipped: bool, max_bytes: int) -> None:
        self.raw = raw
        self.gzipped = gzipped
        self.max_bytes = max_bytes
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._dec: Any = zlib.decompressobj(wbits=31) if gzipped else None
        self._pending = b""  # compressed input not yet fed
        self._eof = False
        self._members = 0

    def read(self, n: int = READ_CHUNK) -> bytes:
        """Up to `n` decompressed bytes; b'' at the end."""
        if not self.gzipped:
            data = self.raw.read(n)
            self._count(data)
            return data
        while True:
            if self._dec.unconsumed_tail:
                out = self._dec.decompress(self._dec.unconsumed_tail, n)
            elif self._dec.eof:
                rest = self._dec.unused_data + self._pending
                self._pending = b""
                if not rest:
                    rest = self.raw.read(READ_CHUNK)
                if not rest:
                    self._eof = True
                    return b""
                if rest.strip(b"\x00") == b"":  # trailing zero padding after the last member
                    continue
                self._dec = zlib.decompressobj(wbits=31)
                out = self._safe(rest, n)
            else:
                chunk = self._pending or self.raw.read(READ_CHUNK)
                self._pending = b""
                if not chunk:
                    raise BadBundle("the gzip stream ends early (truncated upload)")
                out = self._safe(chunk, n)
            if out:
                self._count(out)
                return out
            if self._dec.eof:
                self._members += 1

    def _safe(self, data: bytes, n: int) -> bytes:
        try:
            return bytes(self._dec.decompress(data, n))
        except zlib.error as exc:
            raise BadBundle(f"not a valid gzip stream ({exc})")

    def _count(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise InputTooLarge(f"the decompressed bundle exceeds {self.max_bytes} bytes")
        self.sha256.update(data)

    def drain(self) -> None:
        """Read to the end (so that size and hash cover everything)."""
        while self.read(READ_CHUNK):
            pass


@dataclass
class Scan:
    """What the scan keeps: the top-level fields (the snapshot and over-large fields left out)."""

    fields: dict[str, Any] = field(default_factory=dict)
    snapshot: str = "absent"  # absent | null | object | <json type name>
    skipped: list[str] = field(default_factory=list)


class _Source:
    def __init__(self, stream: GunzipReader) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.buf = ""
        self.pos = 0
        self.eof = False

    def fill(self, want: int = READ_CHUNK) -> bool:
        """Read at least `want` more bytes (or to the end); False at the end."""
        if self.eof:
            return False
        data = self.stream.read(max(want, READ_CHUNK))
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise BadBundle(f"the bundle is not UTF-8 ({exc.reason})")
        if not data:
            self.eof = True
        self.buf = self.buf[self.pos :] + text
        self.pos = 0
        return bool(text) or not self.eof

    def peek(self) -> str:
        """The next non-blank character ('' at the end)."""
        while True:
            m = _WS.match(self.buf, self.pos)
            self.pos = m.end() if m else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, ch: str, what: str) -> None:
        got = self.peek()
        if got != ch:
            raise BadBundle(f"malformed JSON: expected {ch!r} {what}, found {got or 'the end'!r}")
        self.pos += 1

    def value(self, limit: int) -> Any:
        """Decode the next value whole; `_TooLarge` when it spans more than `limit` characters."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise BadBundle(f"malformed JSON: {exc.msg}")
                if len(self.buf) - self.pos > limit:
                    raise _TooLarge
                self.fill(len(self.buf) - self.pos)
                continue
            except RecursionError:
                raise BadBundle("malformed JSON: nested too deeply")
            if end >= len(self.buf) and not self.eof:
                # a number or literal may continue in the next chunk: decode again with more text
                self.fill()
                continue
            if end - self.pos > limit:
                raise _TooLarge
            self.pos = end
            return obj

    def skip(self, depth: int) -> None:
        """Check the next value's syntax without keeping it."""
        if depth > MAX_DEPTH:
            raise BadBundle("malformed JSON: nested too deeply")
        c = self.peek()
        try:
            self.value(WINDOW_CHARS)
            return
        except _TooLarge:
            if c not in "{[":
                raise BadBundle("a string or number in the bundle is larger than the scan window")
        close = "}" if c == "{" else "]"
        self.pos += 1
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            if close == "}":
                if self.peek() != '"':
                    raise BadBundle("malformed JSON: expected a key")
                self.value(WINDOW_CHARS)
                self.expect(":", "after a key")
            self.skip(depth + 1)
            c = self.peek()
            self.pos += 1
            if c == close:
                return
            if c != ",":
                raise BadBundle(f"malformed JSON: expected ',' or {close!r}, found {c or 'the end'!r}")


_TYPE_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


def scan_bundle(stream: GunzipReader, *, field_chars: int = FIELD_CHARS) -> Scan:
    """The bundle's top-level fields (bounded), its snapshot's type, and a syntax check of everything."""
    src = _Source(stream)
    scan = Scan()
    if src.peek() != "{":
        raise BadBundle("the bundle must be a JSON object")
    src.pos += 1
    if src.peek() == "}":
        src.pos += 1
    else:
        while True:
            if src.peek() != '"':
                raise BadBundle("malformed JSON: expected a key")
            try:
                key = src.value(WINDOW_CHARS)
            except _TooLarge:
                raise BadBundle("a key in the bundle is absurdly long")
            src.expect(":", "after a key")
            if key in SKIPPED_KEYS:
                c = src.peek()
                if c == "{":
                    scan.snapshot = "object"
                    src.skip(1)
                else:
                    v = src.value(WINDOW_CHARS)
                    scan.snapshot = "null" if v is None else _TYPE_NAMES.get(type(v), "value")
            else:
                try:
                    scan.fields[key] = src.value(field_chars)
                    if key in scan.skipped:
                        scan.skipped.remove(key)
                except _TooLarge:
                    scan.fields.pop(key, None)
                    scan.skipped.append(key)
                    src.skip(1)
            c = src.peek()
            src.pos += 1
            if c == "}":
                break
            if c != ",":
                raise BadBundle(f"malformed JSON: expected ',' or '}}', found {c or 'the end'!r}")
    if src.peek() != "":
        raise BadBundle("malformed JSON: extra data after the bundle")
    stream.drain()
    return scan
