"""Safe loading of snapshot files: pickle, JSON, either gzip'd, or an already-decoded object.

Snapshots are untrusted. The pickle path uses the C unpickler with a ``find_class`` that refuses
**every** global and a ``persistent_load`` that refuses every id, so no opcode can reach a callable:
GLOBAL/STACK_GLOBAL/INST go through ``find_class``; REDUCE/OBJ/NEWOBJ/BUILD need a callable or class
on the stack, which only ``find_class`` could have put there; EXT1/2/4 resolve through ``find_class``
as well. Further bounds:

- size: the file (and, for gzip, the decompressed stream) may not exceed ``max_bytes``;
- memory: while unpickling, the process's address space may grow by at most ``memory_budget`` bytes
  (``RLIMIT_AS``). This catches memo bombs (a 12-byte pickle with ``LONG_BINPUT 0x10000000`` makes the
  C unpickler allocate and zero a 4 GiB memo table) and any other construct whose objects dwarf the input;
- nesting: the C unpickler keeps its own stack (no recursion), our validation walks only the known
  snapshot shape and never recurses into unknown values, and JSON nesting beyond Python's recursion
  limit is refused as too deep;
- sharing: frame dicts shared through the pickle memo stay shared; JSON (which has no sharing) has its
  frames interned so that memory does not grow with repeated stacks.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import pickle
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import repeat
from pathlib import Path
from typing import IO, Any

from triage.errors import (
    ForbiddenGlobal,
    InputError,
    InputTooLarge,
    MemoBomb,
    NotAPickle,
    NotASnapshot,
    TooDeep,
    TruncatedInput,
)
from triage.snapshot.model import (
    INACTIVE,
    Block,
    RawFrame,
    Segment,
    Snapshot,
    frame_fields,
)

DEFAULT_MAX_BYTES = 4 * 1024**3
_GZIP_MAGIC = b"\x1f\x8b"


class _RefusingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ForbiddenGlobal(f"pickle references the global {module}.{name}; refused (nothing was run)")

    def persistent_load(self, pid: Any) -> Any:
        raise ForbiddenGlobal(f"pickle uses a persistent id ({str(pid)[:60]!r}); refused")


class _BoundedReader(io.RawIOBase):
    """A readable stream that fails once more than ``limit`` bytes came through."""

    def __init__(self, raw: IO[bytes], limit: int, what: str) -> None:
        self._raw = raw
        self._limit = limit
        self._seen = 0
        self._what = what

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._raw.readinto(b)  # type: ignore[attr-defined]
        if n:
            self._seen += n
            if self._seen > self._limit:
                raise InputTooLarge(f"{self._what} exceeds {self._limit} bytes")
        return n or 0


class _ProgressReader:
    """File-like wrapper that reports bytes consumed (the C unpickler reads 64 KiB frames through it)."""

    def __init__(self, raw: IO[bytes], report: Callable[[int], None]) -> None:
        self._raw = raw
        self._report = report

    def _tell(self) -> None:
        self._report(self._raw.tell())

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._tell()
        return data

    def readinto(self, b: Any) -> int:
        n = self._raw.readinto(b)  # type: ignore[attr-defined]
        self._tell()
        return int(n or 0)

    def readline(self, limit: int = -1) -> bytes:
        return self._raw.readline(limit)

    def peek(self, n: int = 0) -> bytes:
        return self._raw.peek(n)  # type: ignore[attr-defined]


def _vm_size() -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextmanager
def _memory_guard(budget: int | None) -> Iterator[None]:
    """Bound the growth of the address space while untrusted data is decoded (Linux; no-op elsewhere)."""
    if not budget:
        yield
        return
    try:
        import resource
    except ImportError:  # pragma: no cover - not Linux
        yield
        return
    vm = _vm_size()
    if vm is None:  # pragma: no cover
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield
        return
    with _GUARD_LOCK:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


_GUARD_LOCK = threading.Lock()


def default_memory_budget(input_bytes: int) -> int:
    """What decoding a snapshot may use: decoded Python objects take up to ~20x the pickle's bytes."""
    return max(1024**3, 24 * input_bytes)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding creates millions of acyclic objects; the cyclic collector would scan them again and
    again for nothing (about a third of the decode time). Paused for the decode, restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _unpickle(stream: IO[bytes], what: str) -> Any:
    try:
        with _gc_paused():
            return _RefusingUnpickler(stream).load()
    except ForbiddenGlobal as exc:
        raise ForbiddenGlobal(f"{what}: {exc}") from None
    except InputError:
        raise
    except MemoryError:
        raise MemoBomb(
            f"{what}: decoding would exceed the memory bound (a length, memo index or object count far "
            "beyond the input's size); refused"
        )
    except EOFError:
        raise TruncatedInput(f"{what}: pickle data ends early (truncated)")
    except RecursionError:
        raise TooDeep(f"{what}: nesting too deep")
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TruncatedInput(f"{what}: pickle data was truncated")
        raise NotAPickle(f"{what}: not a valid pickle ({text})")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        raise NotAPickle(f"{what}: not a valid pickle ({type(exc).__name__}: {exc})")


