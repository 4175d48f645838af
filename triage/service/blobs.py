"""The blob directory: incident bundles as received, one file each, written durably before the row.

Layout: `tmp/<random>.part` while a body streams in; `YYYY/MM/DD/<incident_id>-<random>.json[.gz]` once
complete (fsync'd, renamed, directory fsync'd). The random part keeps two concurrent uploads of the same
incident from overwriting each other; the database row names the one that won.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import time
from pathlib import Path
from typing import IO

TMP = "tmp"


class BlobStore:
    """Files under one root directory (local disk, or a volume shared by the replicas)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / TMP

    def ensure(self) -> None:
        """Create the directories (at start)."""
        self.tmp.mkdir(parents=True, exist_ok=True)

    def new_temp(self) -> Path:
        """A fresh temp path for an upload in progress."""
        return self.tmp / f"{secrets.token_hex(12)}.part"

    def commit(self, tmp: Path, *, incident_id: str, at: dt.datetime, gzipped: bool) -> str:
        """Make a complete, fsync'd temp file permanent; returns its path relative to the root."""
        rel = Path(f"{at:%Y/%m/%d}") / f"{incident_id}-{secrets.token_hex(4)}.json{'.gz' if gzipped else ''}"
        final = self.root / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return rel.as_posix()

    def open(self, rel: str) -> IO[bytes]:
        """The stored file, for reading."""
        return (self.root / rel).open("rb")

    def path(self, rel: str) -> Path:
        return self.root / rel

    def delete(self, rel: str | Path) -> None:
        """Remove a stored or temp file (missing is fine)."""
        path = rel if isinstance(rel, Path) else self.root / rel
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def sweep_temp(self, *, older_than_s: float) -> int:
        """Delete upload leftovers (a server killed mid-upload) older than the given age."""
        if not self.tmp.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in os.scandir(self.tmp):
            try:
                if entry.name.endswith(".part") and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def writable(self) -> bool:
        """Whether a file can be created and removed in the temp directory (readiness)."""
        probe = self.tmp / f".ready-{secrets.token_hex(4)}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
            return True
        except OSError:
            return False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
