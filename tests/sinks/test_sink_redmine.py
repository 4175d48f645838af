"""The Redmine sink against a real Redmine 5 (Debian redmine + redmine-sqlite + thin), started by the tests."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from pydantic import SecretStr

from tests.realparts import Redmine, free_port
from tests.sinks.sinkkit import HOSTILE, make_payload
from triage.tickets.sinks.base import PermanentSinkError, RefGone, SinkError
from triage.tickets.sinks.redmine import RedmineConfig, RedmineSink

pytestmark = pytest.mark.slow


@pytest.fixture
def sink_for(redmine: Redmine) -> Iterator[Callable[..., RedmineSink]]:
    made: list[RedmineSink] = []

    def make(**changes: object) -> RedmineSink:
        cfg = {
            "url": redmine.url,
            "api_key": SecretStr(redmine.api_key),
            "project": redmine.project,
        } | changes
        made.append(RedmineSink(RedmineConfig.model_validate(cfg)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def issue(redmine: Redmine, issue_id: str) -> dict:
    return redmine.api("GET", f"/issues/{issue_id}.json?include=journals,attachments")["issue"]


def test_create_opens_an_issue_with_the_evidence_attached(
    redmine: Redmine, sink_for: Callable[..., RedmineSink]
) -> None:
    sink = sink_for()
    p = make_payload(fingerprint="a1" * 16)
    ref = sink.create(p)
    assert ref.kind == "redmine" and ref.sink == "redmine"
    assert ref.url == f"{redmine.url}/issues/{ref.id}"
    got = issue(redmine, ref.id)
    assert got["subject"] == p.subject()
    assert got["project"]["name"] == "OOM triage"
    assert "tensor\\_leak (owner: algorithm, confidence 93%)" in got["description"]
    assert "&lt;script&gt;" in got["description"] and HOSTILE not in got["description"]
    [att] = got["attachments"]
    assert att["filename"] == "evidence.json" and att["content_type"] == "application/json"
    req = urllib.request.Request(att["content_url"], headers={"X-Redmine-API-Key": redmine.api_key})
    with urllib.request.urlopen(req, timeout=30) as r:
        doc = json.loads(r.read())
    assert doc["ticket"]["fingerprint"] == p.fingerprint
    assert doc["diagnosis"]["verdict"] == "tensor_leak"


def test_update_adds_a_note_to_the_same_issue(redmine: Redmine, sink_for: Callable[..., RedmineSink]) -> None:
    sink = sink_for()
    p = make_payload(fingerprint="b2" * 16)
    ref = sink.create(p)
    sink.update(ref, p.model_copy(update={"action": "updated"}))
    got = issue(redmine, ref.id)
    notes = [j["notes"] for j in got["journals"] if j.get("notes")]
    assert len(notes) == 1 and notes[0].startswith("**Recurrence**: 3 incident(s) on 2 rank(s)")
    found = redmine.api("GET", f"/issues.json?project_id=oom&status_id=*&subject=~{p.tag}")
    assert found["total_count"] == 1


def test_a_retried_create_finds_the_issue_instead_of_opening_another(
    redmine: Redmine, sink_for: Callable[..., RedmineSink]
) -> None:
    """The reply to a create can be lost after Redmine stored the issue; the retry must not duplicate it."""
    sink = sink_for()
    p = make_payload(fingerprint="c3" * 16)
    first = sink.create(p)
    again = sink.create(p)
    assert again.id == first.id
    found = redmine.api("GET", f"/issues.json?project_id=oom&status_id=*&subject=~{p.tag}")
    assert found["total_count"] == 1


def test_resolution_closes_the_issue_when_configured(
    redmine: Redmine, sink_for: Callable[..., RedmineSink]
) -> None:
    closed = next(
        s["id"] for s in redmine.api("GET", "/issue_statuses.json")["issue_statuses"] if s["is_closed"]
    )
    sink = sink_for(close_status_id=closed)
    p = make_payload(fingerprint="d4" * 16)
    ref = sink.create(p)
    sink.update(ref, p.model_copy(update={"action": "resolved", "status": "resolved"}))
    assert issue(redmine, ref.id)["status"]["is_closed"] is True


def test_errors_are_classified(redmine: Redmine, sink_for: Callable[..., RedmineSink]) -> None:
    bad_key = sink_for(api_key=SecretStr("0" * 40), find_existing=False, attach_evidence=False)
    with pytest.raises(PermanentSinkError) as err:
        bad_key.create(make_payload())
    assert err.value.status == 401 and "0" * 40 not in str(err.value)

    sink = sink_for()
    with pytest.raises(RefGone):
        sink.update(sink.ref("999999"), make_payload(action="updated"))

    down = sink_for(url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SinkError) as err2:
        down.create(make_payload())
    assert type(err2.value) is SinkError  # transient: retried