def _decode_json(data: bytes, what: str) -> Any:
    try:
        with _gc_paused():
            return json.loads(data)
    except RecursionError:
        raise TooDeep(f"{what}: JSON nested too deeply")
    except MemoryError:
        raise MemoBomb(f"{what}: decoding would exceed the memory bound")
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(data.rstrip()) - 1:
            raise TruncatedInput(f"{what}: JSON ends early (truncated)")
        raise NotAPickle(f"{what}: neither a pickle nor valid JSON ({exc})")


def _looks_like_json(head: bytes) -> bool:
    stripped = head.lstrip()
    return stripped[:1] in (b"{", b"[")


def _read_gzip(raw: IO[bytes], max_bytes: int, what: str) -> bytes:
    out = bytearray()
    gz = gzip.GzipFile(fileobj=raw)
    try:
        while True:
            chunk = gz.read(1 << 20)
            if not chunk:
                break
            out += chunk
            if len(out) > max_bytes:
                raise InputTooLarge(
                    f"{what}: decompresses to more than {max_bytes} bytes (gzip bomb?); refused"
                )
    except EOFError:
        raise TruncatedInput(f"{what}: gzip stream ends early (truncated)")
    except (OSError, zlib.error) as exc:
        raise NotAPickle(f"{what}: broken gzip stream ({exc})")
    return bytes(out)


def load_raw(
    source: str | os.PathLike[str] | bytes,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    memory_budget: int | None = -1,
) -> Any:
    """Decode a snapshot file (or bytes) to plain Python objects without running anything.

    ``memory_budget=-1`` picks a budget from the input size; ``None`` disables the memory guard.
    """
    return _load(source, max_bytes, memory_budget)[0]


