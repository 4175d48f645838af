"""The real server process: killed mid-upload it keeps no partial incident, and the client's retry
succeeds after the restart."""

from __future__ import annotations

import base64
import random
import socket
import time
from pathlib import Path

import httpx

from tests.service.svckit import Server, bundle, gz


def test_a_server_killed_mid_upload_keeps_nothing_and_the_retry_succeeds(
    database_url: str, tmp_path: Path
) -> None:
    env = {
        "TRIAGE_DATA_DIR": str(tmp_path / "data"),
        "TRIAGE_DATABASE_URL": database_url,
        "TRIAGE_WORKER": "false",
        "TRIAGE_LOG_FORMAT": "text",
    }
    b = bundle()
    b["padding"] = base64.b64encode(random.Random(0).randbytes(300_000)).decode()  # unknown keys are kept
    body = gz(b)
    assert len(body) > 200_000
    server = Server(env, log=tmp_path / "server.log")
    try:
        server.wait_ready()
        sock = socket.create_connection(("127.0.0.1", server.port))
        head = (
            f"POST /api/v1/incidents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body[: len(body) // 2])
        parts = tmp_path / "data" / "blobs" / "tmp"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(p.stat().st_size > 0 for p in parts.glob("*.part")):
            time.sleep(0.02)
        assert any(parts.glob("*.part")), "the upload never reached the server"
        server.kill()
        sock.close()
    finally:
        server.stop()

    server = Server(env, log=tmp_path / "server.log")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get(f"/api/v1/incidents/{b['incident_id']}").status_code == 404
            assert client.get("/api/v1/incidents").json()["total"] == 0
            r = client.post(
                "/api/v1/incidents",
                content=body,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
            assert r.status_code == 202, r.text
            got = client.get(f"/api/v1/incidents/{b['incident_id']}").json()
            assert got["status"] == "queued" and got["blob_bytes"] > len(body)
    finally:
        server.stop()
    assert len(list((tmp_path / "data" / "blobs").rglob("*.json.gz"))) == 1
