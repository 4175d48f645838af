"""Reading stored bundles for the pages, and turning a bundle's snapshot back into a torch pickle.

- :func:`bundle_facts`: the bundle's small fields (workload, device, host, environment, error, per-step
  timeline, allocator) through the service's bounded-memory scan; the snapshot is skipped, never built.
  Cached per stored file.
- :func:`export_snapshot`: ``python -m triage.web.export BLOB ENCODING OUT`` in a child process (the web
  process never holds a snapshot): the bundle's snapshot as the plain builtins ``torch.cuda.memory.
  _snapshot()`` returns, written with ``pickle.dumps``, which pytorch.org/memory_viz and
  ``python -m torch.cuda._memory_viz`` open. JSON turned tuples into lists: ``segment_pool_id`` becomes a
  tuple again. Frame dicts and frame lists are shared again (as in the allocator's own pickle), so the
  file stays the size of the original, not of the JSON.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, cast

from triage.errors import InputError

FACT_KEYS = (
    "workload",
    "device",
    "host",
    "environment",
    "error",
    "timeline",
    "allocator",
    "kind",
    "occurred_at",
)
_CACHE_MAX = 64
_cache: OrderedDict[str, tuple[dict[str, Any], bool]] = OrderedDict()
_lock = threading.Lock()

EXIT_NO_SNAPSHOT = 3
EXIT_BAD = 2


class NoSnapshot(InputError):
    """The bundle carries no snapshot (a log-only incident)."""


def _open(path: Path, encoding: str) -> IO[bytes]:
    if encoding == "gzip":
        return cast(IO[bytes], gzip.GzipFile(path, "rb"))
    return path.open("rb")


def bundle_facts(path: Path, encoding: str, *, max_bytes: int = 8 << 30) -> tuple[dict[str, Any], bool]:
    """(the bundle's small top-level fields, whether it carries a snapshot); bounded memory, cached."""
    from triage.service.bundlescan import GunzipReader, scan_bundle

    key = f"{path}:{encoding}"
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    with path.open("rb") as raw:
        scan = scan_bundle(GunzipReader(raw, gzipped=encoding == "gzip", max_bytes=max_bytes))
    facts = {k: scan.fields.get(k) for k in FACT_KEYS if k in scan.fields}
    result = (facts, scan.snapshot == "object")
    with _lock:
        _cache[key] = result
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return result


def stream_file(path: Path, encoding: str, chunk: int = 1 << 16) -> Any:
    """The stored bundle, decompressed, in chunks (for a download)."""
    with _open(path, encoding) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return
            yield data


def _share(snapshot: Any) -> Any:
    """Restore what JSON lost: tuples for segment_pool_id, shared frame dicts and frame lists."""
    frames: dict[tuple[Any, ...], dict[str, Any]] = {}
    stacks: dict[tuple[int, ...], list[dict[str, Any]]] = {}

    def frame(f: Any) -> Any:
        if not isinstance(f, dict):
            return f
        key = tuple(
            sorted((k, v) for k, v in f.items() if isinstance(v, str | int | float | bool) or v is None)
        )
        if len(key) != len(f):
            return f
        return frames.setdefault(key, f)

    def stack(fs: Any) -> Any:
        if not isinstance(fs, list):
            return fs
        shared = [frame(f) for f in fs]
        return stacks.setdefault(tuple(id(f) for f in shared), shared)

    def holder(d: Any) -> None:
        if isinstance(d, dict) and "frames" in d:
            d["frames"] = stack(d["frames"])

    if not isinstance(snapshot, dict):
        return snapshot
    for seg in snapshot.get("segments") or []:
        if not isinstance(seg, dict):
            continue
        pool = seg.get("segment_pool_id")
        if isinstance(pool, list):
            seg["segment_pool_id"] = tuple(pool)
        holder(seg)
        for block in seg.get("blocks") or []:
            holder(block)
            if isinstance(block, dict):
                for h in block.get("history") or []:
                    holder(h)
    for trace in snapshot.get("device_traces") or []:
        for entry in trace if isinstance(trace, list) else []:
            holder(entry)
    return snapshot


def snapshot_pickle(path: Path, encoding: str) -> bytes:
    """The bundle's snapshot as the pickle torch's tools read (runs in the child process)."""
    with _open(path, encoding) as f:
        bundle = json.load(f)
    snapshot = bundle.get("snapshot") if isinstance(bundle, dict) else None
    if not isinstance(snapshot, dict):
        raise NoSnapshot("this incident's bundle has no allocator snapshot")
    return pickle.dumps(_share(snapshot), protocol=4)


def export_snapshot(path: Path, encoding: str, out: Path, *, timeout_s: float = 300.0) -> None:
    """Write the snapshot pickle to ``out`` from a child process; raises NoSnapshot / InputError."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "triage.web.export", str(path), encoding, str(out)],
            capture_output=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InputError(f"exporting the snapshot took longer than {timeout_s:.0f} s") from None
    if r.returncode == EXIT_NO_SNAPSHOT:
        raise NoSnapshot("this incident's bundle has no allocator snapshot")
    if r.returncode != 0:
        tail = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"the snapshot could not be exported: {tail[0][:300]}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m triage.web.export BLOB gzip|identity OUT", file=sys.stderr)
        return EXIT_BAD
    path, encoding, out = Path(argv[0]), argv[1], Path(argv[2])
    try:
        data = snapshot_pickle(path, encoding)
    except NoSnapshot as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_NO_SNAPSHOT
    except (OSError, ValueError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BAD
    tmp = out.with_suffix(out.suffix + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
