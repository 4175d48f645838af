"""One analysis: load a stored bundle, run the engine, return the Diagnosis JSON.

Runs in a child process by default (`AnalysisProcess`): a snapshot of hundreds of MB is parsed there, so
the server's memory never holds one, and a stuck analysis is killed at its time limit. This module
imports only the analysis pipeline (not the server stack), so the child starts quickly.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import multiprocessing.connection
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO, cast

from triage.schemas import IncidentBundle

BIG_BUNDLE_BYTES = 64 << 20  # restart the child after analysing one this large (returns its memory)
TASKS_PER_CHILD = 500


class AnalysisError(Exception):
    """The analysis failed; the message is what the incident's `last_error` shows."""


class AnalysisTimeout(AnalysisError):
    pass


class InvalidInput(AnalysisError):
    """The bundle itself cannot be analysed (the same on every try): failed at once, no retry."""


def _open(path: Path, encoding: str) -> BinaryIO:
    if encoding == "gzip":
        return cast(BinaryIO, gzip.GzipFile(path, "rb"))
    return path.open("rb")


_K8S_CLIENT: list[Any] = []  # the analysis process's Kubernetes client, loaded once (or None)


def _kube_client(mode: str) -> Any:
    """`auto`: the in-cluster (or kubeconfig) client when one is configured; `on`: required; `off`: none."""
    if mode == "off":
        return None
    if not _K8S_CLIENT:
        try:
            from triage.k8s.client import load_client, load_client_or_none

            _K8S_CLIENT.append(
                load_client(request_timeout=5) if mode == "on" else load_client_or_none(request_timeout=5)
            )
        except ImportError:  # the k8s extra is not installed
            if mode == "on":
                raise
            _K8S_CLIENT.append(None)
    return _K8S_CLIENT[0]


def _enrich(bundle: dict[str, Any], mode: str) -> dict[str, Any]:
    """Add the pod's facts (limits, shm volume, MIG profile, node GPU, owner, team) when the bundle names one."""
    wl = bundle.get("workload")
    if not isinstance(wl, dict) or not wl.get("namespace") or not wl.get("pod") or "k8s" in bundle:
        return bundle
    client = _kube_client(mode)
    if client is None:
        return bundle
    from triage.k8s.enrich import enrich_bundle

    return enrich_bundle(bundle, client)


def analyse_blob(path: str, encoding: str, k8s_enrich: str = "off") -> dict[str, Any]:
    """Diagnose one stored bundle; the Diagnosis as JSON-ready data."""
    from pydantic import ValidationError

    from triage.errors import InputError
    from triage.pipeline import diagnose_bundle

    with _open(Path(path), encoding) as f:
        bundle = json.load(f)
    if not isinstance(bundle, dict):
        raise InvalidInput("the bundle is not a JSON object")
    try:
        IncidentBundle.model_validate(bundle)
    except ValidationError as exc:
        raise InvalidInput(f"invalid bundle: {exc}")
    bundle = _enrich(bundle, k8s_enrich)
    try:
        diagnosis, _ev = diagnose_bundle(bundle)
    except InputError as exc:
        raise InvalidInput(f"{type(exc).__name__}: {exc}")
    out: dict[str, Any] = json.loads(json.dumps(diagnosis.to_dict(), default=str))
    return out


def _child(conn: multiprocessing.connection.Connection) -> None:
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if request is None:
            return
        try:
            conn.send(("ok", analyse_blob(*request)))
        except InvalidInput as exc:
            conn.send(("invalid", str(exc)))
        except BaseException as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            conn.send(("error", f"{detail}\n{traceback.format_exc(limit=-8)}"))


class AnalysisProcess:
    """A long-lived child process that runs analyses one at a time, killed and replaced on a timeout."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._tasks = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child, args=(child,), name="triage-analysis", daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn, self._tasks = proc, parent, 0

    def run(
        self, path: str, encoding: str, *, timeout: float, size: int = 0, k8s_enrich: str = "off"
    ) -> dict[str, Any]:
        """Analyse in the child; raises AnalysisTimeout / AnalysisError."""
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._start()
        proc, conn = self._proc, self._conn
        assert proc is not None and conn is not None
        deadline = time.monotonic() + timeout
        try:
            conn.send((path, encoding, k8s_enrich))
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    raise AnalysisTimeout(f"the analysis did not finish within {timeout:g} s (killed)")
                if conn.poll(min(left, 0.5)):
                    status, value = conn.recv()
                    break
                if not proc.is_alive():
                    raise EOFError
        except (EOFError, OSError):
            code = proc.exitcode
            self.close()
            raise AnalysisError(f"the analysis process died (exit code {code}; out of memory?)")
        self._tasks += 1
        if size >= BIG_BUNDLE_BYTES or self._tasks >= TASKS_PER_CHILD:
            self.close()
        if status == "invalid":
            raise InvalidInput(str(value))
        if status != "ok":
            raise AnalysisError(str(value))
        return value

    def close(self) -> None:
        """Stop the child (killing it if it is busy)."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        if proc is not None:
            proc.join(timeout=0.2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
