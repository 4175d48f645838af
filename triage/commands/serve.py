"""`triage serve`: the triage service (API, pages, analysis worker) on SQLite or PostgreSQL."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the triage service (ingest API, tickets, pages, analysis worker)",
        description="Run the triage service. Settings come from TRIAGE_* environment variables "
        "(docs/service.md); the database is migrated at start.",
    )
    p.add_argument("--host", help="listen address (default: $TRIAGE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default: $TRIAGE_PORT or 8080)")
    p.add_argument(
        "--demo",
        action="store_true",
        help="post sample incidents from the simulator through the ingest API once the server is up",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--worker-only",
        action="store_true",
        help="run only the analysis worker (plus /healthz, /readyz, /metrics): a separate worker replica",
    )
    mode.add_argument("--no-worker", action="store_true", help="serve the API without the in-process worker")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import threading

    import uvicorn
    from pydantic import ValidationError

    from triage.errors import InputError
    from triage.service.app import create_app
    from triage.service.logging import configure_logging
    from triage.service.settings import Settings

    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.no_worker:
        overrides["worker"] = False
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise InputError(f"invalid settings: {problems}")
    if args.demo and settings.env != "development":
        raise InputError("--demo is only for TRIAGE_ENV=development")
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    app = create_app(settings, role="worker" if args.worker_only else "all")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
            proxy_headers=True,
        )
    )
    if args.demo and not args.worker_only:
        threading.Thread(
            target=_seed_when_up, args=(server, settings), name="triage-demo", daemon=True
        ).start()
    server.run()
    return 0


def _seed_when_up(server: object, settings: object) -> None:
    import logging
    import time

    from triage.service import demo
    from triage.service.settings import Settings

    assert isinstance(settings, Settings)
    while not getattr(server, "started", False):
        if getattr(server, "should_exit", False):
            return
        time.sleep(0.1)
    tokens = settings.ingest_token_map()
    token = next(iter(tokens.values()), None)
    base = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}"
    try:
        demo.seed(base, token=token)
    except Exception:
        logging.getLogger("triage.demo").exception("demo seeding failed")
        return
    print(f"\n  demo incidents posted: open {settings.public_url}/\n", flush=True)
