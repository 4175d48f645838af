"""`triage watch`: watch pods for crashed training containers and post their incidents to the service.

Catches what the in-pod collector cannot: pods without it, and containers the kernel's OOM killer ended
(see `triage.k8s.watcher`). Needs the `k8s` extra (the official kubernetes client), imported only when the
command runs.
"""

from __future__ import annotations

import argparse
import os


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "watch",
        help="watch pods for OOM-killed or CUDA-OOM crashed training containers (no collector needed)",
        description="Watch pods (a label selector, one namespace or all) and post an incident to the triage "
        "service for every terminated training container that ran out of memory: OOMKilled / exit 137, or a "
        "CUDA OOM / shm error in its log tail. Resumes from the last resourceVersion, relists after a 410.",
    )
    p.add_argument(
        "--selector",
        "-l",
        default=os.environ.get("TRIAGE_WATCH_SELECTOR", ""),
        help="label selector of the pods to watch (default: $TRIAGE_WATCH_SELECTOR, or every pod)",
    )
    p.add_argument(
        "--namespace",
        "-n",
        default=os.environ.get("TRIAGE_WATCH_NAMESPACE") or None,
        help="watch one namespace (default: $TRIAGE_WATCH_NAMESPACE, or all namespaces)",
    )
    p.add_argument(
        "--container",
        action="append",
        default=None,
        metavar="NAME",
        help="training container name (repeatable; default: $TRIAGE_WATCH_CONTAINERS, or containers asking "
        "for a GPU / MIG slice)",
    )
    p.add_argument(
        "--url", default=os.environ.get("TRIAGE_URL"), help="the triage service (default: $TRIAGE_URL)"
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("TRIAGE_TOKEN_FILE"),
        help="file holding the ingest bearer token (default: $TRIAGE_TOKEN_FILE, else $TRIAGE_TOKEN)",
    )
    p.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)"
    )
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument(
        "--api-url",
        default=os.environ.get("TRIAGE_KUBE_API_URL") or None,
        help="Kubernetes API server URL without credentials (e.g. `kubectl proxy`'s http://127.0.0.1:8001)",
    )
    p.add_argument(
        "--state-file",
        default=os.environ.get("TRIAGE_WATCH_STATE_FILE") or None,
        help="keep the resourceVersion and the handled terminations here across restarts",
    )
    p.add_argument(
        "--log-tail-lines",
        type=int,
        default=_env_int("TRIAGE_WATCH_LOG_TAIL_LINES", 500),
        help="log lines read from a crashed container (default 500)",
    )
    p.add_argument(
        "--watch-timeout",
        type=int,
        default=_env_int("TRIAGE_WATCH_TIMEOUT_SECONDS", 300),
        help="seconds one watch request lasts before it is re-opened (default 300)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=_env_int("TRIAGE_WATCH_HEALTH_PORT", 0),
        help="serve GET /healthz on this port (default: $TRIAGE_WATCH_HEALTH_PORT, 0 = off)",
    )
    p.add_argument(
        "--health-host", default="0.0.0.0", help="address of the health endpoint (default 0.0.0.0)"
    )
    p.add_argument("--once", action="store_true", help="list the pods once, post what crashed, and exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the incident bundles as JSON lines instead of posting them",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal
    import sys
    import threading
    from pathlib import Path

    from triage.errors import InputError
    from triage.k8s.client import ConfigError, load_client
    from triage.k8s.watcher import IngestClient, WatchConfig, Watcher, serve_health

    logging.basicConfig(
        level=os.environ.get("TRIAGE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    token = os.environ.get("TRIAGE_TOKEN") or None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise InputError(f"{args.token_file}: cannot read the token ({exc.strerror or exc})")
    if args.dry_run:

        def printing(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
            import gzip

            sys.stdout.write(gzip.decompress(body).decode("utf-8") + "\n")
            sys.stdout.flush()
            return 202, b"{}"

        ingest = IngestClient(args.url or "http://dry-run", token, transport=printing)
    else:
        if not args.url:
            raise InputError("no service URL: pass --url or set TRIAGE_URL")
        ingest = IngestClient(args.url, token)
    containers = args.container
    if containers is None:
        containers = [
            c.strip() for c in os.environ.get("TRIAGE_WATCH_CONTAINERS", "").split(",") if c.strip()
        ]
    config = WatchConfig(
        namespace=args.namespace,
        label_selector=args.selector or "",
        containers=frozenset(containers),
        log_tail_lines=max(1, args.log_tail_lines),
        watch_timeout_s=max(1, args.watch_timeout),
        state_file=Path(args.state_file) if args.state_file else None,
    )
    try:
        client = load_client(api_url=args.api_url, kubeconfig=args.kubeconfig, context=args.context)
    except ConfigError as exc:
        raise InputError(str(exc))
    watcher = Watcher(client, ingest, config)
    try:
        if args.once:
            watcher.run_once()
            print(json.dumps(watcher.stats.to_dict()), file=sys.stderr)
            return 1 if watcher.state.pending else 0
        stop = threading.Event()

        def _stop(signum: int, frame: object) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        server = serve_health(watcher, args.health_host, args.health_port) if args.health_port else None
        try:
            watcher.run(stop)
        finally:
            if server is not None:
                server.shutdown()
        return 0
    finally:
        client.close()
