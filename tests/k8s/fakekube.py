"""A local HTTP server answering the Kubernetes API paths the enrichment and the watcher use.

No real API server can run on the test machines, so the official `kubernetes` client is pointed at this one
(`Configuration().host = "http://127.0.0.1:PORT"`). It answers like kube-apiserver does:

- `GET /api/v1/namespaces/{ns}/pods/{name}`, `GET /api/v1/nodes/{name}`: the object, or a `Status` (404, 403);
- `GET /api/v1/namespaces/{ns}/pods/{name}/log?container=&previous=&tailLines=&limitBytes=`: text/plain;
  `previous=true` without a previous instance is a 400 `Status`, like the kubelet's answer;
- `GET /api/v1/pods` and `/api/v1/namespaces/{ns}/pods` (`labelSelector`, `limit` + `continue` paging): a
  `PodList` with `metadata.resourceVersion`; with `watch=true`, the next scripted watch response: a chunked
  stream of JSON lines (`ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK`/`ERROR`, an `ERROR` carrying the 410
  `Status` of an expired version), an HTTP error status with a `Status` body, or a stream cut mid-event.

Every request is recorded (`requests`: path and query) so tests can check what the client asked for, e.g.
that a watch resumed from the last bookmark's resourceVersion.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        obj["details"] = details
    return obj


def bookmark(rv: str) -> dict[str, Any]:
    """A BOOKMARK event as kube-apiserver sends it: an almost empty Pod carrying only the version."""
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": rv, "creationTimestamp": None},
            "spec": {"containers": None},
            "status": {},
        },
    }


def expired(old: str, current: str = "250") -> dict[str, Any]:
    """The ERROR event of a watch whose resourceVersion was compacted away."""
    return {"type": "ERROR", "object": status(410, "Expired", f"too old resource version: {old} ({current})")}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


@dataclass
class WatchScript:
    """One answer to a watch request: `events` streamed, or an HTTP `http_status` error, or a cut stream."""

    events: list[dict[str, Any]] = field(default_factory=list)
    http_status: int | None = None
    cut: bool = False  # close the connection in the middle of the last event


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "==" in term or "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKubeAPI:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.forbidden_nodes: set[str] = set()
        self.logs: dict[tuple[str, str, str, bool], str] = {}
        self.list_rv = "100"
        self.watches: deque[WatchScript] = deque()
        self.on_watches_exhausted: Callable[[], None] | None = None
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.fail: dict[str, int] = {}  # path → HTTP status to answer once
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ content
    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = pod
        return pod

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        self.nodes[node["metadata"]["name"]] = node
        return node

    def set_log(self, namespace: str, pod: str, container: str, text: str, *, previous: bool = False) -> None:
        self.logs[(namespace, pod, container, previous)] = text

    def script(self, *scripts: WatchScript) -> None:
        self.watches.extend(scripts)

    def calls(self, path_part: str) -> list[dict[str, list[str]]]:
        with self._lock:
            return [q for p, q in self.requests if path_part in p]

    def watch_calls(self) -> list[dict[str, list[str]]]:
        with self._lock:
            return [
                q for p, q in self.requests if p.endswith("/pods") and q.get("watch") in (["true"], ["1"])
            ]

    def list_calls(self) -> list[dict[str, list[str]]]:
        with self._lock:
            return [q for p, q in self.requests if p.endswith("/pods") and "watch" not in q]

    # ------------------------------------------------------------------ server
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeKubeAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                with api._lock:
                    api.requests.append((parts.path, query))
                    forced = api.fail.pop(parts.path, None)
                if forced is not None:
                    self._json(forced, status(forced, "InternalError", "injected failure"))
                    return
                api._route(self, parts.path, query)

            def _json(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _text(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, script: WatchScript) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, ev in enumerate(script.events):
                    line = json.dumps(ev).encode() + b"\n"
                    if script.cut and i == len(script.events) - 1:
                        self._chunk(line[: len(line) // 2])
                        self.close_connection = True
                        self.wfile.flush()
                        return
                    self._chunk(line)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self._handler = Handler
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-api",
            daemon=True,
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------ routes
    def _route(self, h: Any, path: str, query: dict[str, list[str]]) -> None:
        seg = [s for s in path.split("/") if s]
        q = {k: v[-1] for k, v in query.items()}
        if seg[:2] != ["api", "v1"]:
            h._json(404, status(404, "NotFound", "the server could not find the requested resource"))
            return
        seg = seg[2:]
        if len(seg) == 2 and seg[0] == "nodes":
            name = seg[1]
            if name in self.forbidden_nodes:
                h._json(
                    403,
                    status(
                        403,
                        "Forbidden",
                        f'nodes "{name}" is forbidden: User "system:serviceaccount:oom-triage:oom-triage" '
                        'cannot get resource "nodes" in API group "" at the cluster scope',
                        name=name,
                        kind="nodes",
                    ),
                )
            elif name in self.nodes:
                h._json(200, self.nodes[name])
            else:
                h._json(404, status(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes"))
            return
        if seg == ["pods"]:
            self._pods(h, None, q)
            return
        if len(seg) >= 3 and seg[0] == "namespaces" and seg[2] == "pods":
            ns = seg[1]
            if len(seg) == 3:
                self._pods(h, ns, q)
                return
            name = seg[3]
            pod = self.pods.get((ns, name))
            if pod is None:
                h._json(404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"))
                return
            if len(seg) == 4:
                h._json(200, pod)
                return
            if len(seg) == 5 and seg[4] == "log":
                container = q.get("container") or pod["spec"]["containers"][0]["name"]
                previous = q.get("previous") in ("true", "1", "True")
                text = self.logs.get((ns, name, container, previous))
                if text is None:
                    what = "previous terminated container" if previous else "container"
                    h._json(
                        400,
                        status(400, "BadRequest", f'{what} "{container}" in pod "{name}" not found'),
                    )
                    return
                if q.get("tailLines"):
                    lines = text.splitlines(keepends=True)
                    text = "".join(lines[-int(q["tailLines"]) :])
                if q.get("limitBytes"):
                    text = text.encode()[: int(q["limitBytes"])].decode("utf-8", "ignore")
                h._text(200, text)
                return
        h._json(404, status(404, "NotFound", "the server could not find the requested resource"))

    def _pods(self, h: Any, namespace: str | None, q: dict[str, str]) -> None:
        if q.get("watch") in ("true", "1"):
            with self._lock:
                script = self.watches.popleft() if self.watches else None
            if script is None:
                if self.on_watches_exhausted is not None:
                    self.on_watches_exhausted()
                script = WatchScript(events=[])
            if script.http_status is not None:
                code = script.http_status
                reason = {410: "Expired", 500: "InternalError", 503: "ServiceUnavailable"}.get(
                    code, "Unknown"
                )
                h._json(code, status(code, reason, f"injected {code}"))
                return
            h._stream(script)
            return
        selector = q.get("labelSelector", "")
        items = [
            p
            for (ns, _), p in sorted(self.pods.items())
            if (namespace is None or ns == namespace)
            and _selector_matches(selector, p["metadata"].get("labels") or {})
        ]
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or len(items) or 1
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": self.list_rv}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        h._json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})
