"""The spool: bundles on disk until the service has them.

- A bundle is written to ``.<id>.<pid>.tmp`` and renamed to ``<id>.json.gz`` after an fsync, so a reader
  sees a whole bundle or none. The file's bytes are exactly the HTTP body (gzip'd JSON).
- Whoever sends a bundle first takes an exclusive ``flock`` on it and deletes it only after the service
  acknowledged it; the lock dies with its process. Two processes flushing the same spool (ranks of one
  node, a restarted pod, ``triage flush``) never both send one bundle.
- A bundle the service refuses for good (4xx other than 408/429) moves to ``rejected/`` with a
  ``.reason.txt`` beside it: kept for a person, never retried.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from typing import IO

from collector import _log

SUFFIX = ".json.gz"
REJECTED = "rejected"
_TMP_MAX_AGE_S = 3600.0


class Claim:
    """A bundle this process holds the lock on. Call ``delivered``, ``reject`` or ``release``."""

    def __init__(self, spool: Spool, path: str, fd: int) -> None:
        self.spool = spool
        self.path = path
        self.fd = fd
        self.incident_id = os.path.basename(path)[: -len(SUFFIX)]

    def read(self) -> bytes:
        chunks = []
        os.lseek(self.fd, 0, os.SEEK_SET)
        while True:
            b = os.read(self.fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)

    def delivered(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.release()

    def reject(self, reason: str) -> None:
        try:
            d = os.path.join(self.spool.path, REJECTED)
            os.makedirs(d, exist_ok=True)
            name = os.path.basename(self.path)
            with open(os.path.join(d, name[: -len(SUFFIX)] + ".reason.txt"), "w", encoding="utf-8") as f:
                f.write(reason.rstrip() + "\n")
            os.replace(self.path, os.path.join(d, name))
        except OSError as exc:
            _log.debug(f"could not move {self.path} to {REJECTED}/: {exc}")
        self.release()

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = -1


class Spool:
    def __init__(self, path: str, max_bytes: int = 2 << 30) -> None:
        self.path = path
        self.max_bytes = max_bytes

    def write(self, incident_id: str, fill: Callable[[IO[bytes]], None]) -> str:
        """Write a bundle atomically; returns its path. Raises OSError when the spool is unusable."""
        os.makedirs(self.path, exist_ok=True)
        self._make_room()
        final = os.path.join(self.path, incident_id + SUFFIX)
        tmp = os.path.join(self.path, f".{incident_id}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            dfd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
        return final

    def pending(self) -> list[str]:
        """Complete bundles, oldest first."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        found = []
        for n in names:
            if n.endswith(SUFFIX) and not n.startswith("."):
                p = os.path.join(self.path, n)
                try:
                    found.append((os.stat(p).st_mtime, n, p))
                except OSError:
                    continue
        return [p for _, _, p in sorted(found)]

    def claim(self, path: str) -> Claim | None:
        """Lock a bundle for sending; ``None`` when another process has it or it is gone."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            # gone (delivered by whoever held the lock before us) or replaced since we opened it
            if st.st_nlink == 0 or os.stat(path).st_ino != st.st_ino:
                raise OSError("bundle no longer spooled")
        except OSError:
            os.close(fd)
            return None
        return Claim(self, path, fd)

    def clean_tmp(self) -> None:
        """Remove temporary files left by writers that died more than an hour ago."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        now = time.time()
        for n in names:
            if n.startswith(".") and n.endswith(".tmp"):
                p = os.path.join(self.path, n)
                with contextlib.suppress(OSError):
                    if now - os.stat(p).st_mtime > _TMP_MAX_AGE_S:
                        os.unlink(p)

    def _make_room(self) -> None:
        paths = self.pending()
        sizes = []
        for p in paths:
            try:
                sizes.append(os.stat(p).st_size)
            except OSError:
                sizes.append(0)
        total = sum(sizes)
        for p, size in zip(paths, sizes, strict=True):
            if total <= self.max_bytes:
                break
            c = self.claim(p)
            if c is None:
                continue
            _log.say(
                f"spool {self.path} is over {self.max_bytes // (1 << 20)} MiB: dropped the oldest bundle {c.incident_id}"
            )
            c.delivered()
            total -= size
