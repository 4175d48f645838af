"""Delivery: POST a spooled bundle to ``{url}/api/v1/incidents`` with retries, within a deadline.

Outcomes of one POST:

- 2xx, 409 → delivered (the bundle is deleted from the spool);
- 408, 429, 5xx, a redirect, a network error or a timeout → try again (backoff) while time is left,
  then leave it spooled for the next process that starts with the collector, or ``triage flush``;
- any other 4xx → rejected for good: moved to ``rejected/`` with the reason.

The same bytes (and so the same ``incident_id``) are sent on every try; the service is idempotent on it.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collector import _log, _spool

PATH = "/api/v1/incidents"
MAX_REQUEST_TIMEOUT_S = 30.0
_BACKOFF_FIRST_S = 0.2
_BACKOFF_MAX_S = 2.0

DELIVERED = "delivered"
RETRY = "retry"
REJECTED = "rejected"


@dataclass(slots=True)
class Outcome:
    result: str  # DELIVERED | RETRY | REJECTED
    status: int | None = None
    reason: str = ""
    answer: dict[str, Any] | None = None
    retry_after: float | None = None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a POST must not silently turn into a GET somewhere else


_opener = urllib.request.build_opener(_NoRedirect)


def _user_agent() -> str:
    from collector import __version__

    return f"oom-triage-collector/{__version__}"


def post(url: str, token: str | None, body: bytes, timeout: float, incident_id: str | None = None) -> Outcome:
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "User-Agent": _user_agent(),
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if incident_id:
        headers["Idempotency-Key"] = incident_id
    req = urllib.request.Request(url.rstrip("/") + PATH, data=body, headers=headers, method="POST")
    try:
        with _opener.open(req, timeout=max(0.05, timeout)) as resp:
            status = resp.status
            raw = resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            raw = exc.read(1 << 16)
        except Exception:
            raw = b""
        finally:
            exc.close()
        text = raw.decode("utf-8", "replace").strip()[:500]
        if status == 409:
            return Outcome(DELIVERED, status, "already known", _json(raw))
        if status in (408, 429) or status >= 500 or 300 <= status < 400:
            retry_after = None
            try:
                ra = exc.headers.get("Retry-After") if exc.headers else None
                retry_after = float(ra) if ra else None
            except (TypeError, ValueError):
                pass
            where = f" to {exc.headers.get('Location')}" if 300 <= status < 400 and exc.headers else ""
            return Outcome(RETRY, status, f"HTTP {status}{where} {text}".strip(), retry_after=retry_after)
        return Outcome(REJECTED, status, f"HTTP {status}: {text}")
    except Exception as exc:  # URLError, timeouts, connection resets, bad URLs …
        return Outcome(RETRY, None, f"{type(exc).__name__}: {exc}")
    if 200 <= status < 300:
        return Outcome(DELIVERED, status, "", _json(raw))
    return Outcome(RETRY, status, f"HTTP {status}")


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        v = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return v if isinstance(v, dict) else None


def deliver(
    url: str,
    token: str | None,
    body: bytes,
    deadline: float,
    incident_id: str | None = None,
    on_retry: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """POST until delivered, rejected, or ``deadline`` (``time.monotonic()``) is reached."""
    delay = _BACKOFF_FIRST_S
    last = Outcome(RETRY, None, "no time left to try")
    while True:
        left = deadline - time.monotonic()
        if left <= 0.02:
            return last
        last = post(url, token, body, min(left, MAX_REQUEST_TIMEOUT_S), incident_id)
        if last.result != RETRY:
            return last
        if on_retry is not None:
            on_retry(last)
        pause = delay * (0.75 + 0.5 * random.random())
        if last.retry_after is not None:
            pause = max(pause, min(last.retry_after, 60.0))
        left = deadline - time.monotonic()
        if pause >= left:
            return last
        time.sleep(pause)
        delay = min(delay * 2, _BACKOFF_MAX_S)


def verdict_line(incident_id: str, answer: dict[str, Any] | None) -> str:
    a = answer or {}
    verdict = a.get("verdict")
    ticket = a.get("ticket_url")
    v = f"verdict {verdict}" if verdict else "verdict pending (analysis still running)"
    return f"incident {a.get('incident_id') or incident_id}: {v}" + (f"; ticket {ticket}" if ticket else "")


def send_claim(
    claim: _spool.Claim, url: str, token: str | None, deadline: float, announce: bool = True
) -> Outcome:
    """Send one locked bundle; on success delete it, on refusal move it to rejected/, else keep it."""
    try:
        body = claim.read()
    except OSError as exc:
        claim.release()
        return Outcome(RETRY, None, f"unreadable: {exc}")
    out = deliver(url, token, body, deadline, claim.incident_id)
    if out.result == DELIVERED:
        # the line first, then the file: whoever sees the spool empty (a process about to exit) knows the
        # line was written; dying in between only resends a bundle the service takes once by its id
        if announce:
            _log.say(verdict_line(claim.incident_id, out.answer))
        claim.delivered()
    elif out.result == REJECTED:
        claim.reject(out.reason)
        _log.say(
            f"incident {claim.incident_id} refused by the service ({out.reason}); kept in {claim.spool.path}/rejected/"
        )
    else:
        claim.release()
    return out


def flush_spool(
    spool: _spool.Spool,
    url: str,
    token: str | None,
    deadline: float,
    *,
    announce: bool = True,
    per_bundle_s: float | None = None,
) -> dict[str, list[tuple[str, Outcome | None]]]:
    """Send every spooled bundle this process can lock, oldest first. Returns what happened to each."""
    spool.clean_tmp()
    report: dict[str, list[tuple[str, Outcome | None]]] = {DELIVERED: [], REJECTED: [], RETRY: [], "busy": []}
    for path in spool.pending():
        now = time.monotonic()
        if deadline - now <= 0.02:
            report[RETRY].append((path, None))
            continue
        claim = spool.claim(path)
        if claim is None:
            report["busy"].append((path, None))
            continue
        d = deadline if per_bundle_s is None else min(deadline, now + per_bundle_s)
        out = send_claim(claim, url, token, d, announce)
        report[out.result].append((path, out))
    return report


class Sender:
    """One background thread that delivers crash bundles; ``wait`` bounds how long exit waits for it."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token
        self._cv = threading.Condition()
        self._jobs: list[tuple[Callable[[], None], float]] = []
        self._busy = 0
        self._thread: threading.Thread | None = None
        self.last_deadline = 0.0

    def submit_path(self, spool: _spool.Spool, path: str, deadline: float) -> None:
        def job() -> None:
            claim = spool.claim(path)
            if claim is None:  # someone else is sending it (or already did)
                return
            out = send_claim(claim, self.url, self.token, deadline)
            if out.result == RETRY:
                _log.say(
                    f"incident {claim.incident_id} not delivered yet ({out.reason}); "
                    f"kept in {spool.path} for the next start or `triage flush`"
                )

        self._submit(job, deadline)

    def submit_body(self, incident_id: str, body: bytes, deadline: float) -> None:
        def job() -> None:
            out = deliver(self.url, self.token, body, deadline, incident_id)
            if out.result == DELIVERED:
                _log.say(verdict_line(incident_id, out.answer))
            else:
                _log.say(
                    f"incident {incident_id} not delivered ({out.reason}) and it could not be spooled: lost"
                )

        self._submit(job, deadline)

    def _submit(self, job: Callable[[], None], deadline: float) -> None:
        with self._cv:
            self._jobs.append((job, deadline))
            self._busy += 1
            self.last_deadline = max(self.last_deadline, deadline)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="oom-triage-sender", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    if not self._cv.wait(timeout=30.0) and not self._jobs:
                        self._thread = None
                        return
                job, _deadline = self._jobs.pop(0)
            try:
                job()
            except Exception as exc:  # never let the thread die silently with work queued
                _log.debug(f"sender job failed: {type(exc).__name__}: {exc}")
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def wait(self, deadline: float) -> bool:
        """Block until every submitted bundle is handled or ``deadline``; True when nothing is left."""
        with self._cv:
            while self._busy > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(timeout=left)
            return True
