"""`triage watch`: crashed training containers → incident bundles → the service, for pods with no collector.

Pods that never installed the collector, and every crash no in-process hook sees (the kernel's OOM killer
sends SIGKILL), still leave their evidence in the pod: the container's terminated state and its log tail.
The watcher lists and then watches pods (a label selector, one namespace or all), and for every terminated
*training container* (one asking for a GPU or MIG slice, or named with `--container` or the pod annotation
`oom-triage.io/container`):

- reason `OOMKilled`, or exit code 137 on a pod that is not being deleted → a `host_oom` incident with the
  termination (`error.exit_code`), the container's memory limit and the cgroup facts (the kill itself:
  `oom_kill_count` 1), the /dev/shm facts, the log tail for people (`k8s.log_tail`, not parsed);
- any other non-zero exit → the log tail (`terminated.message` when the log is gone) goes through
  `triage.messages.parse_messages`, the parser `triage diagnose` uses; a CUDA OOM, shm or host-OOM message
  makes an incident of that kind with the log in `error` (the service's pipeline parses it again, exactly
  like `triage diagnose`). A log whose collector line says the collector delivered its own incident
  (`oom-triage: incident <id>: verdict …`) is left to the collector: one crash, one incident.

Each bundle also carries the pod facts of `triage.k8s.enrich.pod_facts` and is POSTed gzip'd with the
bearer token to `{url}/api/v1/incidents`, retried on 408/429/5xx/network errors.

**Deduplication.** `incident_id` = `triage.k8s.termination_incident_id(namespace, pod uid, container,
restart)`, where `restart` is the restart count *of the instance that terminated* (`restartCount` for
`state.terminated` and for `lastState.terminated` while the container waits to restart; `restartCount - 1`
once a newer instance runs). A termination seen again (a MODIFIED event, a relist after 410, a restarted
watcher, a second watcher) gets the same id, and the service answers a repeat with 200 and stores nothing.
The watcher also remembers what it decided (by that key and by the terminated `containerID`), so it does
not even fetch the log twice.

**Resume.** The first pass LISTs (paged) and handles every pod, then WATCHes from the list's
resourceVersion with bookmarks; every event and bookmark advances the version, and a watch that ends (server
timeout, dropped connection, 5xx) is re-opened from it, after a back-off when it failed. A 410 Gone — as an
HTTP status or as an ERROR event — means the version expired: LIST again and watch from the new version;
the terminations the relist shows that were already handled are skipped by key, so nothing is lost (pod
status keeps the last termination of every container) and nothing is posted twice. With `--state-file` the
version, the decided keys and the undelivered ones survive a restart of the watcher (undelivered work
forces a relist).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from triage.k8s import termination_incident_id
from triage.k8s.client import KubeError
from triage.k8s.enrich import merge_missing, pod_facts, training_containers

log = logging.getLogger("triage.k8s.watcher")

SCHEMA = "oom-triage/incident@1"
INGEST_PATH = "/api/v1/incidents"
DELIVERED, RETRY, REJECTED = "delivered", "retry", "rejected"
MAX_LOG_CHARS = 256 * 1024  # log text kept in a bundle
MAX_SEEN = 50_000
# The collector's line once the service accepted its incident (collector/_send.py `verdict_line`).
COLLECTOR_DELIVERED = re.compile(r"oom-triage: incident ([0-9a-fA-F]{8}-[0-9a-fA-F-]{27}): ")
HOST_OOM_EXIT = 137
QUIET_WATCH_S = 1.0  # a watch that ends sooner without a single event counts as a failure (back-off)
SHORT_TAIL_LINES = 40  # the re-read when long lines filled the byte limit
PENDING_BACKOFF_S = 30.0  # an undelivered bundle waits this long before the next pass tries it (doubling)
PENDING_BACKOFF_MAX_S = 600.0


# ------------------------------------------------------------------------------------------ terminations


@dataclass(frozen=True)
class Termination:
    """One terminated container instance of a pod."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    restart: int  # the restart count of the instance that terminated
    current: bool  # in state.terminated (else lastState.terminated: read the log with previous=true)
    reason: str
    exit_code: int | None
    signal: int | None
    message: str | None
    started_at: str | None
    finished_at: str | None
    container_id: str | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod_uid}/{self.container}/{self.restart}"

    @property
    def cid_key(self) -> str | None:
        return f"cid:{self.pod_uid}/{self.container_id}" if self.container_id else None

    @property
    def incident_id(self) -> str:
        return termination_incident_id(self.namespace, self.pod_uid, self.container, self.restart)

    def facts(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "message": (self.message or "")[-4096:] or None,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "container_id": self.container_id,
            "restart_count": self.restart,
            "state": "terminated" if self.current else "lastState.terminated",
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def terminations(pod: Mapping[str, Any], names: list[str]) -> list[Termination]:
    """The terminated instances the pod's status shows for the named containers (state and lastState)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or name)
    out: list[Termination] = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if not isinstance(status, dict) or status.get("name") not in names:
            continue
        restarts = _int(status.get("restartCount")) or 0
        state = status.get("state") or {}
        last = status.get("lastState") or {}
        found: list[tuple[dict[str, Any], bool, int]] = []
        if isinstance(state.get("terminated"), dict):
            found.append((state["terminated"], True, restarts))
        if isinstance(last.get("terminated"), dict):
            # While the container waits to restart, the newest instance is the dead one (its restart count);
            # once a newer instance runs (or ended), the previous one is restartCount - 1.
            newer = "running" in state or "terminated" in state
            found.append((last["terminated"], False, max(0, restarts - 1) if newer else restarts))
        for term, current, restart in found:
            out.append(
                Termination(
                    namespace=namespace,
                    pod=name,
                    pod_uid=uid,
                    container=str(status.get("name")),
                    restart=restart,
                    current=current,
                    reason=str(term.get("reason") or ""),
                    exit_code=_int(term.get("exitCode")),
                    signal=_int(term.get("signal")),
                    message=term.get("message") if isinstance(term.get("message"), str) else None,
                    started_at=term.get("startedAt"),
                    finished_at=term.get("finishedAt"),
                    container_id=term.get("containerID") or None,
                )
            )
    return out


def classify(term: Termination, pod: Mapping[str, Any]) -> str | None:
    """`host_oom`, `log` (read the log to decide) or None (nothing for us: success, a deletion's kill)."""
    if term.reason == "OOMKilled":
        return "host_oom"
    if term.exit_code == 0 or (term.exit_code is None and term.reason in ("Completed", "")):
        return None
    if term.exit_code == HOST_OOM_EXIT:
        # SIGKILL. On a pod being deleted it is the kubelet ending the grace period, not memory.
        return None if (pod.get("metadata") or {}).get("deletionTimestamp") else "host_oom"
    if term.exit_code in (130, 143):  # SIGINT / SIGTERM: stopped, not crashed
        return None
    return "log"


def collector_delivered(log_text: str | None) -> str | None:
    """The incident id the collector reported as delivered in this log, if any."""
    if not log_text:
        return None
    found = COLLECTOR_DELIVERED.findall(log_text)
    return found[-1] if found else None


# ------------------------------------------------------------------------------------------ bundles


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def build_bundle(
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    term: Termination,
    kind: str,
    *,
    log_text: str | None = None,
    messages: list[Any] | None = None,
) -> dict[str, Any]:
    """The incident bundle (docs/bundle.md) of one termination: `kind` host_oom, cuda_oom or shm_exhausted."""
    facts = pod_facts(pod, node, container=term.container)
    tail = (log_text or "")[-MAX_LOG_CHARS:] or None
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    k8s: dict[str, Any] = {
        "source": "watcher",
        "termination": term.facts(),
        "pod_phase": status.get("phase"),
        "pod_reason": status.get("reason"),
        "pod_message": status.get("message"),
        "deletion_timestamp": meta.get("deletionTimestamp"),
    }
    bundle: dict[str, Any] = {
        "schema": SCHEMA,
        "incident_id": term.incident_id,
        "occurred_at": term.finished_at or _now(),
        "kind": kind,
        "workload": {"restart_count": term.restart},
        "k8s": k8s,
    }
    if kind == "host_oom":
        what = "OOMKilled" if term.reason == "OOMKilled" else f"killed ({term.reason or 'SIGKILL'})"
        bundle["error"] = {
            "type": term.reason or "SIGKILL",
            "message": f"container {term.container} of pod {term.namespace}/{term.pod} was {what}: "
            f"exit code {term.exit_code if term.exit_code is not None else HOST_OOM_EXIT}",
            "exit_code": term.exit_code if term.exit_code is not None else HOST_OOM_EXIT,
        }
        cgroup: dict[str, Any] = {}
        if term.reason == "OOMKilled":
            cgroup["oom_kill_count"] = 1  # the kernel killed in this container's cgroup at least once
        bundle["host"] = {"cgroup": cgroup}
        k8s["log_tail"] = tail
    else:
        chosen = messages[-1] if messages else None
        bundle["error"] = {
            "type": getattr(chosen, "exception_type", None),
            "message": getattr(chosen, "text", None) or (tail or "")[-4096:],
            "traceback": tail,
            "exit_code": term.exit_code,
        }
        # the rank prefix of the log line, where the pod spec's env did not say (a local rank, from
        # torchrun's [defaultN]: prefix, is not taken for the global one)
        rank = getattr(chosen, "rank", None)
        local = (getattr(chosen, "extra", None) or {}).get("local_rank")
        if isinstance(local, str) and local.isdigit():
            facts["workload"].setdefault("local_rank", int(local))
        if isinstance(rank, int) and (local is None or str(rank) != local):
            facts["workload"].setdefault("rank", rank)
    merge_missing(bundle, facts)
    return bundle


# ------------------------------------------------------------------------------------------ posting


@dataclass
class PostResult:
    result: str  # DELIVERED | RETRY | REJECTED
    status: int | None = None
    reason: str = ""
    answer: dict[str, Any] | None = None


# (url, body, headers, timeout) -> (HTTP status, response body); raises OSError for a network failure
Transport = Callable[[str, bytes, dict[str, str], float], tuple[int, bytes]]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def urllib_transport(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        try:
            return int(exc.code), exc.read(1 << 16)
        finally:
            exc.close()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class IngestClient:
    """POST bundles to the service's ingest endpoint (gzip JSON, bearer token), with retries."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        transport: Transport | None = None,
        timeout: float = 30.0,
        attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/") + INGEST_PATH
        self.token = token
        self.transport = transport or urllib_transport
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep or _sleep

    def headers(self, incident_id: str) -> dict[str, str]:
        h = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "User-Agent": "oom-triage-watch/1",
            "Idempotency-Key": incident_id,
        }
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def post_once(self, body: bytes, incident_id: str) -> PostResult:
        try:
            status, raw = self.transport(self.url, body, self.headers(incident_id), self.timeout)
        except Exception as exc:  # network errors, timeouts, a refused connection
            return PostResult(RETRY, None, f"{type(exc).__name__}: {exc}")
        answer = None
        try:
            parsed = json.loads(raw) if raw else None
            answer = parsed if isinstance(parsed, dict) else None
        except (ValueError, UnicodeDecodeError):
            pass
        if 200 <= status < 300 or status == 409:
            return PostResult(DELIVERED, status, "", answer)
        text = raw[:300].decode("utf-8", "replace").strip()
        if status in (408, 429) or status >= 500 or 300 <= status < 400:
            return PostResult(RETRY, status, f"HTTP {status} {text}".strip())
        return PostResult(REJECTED, status, f"HTTP {status}: {text}")

    def post(self, bundle: Mapping[str, Any]) -> PostResult:
        body = gzip.compress(json.dumps(bundle, separators=(",", ":")).encode("utf-8"), mtime=0)
        incident_id = str(bundle.get("incident_id"))
        delay = self.backoff
        result = PostResult(RETRY, None, "not tried")
        for attempt in range(self.attempts):
            result = self.post_once(body, incident_id)
            if result.result != RETRY or attempt == self.attempts - 1:
                return result
            log.warning("incident %s: %s; retrying in %.1f s", incident_id, result.reason, delay)
            self.sleep(delay * (0.75 + 0.5 * random.random()))
            delay = min(delay * 2, self.max_backoff)
        return result


# ------------------------------------------------------------------------------------------ state


@dataclass
class WatchState:
    """What survives a restart of the watcher (`--state-file`)."""

    resource_version: str = ""
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)  # decided terminations
    # key → a bundle not delivered yet, or {"recheck_pod": pod} when the log that decides could not be read
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)

    def remember(self, *keys: str | None) -> None:
        for key in keys:
            if key:
                self.seen[key] = None
                self.seen.move_to_end(key)
        while len(self.seen) > MAX_SEEN:
            self.seen.popitem(last=False)

    def decided(self, term: Termination) -> bool:
        return term.key in self.seen or (term.cid_key is not None and term.cid_key in self.seen)

    @classmethod
    def load(cls, path: Path) -> WatchState:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("state file %s unreadable (%s): starting with a full list", path, exc)
            return cls()
        state = cls(resource_version=str(raw.get("resource_version") or ""))
        state.remember(*[k for k in raw.get("seen") or [] if isinstance(k, str)])
        pending = raw.get("pending") or {}
        if isinstance(pending, dict):
            state.pending = {k: v for k, v in pending.items() if isinstance(v, dict)}
        return state

    def save(self, path: Path) -> None:
        data = {"resource_version": self.resource_version, "seen": list(self.seen), "pending": self.pending}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".watch-state-", dir=str(path.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# ------------------------------------------------------------------------------------------ the watcher


@dataclass
class WatchConfig:
    namespace: str | None = None  # None: all namespaces
    label_selector: str = ""
    containers: frozenset[str] = frozenset()  # training container names (default: GPU containers)
    log_tail_lines: int = 500
    log_limit_bytes: int = 2 * 1024 * 1024
    watch_timeout_s: int = 300
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    state_file: Path | None = None


@dataclass
class WatchStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0  # 410s
    errors: int = 0
    posted: int = 0
    duplicates: int = 0  # the service already had the incident (200)
    rejected: int = 0
    left_to_collector: int = 0
    not_oom: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class Watcher:
    """List + watch pods; one incident per terminated training container that ran out of memory."""

    def __init__(
        self,
        client: Any,
        ingest: IngestClient,
        config: WatchConfig | None = None,
        *,
        state: WatchState | None = None,
    ) -> None:
        self.client = client
        self.ingest = ingest
        self.config = config or WatchConfig()
        if state is None and self.config.state_file is not None:
            state = WatchState.load(self.config.state_file)
        self.state = state or WatchState()
        self.stats = WatchStats()
        self.failures = 0
        self.last_progress = time.monotonic()
        self._relist = bool(self.state.pending)  # undelivered work: look at every pod again
        self._not_before: dict[str, tuple[float, float]] = {}  # key → (next attempt, back-off) of a bundle

    # -------------------------------------------------------------- loop
    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set: list when needed, watch, resume; back off on errors, relist on 410."""
        while not stop.is_set():
            try:
                if self._relist or not self.state.resource_version:
                    self.sync()
                started = time.monotonic()
                if self.watch_once(stop) or time.monotonic() - started >= QUIET_WATCH_S:
                    self.failures = 0
                else:  # closed at once with nothing in it: not a healthy server, do not spin
                    self.failures += 1
                    stop.wait(self._delay())
            except KubeError as exc:
                if exc.gone:
                    self.stats.expired += 1
                    log.info("resourceVersion %s expired (410): listing again", self.state.resource_version)
                    self._relist = True
                else:
                    self.stats.errors += 1
                    self.failures += 1
                    delay = self._delay()
                    log.warning("watch failed (%s); again in %.1f s", exc, delay)
                    stop.wait(delay)
            except Exception:  # never die on a surprise: back off and resume from the last version
                self.stats.errors += 1
                self.failures += 1
                delay = self._delay()
                log.exception("watch loop error; again in %.1f s", delay)
                stop.wait(delay)
            self.retry_pending()
            self.save()

    def run_once(self) -> None:
        """One full pass: list every pod, handle it, deliver what is pending (`triage watch --once`)."""
        self.sync()
        self.retry_pending()
        self.save()

    def _delay(self) -> float:
        base = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** min(self.failures - 1, 16))
        return float(base * (0.75 + 0.5 * random.random()))

    def sync(self) -> None:
        """LIST (paged) and handle every pod; the watch resumes from the list's resourceVersion."""
        items, rv = self.client.list_pods(
            namespace=self.config.namespace, label_selector=self.config.label_selector
        )
        self.stats.lists += 1
        for pod in items:
            self.handle_pod(pod)
        self.state.resource_version = rv
        self._relist = False
        self.progress()
        self.save()

    def watch_once(self, stop: threading.Event | None = None) -> int:
        """One watch request from the current resourceVersion, until the server ends it; the events seen."""
        self.stats.watches += 1
        events = self.client.watch_pods(
            resource_version=self.state.resource_version,
            namespace=self.config.namespace,
            label_selector=self.config.label_selector,
            timeout_seconds=self.config.watch_timeout_s,
        )
        self.progress()
        seen = 0
        for event in events:
            seen += 1
            kind = event.get("type")
            obj = event.get("object") if isinstance(event.get("object"), dict) else {}
            if kind == "ERROR":
                code = _int(obj.get("code")) or 0
                raise KubeError(code, f"{obj.get('reason') or 'Error'}: {obj.get('message') or ''}".strip())
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind == "BOOKMARK":
                self.stats.bookmarks += 1
            elif kind in ("ADDED", "MODIFIED", "DELETED"):
                self.stats.events += 1
                self.handle_pod(obj)
            if isinstance(rv, str) and rv:
                self.state.resource_version = rv
            self.progress()
            if stop is not None and stop.is_set():
                break
        return seen

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    def healthy(self, stale_after_s: float | None = None) -> bool:
        limit = stale_after_s if stale_after_s is not None else self.config.watch_timeout_s + 120
        return time.monotonic() - self.last_progress < limit

    def save(self) -> None:
        if self.config.state_file is not None:
            try:
                self.state.save(self.config.state_file)
            except OSError as exc:
                log.warning("cannot write the state file %s: %s", self.config.state_file, exc)

    # -------------------------------------------------------------- pods
    def handle_pod(self, pod: Mapping[str, Any]) -> list[str]:
        """Every undecided termination of the pod's training containers; returns the incident ids posted."""
        names = training_containers(pod, self.config.containers)
        if not names:
            return []
        posted: list[str] = []
        for term in terminations(pod, names):
            if self.state.decided(term):
                continue
            waiting = self.state.pending.get(term.key)
            if waiting is not None:
                if "recheck_pod" not in waiting:
                    continue  # a bundle waiting for delivery: retry_pending sends it
                del self.state.pending[term.key]  # look again with this newer pod object
            try:
                incident = self._handle(pod, term)
            except Exception:  # a bug on one odd pod must not stop the watch, nor loop on it forever
                log.exception("%s: cannot make an incident of this termination; skipped", term.key)
                self.stats.errors += 1
                self.state.remember(term.key, term.cid_key)
                continue
            if incident:
                posted.append(incident)
        return posted

    def _handle(self, pod: Mapping[str, Any], term: Termination) -> str | None:
        verdict = classify(term, pod)
        if verdict is None:
            self.state.remember(term.key, term.cid_key)
            return None
        try:
            log_text = self._read_log(term)
        except KubeError as exc:
            if verdict == "log":  # the log decides: look at the pod again on the next retry pass
                log.warning(
                    "log of %s/%s[%s] unreadable (%s): will retry",
                    term.namespace,
                    term.pod,
                    term.container,
                    exc,
                )
                self.stats.errors += 1
                self.state.pending[term.key] = {"recheck_pod": dict(pod)}
                return None
            log_text = None
        if not log_text and term.message:
            log_text = term.message  # terminationMessagePolicy: FallbackToLogsOnError
        messages: list[Any] = []
        kind = verdict
        if verdict == "log":
            delivered = collector_delivered(log_text)
            if delivered:
                log.info(
                    "%s/%s[%s] restart %d: the collector delivered incident %s",
                    term.namespace,
                    term.pod,
                    term.container,
                    term.restart,
                    delivered,
                )
                self.stats.left_to_collector += 1
                self.state.remember(term.key, term.cid_key)
                return None
            from triage.messages import parse_messages

            messages = parse_messages(log_text or "")
            if not messages:
                self.stats.not_oom += 1
                self.state.remember(term.key, term.cid_key)
                return None
            kind = messages[-1].kind
        node = None
        node_name = (pod.get("spec") or {}).get("nodeName")
        if isinstance(node_name, str) and node_name:
            try:
                node = self.client.get_node(node_name)
            except KubeError as exc:
                log.info("node %s unreadable (%s): no GPU labels", node_name, exc)
        bundle = build_bundle(pod, node, term, kind, log_text=log_text, messages=messages)
        return self._deliver(term.key, term.cid_key, bundle)

    def _read_log(self, term: Termination) -> str | None:
        """The log tail of the terminated instance. The API applies `limitBytes` to the start of the tail, so
        when very long lines (progress bars) fill it, the last lines are read again on their own: the end
        of the log is where the error is."""
        lines, limit = self.config.log_tail_lines, self.config.log_limit_bytes
        text = self.client.pod_log(
            term.namespace,
            term.pod,
            term.container,
            previous=not term.current,
            tail_lines=lines,
            limit_bytes=limit,
        )
        if text and limit and lines > SHORT_TAIL_LINES and len(text.encode("utf-8", "replace")) >= limit:
            short = self.client.pod_log(
                term.namespace,
                term.pod,
                term.container,
                previous=not term.current,
                tail_lines=SHORT_TAIL_LINES,
                limit_bytes=limit,
            )
            if short:
                text = short
        return text

    def _deliver(self, key: str, cid_key: str | None, bundle: dict[str, Any]) -> str | None:
        result = self.ingest.post(bundle)
        incident = str(bundle["incident_id"])
        if result.result == DELIVERED:
            if result.status == 200:
                self.stats.duplicates += 1
            else:
                self.stats.posted += 1
            answer = result.answer or {}
            log.info(
                "incident %s (%s) for %s: %s",
                incident,
                bundle.get("kind"),
                key,
                answer.get("ticket_url") or answer.get("status") or "accepted",
            )
            self.state.pending.pop(key, None)
            self._not_before.pop(key, None)
            self.state.remember(key, cid_key)
            return incident
        if result.result == REJECTED:
            self.stats.rejected += 1
            log.error("incident %s refused by the service (%s): dropped", incident, result.reason)
            self.state.pending.pop(key, None)
            self.state.remember(key, cid_key)
            return None
        _, backoff = self._not_before.get(key, (0.0, PENDING_BACKOFF_S / 2))
        backoff = min(backoff * 2, PENDING_BACKOFF_MAX_S)
        self._not_before[key] = (time.monotonic() + backoff, backoff)
        log.warning(
            "incident %s not delivered (%s): kept, next try in %.0f s", incident, result.reason, backoff
        )
        self.state.pending[key] = bundle
        return None

    def retry_pending(self) -> None:
        """Deliver the bundles not delivered yet; look again at the pods whose log could not be read."""
        for key, item in list(self.state.pending.items()):
            pod = item.get("recheck_pod")
            if isinstance(pod, dict):
                del self.state.pending[key]
                self.handle_pod(pod)
                continue
            if self._not_before.get(key, (0.0, 0.0))[0] > time.monotonic():
                continue
            cid = ((item.get("k8s") or {}).get("termination") or {}).get("container_id")
            uid = (item.get("k8s") or {}).get("pod_uid")
            self._deliver(key, f"cid:{uid}/{cid}" if cid and uid else None, item)


# ------------------------------------------------------------------------------------------ health


def serve_health(watcher: Watcher, host: str, port: int) -> ThreadingHTTPServer:
    """`GET /healthz` (200 while the watch makes progress, else 503, with the counters as JSON) in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/healthz", "/readyz"):
                self.send_error(404)
                return
            ok = watcher.healthy()
            body = json.dumps(
                {
                    "status": "ok" if ok else "stale",
                    "resource_version": watcher.state.resource_version,
                    "pending": len(watcher.state.pending),
                    **watcher.stats.to_dict(),
                }
            ).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="watch-health", daemon=True).start()
    return server


__all__ = [
    "IngestClient",
    "PostResult",
    "Termination",
    "WatchConfig",
    "WatchState",
    "WatchStats",
    "Watcher",
    "build_bundle",
    "classify",
    "collector_delivered",
    "serve_health",
    "terminations",
    "urllib_transport",
]
