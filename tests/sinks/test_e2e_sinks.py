"""End to end, all real: bundles posted to the service → the worker analyses and groups them → the
outbox delivers the ticket to a real Redmine (an issue with the evidence attached) and to a real
Prometheus Alertmanager (an alert routed to a local webhook). A 64-rank job is one ticket, one issue,
one alert; a recurrence updates them. A Redmine outage delays the delivery and never loses or doubles it."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from tests.pagekit import App, bundle
from tests.realparts import Alertmanager, HttpRecorder, Redmine
from triage.store.models import OutboxItem

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_triage_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TRIAGE_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sinks_file(tmp_path: Path, redmine: Redmine, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Write a sinks configuration for team ml-research (the Redmine key comes from the environment)."""
    monkeypatch.setenv("E2E_REDMINE_KEY", redmine.api_key)

    def write(*, alertmanager: Alertmanager | None = None, **delivery: float) -> Path:
        sinks: list[dict[str, Any]] = [
            {
                "kind": "redmine",
                "url": redmine.url,
                "api_key": "${E2E_REDMINE_KEY}",
                "project": redmine.project,
            }
        ]
        if alertmanager is not None:
            sinks.append({"kind": "alertmanager", "url": alertmanager.url, "labels": {"severity": "warning"}})
        doc = {
            "default_team": "platform",
            "teams": {"ml-research": {"sinks": sinks}},
            "delivery": {"backoff_base_s": 0.3, "backoff_max_s": 1.0, "lease_s": 120} | delivery,
        }
        path = tmp_path / "sinks.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    return write


@pytest.fixture
def job() -> str:
    return f"llama-{uuid.uuid4().hex[:8]}"  # the session's Redmine is shared: each test its own job


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., App]]:
    made: list[App] = []

    def make(sinks: Path) -> App:
        made.append(App(tmp_path / f"svc{len(made)}", sinks_config=sinks))
        return made[-1]

    yield make
    for app in made:
        app.close()


def issues(redmine: Redmine, tag: str) -> list[dict[str, Any]]:
    found = redmine.api("GET", f"/issues.json?project_id={redmine.project}&status_id=*&subject=~{tag}")
    return [
        redmine.api("GET", f"/issues/{i['id']}.json?include=journals,attachments")["issue"]
        for i in found["issues"]
    ]


def attachment(redmine: Redmine, att: dict[str, Any]) -> Any:
    req = urllib.request.Request(att["content_url"], headers={"X-Redmine-API-Key": redmine.api_key})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_64_ranks_one_ticket_one_issue_one_alert(
    make_app: Callable[..., App],
    sinks_file: Callable[..., Path],
    redmine: Redmine,
    alertmanager: Alertmanager,
    receiver: HttpRecorder,
    job: str,
) -> None:
    app = make_app(sinks_file(alertmanager=alertmanager))
    for rank in range(64):
        app.post(bundle(rank=rank, world_size=64, job=job))
    assert app.drain() == 64

    page = app.client.get("/api/v1/tickets", params={"namespace": "ml"}).json()
    [ticket] = [t for t in page["items"] if t["job"] == job]
    assert (ticket["incident_count"], ticket["rank_count"], ticket["verdict"]) == (64, 64, "tensor_leak")
    url = f"http://triage.test/tickets/{ticket['id']}"

    assert app.deliver() == 2  # one issue and one alert, for 64 incidents
    assert app.deliver() == 0
    tag = f"oom-triage:{ticket['fingerprint'][:12]}"

    [issue] = issues(redmine, tag)
    assert issue["subject"].startswith(f"[{tag}] tensor leak in ml/{job}")
    assert url in issue["description"] and "64 rank(s)" in issue["description"]
    [att] = issue["attachments"]
    evidence = attachment(redmine, att)
    assert evidence["ticket"]["counts"]["ranks"] == 64
    assert evidence["diagnosis"]["verdict"] == "tensor_leak" and evidence["diagnosis"]["evidence"]

    note = next(n for n in (r.json() for r in receiver.wait_for(1)) if n["status"] == "firing")
    [alert] = [a for a in note["alerts"] if a["labels"].get("job") == job]
    assert alert["annotations"]["ticket_url"] == url and alert["generatorURL"] == url
    assert alert["labels"]["team"] == "ml-research" and alert["labels"]["verdict"] == "tensor_leak"
    assert [a["labels"]["job"] for a in alertmanager.alerts() if a["labels"].get("job") == job] == [job]

    detail = app.client.get(f"/api/v1/tickets/{ticket['id']}").json()
    assert sorted(link["sink"] for link in detail["links"]) == ["alertmanager", "redmine"]
    html = app.client.get(f"/tickets/{ticket['id']}").text
    assert f'href="{redmine.url}/issues/{issue["id"]}"' in html

    # a restart of rank 5 OOMs again: the same issue gets a note, the same alert is re-sent
    app.post(bundle(rank=5, world_size=64, job=job, restart=1))
    assert app.drain() == 1
    assert app.deliver() == 2
    [again] = issues(redmine, tag)
    assert again["id"] == issue["id"]
    notes = [j["notes"] for j in again["journals"] if j.get("notes")]
    assert len(notes) == 1 and "65 incident(s) on 64 rank(s), 1 restart(s)" in notes[0]
    assert len([a for a in alertmanager.alerts() if a["labels"].get("job") == job]) == 1


def test_a_redmine_outage_delays_delivery_and_never_loses_or_doubles_it(
    make_app: Callable[..., App], sinks_file: Callable[..., Path], redmine: Redmine, job: str
) -> None:
    app = make_app(sinks_file())
    redmine.stop_server()
    try:
        for rank in range(4):
            app.post(bundle(rank=rank, world_size=8, job=job))
        assert app.drain() == 4
        assert app.deliver() == 0
        with app.db.read_session() as s:
            [row] = s.scalars(
                select(OutboxItem).where(OutboxItem.sink == "redmine", OutboxItem.delivered_at.is_(None))
            ).all()
        assert row.attempts == 1 and "ConnectError" in (row.last_error or "")
        ticket_id = row.ticket_id
        page = app.client.get(f"/tickets/{ticket_id}").text
        assert 'id="deliveries"' in page and "ConnectError" in page

        time.sleep(0.4)  # the outage goes on: the retry fails too, and the rest of the job crashes meanwhile
        assert app.deliver() == 0
        for rank in range(4, 8):
            app.post(bundle(rank=rank, world_size=8, job=job))
        assert app.drain() == 4
        assert app.deliver() == 0
    finally:
        redmine.start_server()

    delivered, deadline = 0, time.monotonic() + 20
    while delivered == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        delivered = app.deliver()
    assert delivered == 1
    assert app.deliver() == 0
    ticket = app.client.get(f"/api/v1/tickets/{ticket_id}").json()
    [issue] = issues(redmine, f"oom-triage:{ticket['fingerprint'][:12]}")  # exactly once
    assert "8 rank(s)" in issue["description"]  # with the state it has now
    assert [j for j in issue["journals"] if j.get("notes")] == []
    with app.db.read_session() as s:
        assert all(r.delivered_at is not None for r in s.scalars(select(OutboxItem)))