def _load(
    source: str | os.PathLike[str] | bytes,
    max_bytes: int,
    memory_budget: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Any, bool]:
    """Decode; also say whether the input was JSON (no shared frames)."""
    if isinstance(source, bytes | bytearray):
        what = "<bytes>"
        if len(source) > max_bytes:
            raise InputTooLarge(f"{what}: {len(source)} bytes exceeds the {max_bytes}-byte limit")
        return _decode_bytes(bytes(source), max_bytes, memory_budget, what)
    path = Path(source)
    what = str(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise InputError(f"{what}: no such file")
    except IsADirectoryError:
        raise InputError(f"{what}: is a directory")
    except OSError as exc:
        raise InputError(f"{what}: cannot read ({exc.strerror or exc})")
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise InputTooLarge(f"{what}: {size} bytes exceeds the {max_bytes}-byte limit")
        if size == 0:
            raise TruncatedInput(f"{what}: empty file")
        head = f.peek(64)[:64] if hasattr(f, "peek") else b""
        budget = default_memory_budget(size) if memory_budget == -1 else memory_budget
        if head.startswith(_GZIP_MAGIC):
            data = _read_gzip(f, max_bytes, what)
            budget = default_memory_budget(len(data)) if memory_budget == -1 else memory_budget
            return _decode_bytes(data, max_bytes, budget, what)
        if _looks_like_json(head):
            return _decode_bytes(f.read(), max_bytes, budget, what)
        stream: Any = f if progress is None else _ProgressReader(f, lambda pos: progress(pos, size))
        with _memory_guard(budget):
            return _unpickle(stream, what), False


def _decode_bytes(data: bytes, max_bytes: int, memory_budget: int | None, what: str) -> tuple[Any, bool]:
    if not data:
        raise TruncatedInput(f"{what}: empty input")
    if data[:2] == _GZIP_MAGIC:
        data = _read_gzip(io.BytesIO(data), max_bytes, what)
    budget = default_memory_budget(len(data)) if memory_budget == -1 else memory_budget
    with _memory_guard(budget):
        if _looks_like_json(data[:64]):
            return _decode_json(data, what), True
        return _unpickle(io.BytesIO(data), what), False


# --------------------------------------------------------------------------- normalisation


def _intern_frames(frames: Any, table: dict[tuple[Any, ...], RawFrame]) -> list[RawFrame]:
    out: list[RawFrame] = []
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        key = frame_fields(fr)
        got = table.get(key)
        if got is None:
            if (fr.get("name"), fr.get("filename"), fr.get("line")) != key:
                fr = {**fr, "name": key[0], "filename": key[1], "line": key[2]}
            table[key] = got = fr
        out.append(got)
    return out


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _frames(v: Any, table: dict[tuple[Any, ...], RawFrame] | None) -> list[RawFrame]:
    if not isinstance(v, list):
        return []
    if table is not None:
        return _intern_frames(v, table)
    return v


def _block(
    b: Any, seg_addr: int, offset: int, table: dict[tuple[Any, ...], RawFrame] | None, what: str
) -> Block:
    if not isinstance(b, dict) or not isinstance(b.get("size"), int):
        raise NotASnapshot(f"{what}: a block is not a dict with an integer size")
    size = b["size"]
    state = b.get("state", INACTIVE)
    if not isinstance(state, str):
        raise NotASnapshot(f"{what}: a block's state is not a string")
    frames: list[RawFrame] = []
    if "frames" in b:
        frames = _frames(b["frames"], table)
        requested = _int(b.get("requested_size"), size)
        address = _int(b.get("address"), seg_addr + offset)
    else:  # torch 2.0: the history carries the address, the real size and the stack
        hist = b.get("history")
        h0 = hist[0] if isinstance(hist, list) and hist and isinstance(hist[0], dict) else None
        if h0 is not None:
            frames = _frames(h0.get("frames"), table)
            requested = _int(h0.get("real_size"), size)
            address = _int(h0.get("addr"), seg_addr + offset)
        else:
            requested = _int(b.get("requested_size"), size)
            address = seg_addr + offset
    return Block(address=address, size=size, requested_size=requested, state=state, frames=frames)


def _segments(raw: Any, table: dict[tuple[Any, ...], RawFrame] | None, what: str) -> list[Segment]:
    if not isinstance(raw, list):
        raise NotASnapshot(f"{what}: `segments` is not a list")
    out: list[Segment] = []
    for s in raw:
        if not isinstance(s, dict) or not isinstance(s.get("blocks"), list):
            raise NotASnapshot(f"{what}: a segment is not a dict with a `blocks` list")
        addr = _int(s.get("address"))
        pool = s.get("segment_pool_id", (0, 0))
        pool_id = (
            (_int(pool[0]), _int(pool[1])) if isinstance(pool, tuple | list) and len(pool) == 2 else (0, 0)
        )
        seg = Segment(
            device=_int(s.get("device")),
            address=addr,
            total_size=_int(s.get("total_size")),
            stream=_int(s.get("stream")),
            segment_type=str(s.get("segment_type", "large")),
            pool_id=pool_id,
            is_expandable=bool(s.get("is_expandable", False)),
            frames=_frames(s.get("frames"), table),
            blocks=[],
        )
        offset = 0
        blocks = seg.blocks
        for b in s["blocks"]:
            blk = _block(b, addr, offset, table, what)
            blk.segment = seg
            blocks.append(blk)
            offset += blk.size
        if not seg.total_size:
            seg.total_size = offset
        out.append(seg)
    return out


def _traces(raw: Any, table: dict[tuple[Any, ...], RawFrame] | None, what: str) -> list[list[dict[str, Any]]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise NotASnapshot(f"{what}: `device_traces` is not a list")
    out: list[list[dict[str, Any]]] = []
    for t in raw:
        if not isinstance(t, list):
            raise NotASnapshot(f"{what}: a device trace is not a list")
        if not all(map(isinstance, t, repeat(dict))):
            raise NotASnapshot(f"{what}: trace entries are not all dicts")
        if table is not None:
            for e in t:
                if isinstance(e, dict) and isinstance(e.get("frames"), list):
                    e["frames"] = _intern_frames(e["frames"], table)
        out.append(t)
    return out


MAX_DEPTH = 32  # a snapshot nests 6 deep (dict > segments > segment > blocks > block > frames > frame)


def _nesting_exceeds(obj: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` along any first-child path (iterative)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while stack and seen < 100_000:
        cur, depth = stack.pop()
        seen += 1
        if depth > limit:
            return True
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for v in list(cur.values())[:4])
        elif isinstance(cur, list | tuple):
            stack.extend((v, depth + 1) for v in cur[:4])
    return False


def normalise(obj: Any, *, source: str = "", shared_frames: bool = True) -> Snapshot:
    """Turn a decoded snapshot (dict, or the segments list) into the model.

    ``shared_frames=False`` (JSON input) interns frame dicts so that equal frames share one object.
    """
    try:
        return _normalise(obj, source, shared_frames)
    except NotASnapshot:
        if _nesting_exceeds(obj, MAX_DEPTH):
            raise TooDeep(f"{source or 'snapshot'}: not a snapshot: nested deeper than {MAX_DEPTH} levels")
        raise


def _normalise(obj: Any, source: str, shared_frames: bool) -> Snapshot:
    what = source or "snapshot"
    table: dict[tuple[Any, ...], RawFrame] | None = None if shared_frames else {}
    if isinstance(obj, list):
        segs = _segments(obj, table, what)
        return Snapshot(segs, [], {}, [], era="segments-only", source=source)
    if not isinstance(obj, dict):
        raise NotASnapshot(f"{what}: decoded to {type(obj).__name__}, not a snapshot dict or segment list")
    if "segments" not in obj:
        keys = ", ".join(sorted(str(k) for k in list(obj)[:8]))
        raise NotASnapshot(f"{what}: no `segments` key (keys: {keys or 'none'})")
    segs = _segments(obj["segments"], table, what)
    traces = _traces(obj.get("device_traces", obj.get("traces")), table, what)
    settings = obj.get("allocator_settings")
    annotations = obj.get("external_annotations")
    if isinstance(settings, dict) or "external_annotations" in obj:
        era = "v2025"
    elif "history" in _raw_first_block(obj):
        era = "legacy"
    else:
        era = "v2"
    return Snapshot(
        segments=segs,
        device_traces=traces,
        allocator_settings=settings if isinstance(settings, dict) else {},
        external_annotations=[a for a in annotations if isinstance(a, dict)]
        if isinstance(annotations, list)
        else [],
        era=era,
        source=source,
    )


def _raw_first_block(obj: dict[str, Any]) -> dict[str, Any]:
    for s in obj.get("segments") or []:
        for b in s.get("blocks") or []:
            return b if isinstance(b, dict) else {}
    return {}


def load_snapshot(
    source: str | os.PathLike[str] | bytes | dict[str, Any] | list[Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> Snapshot:
    """Load a snapshot from a path, bytes, or an already-decoded dict/list (e.g. a bundle's JSON).

    ``progress(done_bytes, total_bytes)`` is called as a plain pickle file is read.
    """
    if isinstance(source, dict | list):
        return normalise(source, source="<object>", shared_frames=False)
    raw, is_json = _load(source, max_bytes, -1, progress)
    name = "<bytes>" if isinstance(source, bytes | bytearray) else str(source)
    return normalise(raw, source=name, shared_frames=not is_json)
