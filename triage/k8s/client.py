"""Config loading and a thin client over the official `kubernetes` package that returns the API's raw JSON.

`load_client()` picks, in order: an explicit `api_url` (tests, `kubectl proxy`), the in-cluster service
account (when `KUBERNETES_SERVICE_HOST` is set), then a kubeconfig (`--kubeconfig`, `$KUBECONFIG`,
`~/.kube/config`). `KubeClient` calls `CoreV1Api` with `_preload_content=False` and parses the body itself:
the objects stay exactly as the API server sent them (camelCase keys, quantities as strings), nothing is lost
to model classes, and a watch stream is read line by line.

Only what the least-privilege ClusterRole grants is used: pods get/list/watch, pods/log get, nodes get.
Every failure becomes a `KubeError` with the HTTP status (0 for a connection or protocol error), so callers
never need the `kubernetes` or `urllib3` exception types.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

DEFAULT_REQUEST_TIMEOUT_S = 10.0
NODE_CACHE_TTL_S = 300.0
MAX_LOG_BYTES = 4 * 1024 * 1024


class KubeError(Exception):
    """A failed API call: `status` is the HTTP status, 0 when no response came (connection, protocol)."""

    def __init__(self, status: int, reason: str, body: str | None = None) -> None:
        super().__init__(f"{status or 'no response'}: {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def gone(self) -> bool:
        """410 Gone: the resourceVersion is too old (watch expiry, expired continue token)."""
        return self.status == 410


class ConfigError(Exception):
    """No usable Kubernetes configuration (not in a cluster, no kubeconfig)."""


def _translate(exc: BaseException) -> KubeError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        body = exc.body if isinstance(exc.body, str) else None
        reason = str(exc.reason or "")
        if body:
            try:
                status_obj = json.loads(body)
                if isinstance(status_obj, dict) and status_obj.get("message"):
                    reason = f"{status_obj.get('reason') or reason}: {status_obj['message']}"
            except ValueError:
                pass
        return KubeError(status, reason, body)
    return KubeError(0, f"{type(exc).__name__}: {exc}")


def _transport_errors() -> tuple[type[BaseException], ...]:
    import urllib3
    from kubernetes.client.exceptions import ApiException, ApiValueError

    return (ApiException, ApiValueError, urllib3.exceptions.HTTPError, OSError, ValueError)


class KubeClient:
    """Raw-JSON access to pods, pod logs and nodes through the official client's `CoreV1Api`."""

    def __init__(self, api_client: Any, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        from kubernetes.client import CoreV1Api

        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.request_timeout = request_timeout
        self._errors = _transport_errors()
        self._nodes: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        token: str | None = None,
        verify_ssl: bool = True,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> KubeClient:
        """A client for an API server at `url` (e.g. `http://127.0.0.1:8001` from `kubectl proxy`)."""
        from kubernetes.client import ApiClient, Configuration

        cfg = Configuration()
        cfg.host = url.rstrip("/")
        cfg.verify_ssl = verify_ssl
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cls(ApiClient(cfg), request_timeout=request_timeout)

    def close(self) -> None:
        close = getattr(self.api_client, "close", None)
        if callable(close):
            close()

    # ------------------------------------------------------------------ helpers
    def _json(self, resp: Any) -> Any:
        try:
            data = resp.data
        finally:
            resp.release_conn()
        try:
            return json.loads(data)
        except ValueError as exc:
            raise KubeError(0, f"the API server sent something that is not JSON ({exc})")

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            return method(*args, _preload_content=False, **kwargs)
        except self._errors as exc:
            raise _translate(exc)

    # ------------------------------------------------------------------ reads
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod object; None when it does not exist (any more)."""
        try:
            obj = self._json(self._call(self.core.read_namespaced_pod, name, namespace))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj if isinstance(obj, dict) else None

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node object (cached a few minutes: its labels barely change); None when absent."""
        now = time.monotonic()
        with self._lock:
            hit = self._nodes.get(name)
            if hit is not None and now - hit[0] < NODE_CACHE_TTL_S:
                return hit[1]
        try:
            obj = self._json(self._call(self.core.read_node, name))
        except KubeError as exc:
            if exc.status != 404:
                raise
            obj = None
        node = obj if isinstance(obj, dict) else None
        with self._lock:
            if len(self._nodes) > 4096:
                self._nodes.clear()
            self._nodes[name] = (now, node)
        return node

    def pod_log(
        self,
        namespace: str,
        name: str,
        container: str,
        *,
        previous: bool = False,
        tail_lines: int | None = 500,
        limit_bytes: int | None = 1024 * 1024,
    ) -> str | None:
        """The container's log tail (`previous`: the instance before the last restart); None if unavailable."""
        kwargs: dict[str, Any] = {"container": container}
        if previous:
            kwargs["previous"] = True
        if tail_lines:
            kwargs["tail_lines"] = int(tail_lines)
        if limit_bytes:
            kwargs["limit_bytes"] = int(min(limit_bytes, MAX_LOG_BYTES))
        try:
            resp = self._call(self.core.read_namespaced_pod_log, name, namespace, **kwargs)
        except KubeError as exc:
            if exc.status in (400, 404):  # no previous instance, container never started, pod gone
                return None
            raise
        try:
            data = resp.read(MAX_LOG_BYTES + 1)
        except self._errors as exc:
            raise _translate(exc)
        finally:
            resp.release_conn()
        if isinstance(data, str):
            return data
        return bytes(data[:MAX_LOG_BYTES]).decode("utf-8", errors="replace")

    def list_pods(
        self, *, namespace: str | None = None, label_selector: str = "", page_size: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """Every pod matching the selector (paged with continue tokens) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        rv = ""
        for _ in range(100_000):
            kwargs: dict[str, Any] = {"limit": page_size}
            if label_selector:
                kwargs["label_selector"] = label_selector
            if token:
                kwargs["_continue"] = token
            try:
                if namespace:
                    resp = self._call(self.core.list_namespaced_pod, namespace, **kwargs)
                else:
                    resp = self._call(self.core.list_pod_for_all_namespaces, **kwargs)
            except KubeError as exc:
                if exc.gone and token:  # the continue token expired mid-list: start again
                    items, token, rv = [], None, ""
                    continue
                raise
            obj = self._json(resp)
            if not isinstance(obj, dict):
                raise KubeError(0, "a pod list that is not an object")
            items.extend(i for i in obj.get("items") or [] if isinstance(i, dict))
            meta = obj.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            token = meta.get("continue") or None
            if not token:
                break
        return items, rv

    def watch_pods(
        self,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        timeout_seconds: int = 300,
    ) -> Iterator[dict[str, Any]]:
        """One watch request from `resource_version`, with bookmarks: yields the raw events
        (`{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}`) until the server ends it.

        Raises KubeError for an HTTP error status (410 when the version is too old) and when the
        connection breaks mid-stream (status 0); an ERROR *event* is yielded, not raised.
        """
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "resource_version": resource_version,
            "timeout_seconds": int(timeout_seconds),
            "_request_timeout": (self.request_timeout, timeout_seconds + 30),
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        if namespace:
            resp = self._call(self.core.list_namespaced_pod, namespace, **kwargs)
        else:
            resp = self._call(self.core.list_pod_for_all_namespaces, **kwargs)
        try:
            buffer = b""
            try:
                for chunk in resp.stream(None, decode_content=True):
                    buffer += chunk
                    while True:
                        newline = buffer.find(b"\n")
                        if newline < 0:
                            break
                        line, buffer = buffer[:newline], buffer[newline + 1 :]
                        event = _event(line)
                        if event is not None:
                            yield event
            except self._errors as exc:
                raise _translate(exc)
            if buffer.strip():
                event = _event(buffer)
                if event is None:
                    raise KubeError(0, "the watch stream ended in the middle of an event")
                yield event
        finally:
            resp.release_conn()


def _event(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        raise KubeError(0, "a watch event that is not JSON (the stream was cut)")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise KubeError(0, "a watch event without a type")
    return event


def load_client(
    *,
    api_url: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    token: str | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> KubeClient:
    """A `KubeClient` from an explicit URL, the in-cluster service account, or a kubeconfig (in that order)."""
    if api_url:
        return KubeClient.from_url(api_url, token=token, request_timeout=request_timeout)
    try:
        from kubernetes import config
        from kubernetes.client import ApiClient, Configuration
    except ImportError as exc:
        raise ConfigError(f"the kubernetes client is not installed (pip install 'oom-triage[k8s]'): {exc}")
    cfg = Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
            return KubeClient(ApiClient(cfg), request_timeout=request_timeout)
        except config.ConfigException as exc:
            in_cluster_error: Exception | None = exc
    else:
        in_cluster_error = None
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError) as exc:
        extra = f"; in-cluster config failed too: {in_cluster_error}" if in_cluster_error else ""
        raise ConfigError(f"no usable Kubernetes configuration ({exc}){extra}")
    return KubeClient(ApiClient(cfg), request_timeout=request_timeout)


def load_client_or_none(**kwargs: Any) -> KubeClient | None:
    """`load_client`, or None when there is no configuration (a service running outside a cluster)."""
    try:
        return load_client(**kwargs)
    except ConfigError:
        return None


def as_kube_client(obj: Any) -> KubeClient:
    """Accept a `KubeClient`, an official `CoreV1Api` or an `ApiClient`."""
    if isinstance(obj, KubeClient):
        return obj
    api_client = getattr(obj, "api_client", None)
    if api_client is not None and hasattr(obj, "read_namespaced_pod"):  # CoreV1Api
        return KubeClient(api_client)
    if hasattr(obj, "call_api"):  # ApiClient
        return KubeClient(obj)
    raise TypeError(f"not a Kubernetes client: {type(obj).__name__}")
