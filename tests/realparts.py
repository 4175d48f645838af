"""Real components for tests: Redmine 5, Prometheus Alertmanager, and a recording HTTP server.

Each starts on a free loopback port, waits until it answers, and is stopped by the PID the test started
(never by name). When a Debian package is missing the test is skipped with the package named, unless
``CI`` is set: CI installs them (``.ci/setup``), so there a missing package is a failure.
How each is started: ../shared/REAL_COMPONENTS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REDMINE_ROOT = Path("/usr/share/redmine")
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require(ok: bool, what: str, install: str) -> None:
    """Skip (locally) or fail (CI) when a real component is not installed."""
    if ok:
        return
    message = f"{what} is not installed: apt-get install -y --no-install-recommends {install}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must install it in .ci/setup)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, *, timeout: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    """Poll ``url`` until it answers below 500 (a 401/404 is an answer), or fail with the server's log."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = type(exc).__name__
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    code = proc.poll() if proc is not None else None
    raise RuntimeError(f"{url} did not become ready in {timeout:.0f}s (last: {last}, exit: {code})\n{tail}")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a process this test started, by its PID: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


# -- a recording HTTP server ------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lower), None)


Reply = tuple[int, dict[str, str], bytes]
Handler = Callable[[Recorded], Reply]


@dataclass
class HttpRecorder:
    """A threaded loopback HTTP server that records every request and answers with ``handler``.

    ``down = True`` answers 503 (an outage that still accepts connections); ``stop()`` closes the port
    (connection refused). ``start()`` again reopens it on the same port.
    """

    handler: Handler | None = None
    port: int = field(default_factory=free_port)
    requests: list[Recorded] = field(default_factory=list)
    down: bool = False
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpRecorder:
        recorder = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                rec = Recorded(self.command, self.path, dict(self.headers.items()), body)
                if recorder.down:
                    status, headers, out = 503, {"Content-Type": "text/plain"}, b"down for maintenance"
                else:
                    with recorder._cond:
                        recorder.requests.append(rec)
                        recorder._cond.notify_all()
                    status, headers, out = (
                        recorder.handler(rec)
                        if recorder.handler
                        else (200, {"Content-Type": "text/plain"}, b"ok")
                    )
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.send_header("Connection", "close")  # so stop() really takes the server away
                self.close_connection = True
                self.end_headers()
                try:
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Recorded]:
        """Block until at least ``n`` requests were recorded; return them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {n} requests, got {len(self.requests)} in {timeout}s")
                self._cond.wait(left)
            return list(self.requests)

    def __enter__(self) -> HttpRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def json_reply(status: int, doc: Any) -> Reply:
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


# -- Redmine 5 --------------------------------------------------------------------------------------

_REDMINE_SETUP = """
Redmine::DefaultData::Loader.load('en') if Redmine::DefaultData::Loader.no_data?
Setting.rest_api_enabled = '1'
Setting.text_formatting = 'common_mark'
admin = User.find_by(login: 'admin')
admin.must_change_passwd = false
admin.save!
project = Project.new(name: 'OOM triage', identifier: 'oom')
project.enabled_module_names = ['issue_tracking']
project.trackers = Tracker.all
project.save!
puts "APIKEY=" + admin.api_key
"""


def redmine_installed() -> bool:
    # thin is required: without it rackup finds no server handler
    return (REDMINE_ROOT / "config.ru").exists() and all(shutil.which(b) for b in ("rackup", "thin"))


@dataclass
class Redmine:
    """A throwaway Redmine 5 (SQLite) with the REST API on, an admin key, and a project ``oom``."""

    port: int = 0
    api_key: str = ""
    project: str = "oom"
    workdir: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        assert self.workdir is not None
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
            "RAILS_ENV": "production",
            "REDMINE_INSTANCE": "default",
            "DATABASE_URL": f"sqlite3:{self.workdir}/redmine.sqlite3",
            "REDMINE_LANG": "en",
        }

    def _run(self, *args: str, timeout: float = 180) -> str:
        r = subprocess.run(
            list(args),
            cwd=REDMINE_ROOT,
            env=self._env() | {"SCHEMA": f"{self.workdir}/schema.rb"},
            user="www-data",
            group="www-data",
            extra_groups=[],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-3000:]}"
            )
        return r.stdout.decode(errors="replace")

    def start(self, timeout: float = 90) -> Redmine:
        require(redmine_installed(), "Redmine", "redmine redmine-sqlite thin")
        if os.geteuid() != 0:
            pytest.skip("starting Redmine needs root (it runs as www-data)")
        self.workdir = Path(tempfile.mkdtemp(prefix="triage-redmine-"))
        shutil.chown(self.workdir, "www-data", "www-data")
        script = self.workdir / "setup.rb"
        script.write_text(_REDMINE_SETUP)
        shutil.chown(script, "www-data", "www-data")
        self._run("bin/rake", "db:migrate")
        out = self._run("bin/rails", "runner", str(script))
        self.api_key = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("APIKEY="))
        self.port = free_port()
        self.start_server(timeout)
        return self

    def start_server(self, timeout: float = 90) -> None:
        """Start (or restart, after ``stop_server``) the web server on the same port and database."""
        assert self.workdir is not None and self.proc is None
        log = self.workdir / "rackup.log"
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(
                ["rackup", "-E", "production", "-o", "127.0.0.1", "-p", str(self.port)],
                cwd=REDMINE_ROOT,
                env=self._env(),
                user="www-data",
                group="www-data",
                extra_groups=[],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_http(f"{self.url}/projects.json", timeout=timeout, proc=self.proc, log=log)

    def stop_server(self) -> None:
        """Stop the web server only (an outage): the database stays, ``start_server`` brings it back."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"X-Redmine-API-Key": self.api_key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def delete_issues(self) -> None:
        """Delete the test issues (their attachments live in /var/lib/redmine/default/files, not in $D)."""
        while True:
            found = self.api("GET", f"/issues.json?project_id={self.project}&status_id=*&limit=100")
            if not found["issues"]:
                return
            for issue in found["issues"]:
                self.api("DELETE", f"/issues/{issue['id']}.json")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.delete_issues()
            except OSError:
                pass  # best effort: the server is going away anyway
        self.stop_server()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


# -- Prometheus Alertmanager ------------------------------------------------------------------------


@dataclass
class Alertmanager:
    """Alertmanager routing every alert to ``webhook_url`` at once (group_wait 0s)."""

    webhook_url: str
    port: int = 0
    workdir: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Alertmanager:
        require(Path(ALERTMANAGER).exists(), "Prometheus Alertmanager", "prometheus-alertmanager")
        self.workdir = Path(tempfile.mkdtemp(prefix="triage-am-"))
        config = self.workdir / "am.yml"
        config.write_text(
            "route:\n"
            "  receiver: hook\n"
            "  group_by: ['...']\n"
            "  group_wait: 0s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            "receivers:\n"
            "  - name: hook\n"
            "    webhook_configs:\n"
            f"      - url: '{self.webhook_url}'\n"
            "        send_resolved: true\n"
        )
        self.port = free_port()
        log = self.workdir / "am.log"
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(
                [
                    ALERTMANAGER,
                    f"--config.file={config}",
                    f"--storage.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    f"--web.external-url={self.url}",
                ],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_http(f"{self.url}/-/ready", timeout=timeout, proc=self.proc, log=log)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            data = json.loads(r.read())
        return list(data)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
