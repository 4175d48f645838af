"""Grouping and the ticket lifecycle: ranks and restarts fold into one ticket by fingerprint, a resolved
ticket reopens on recurrence, the status workflow and assignment, filters, and the sinks hook."""

from __future__ import annotations

import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.service.svckit import T0, Service, bundle, post
from triage.store.models import Incident
from triage.tickets import grouping
from triage.tickets import service as tickets


def only_ticket(svc: Service, **params: Any) -> dict[str, Any]:
    page = svc.client.get("/api/v1/tickets", params=params).json()
    assert page["total"] == 1, page
    detail: dict[str, Any] = svc.client.get(f"/api/v1/tickets/{page['items'][0]['id']}").json()
    return detail


def test_ranks_and_restarts_of_one_job_fold_into_one_ticket(service: Service) -> None:
    for restart in range(2):
        for rank in range(16):
            r = post(
                service.client,
                bundle(rank=rank, restart=restart, at=T0 + timedelta(minutes=restart, seconds=rank)),
            )
            assert r.status_code == 202
    assert service.drain() == 32
    t = only_ticket(service)
    assert (t["incident_count"], t["rank_count"], t["pod_count"], t["max_restart"]) == (32, 16, 2, 1)
    assert (t["verdict"], t["owner"], t["team"], t["namespace"], t["job"]) == (
        "shm_exhausted",
        "platform",
        "nlp-research",
        "ml-training",
        "llama-sft",
    )
    assert t["status"] == "open" and t["site"] == "-"
    assert t["first_seen"].startswith("2026-03-01T12:00:00") and t["last_seen"].startswith(
        "2026-03-01T12:01:15"
    )
    assert t["title"] == "shm exhausted in ml-training/llama-sft"
    ranks = t["ranks"]
    assert len(ranks) == 32
    assert [(r["rank"], r["restart"]) for r in ranks[:3]] == [(0, 0), (0, 1), (1, 0)]
    assert {"rank", "pod", "node", "step", "restart", "incident_id", "verdict"} <= set(ranks[0])
    assert ranks[-1]["pod"] == "llama-sft-worker-1"
    assert [e["kind"] for e in t["events"]] == ["created"]
    assert t["summary"]["verdict"] == "shm_exhausted" and t["summary"]["evidence"]


def test_different_jobs_namespaces_and_verdicts_get_their_own_tickets(service: Service) -> None:
    post(service.client, bundle(job="a"))
    post(service.client, bundle(job="a", rank=1))
    post(service.client, bundle(job="b"))
    post(service.client, bundle(job="a", namespace="other", team="vision"))
    post(service.client, bundle("host_memory_limit", job="a"))
    service.drain()
    page = service.client.get("/api/v1/tickets").json()
    assert page["total"] == 4
    assert sorted((t["namespace"], t["job"], t["verdict"], t["incident_count"]) for t in page["items"]) == [
        ("ml-training", "a", "host_memory_limit", 1),
        ("ml-training", "a", "shm_exhausted", 2),
        ("ml-training", "b", "shm_exhausted", 1),
        ("other", "a", "shm_exhausted", 1),
    ]
    get = service.client.get
    assert get("/api/v1/tickets", params={"team": "vision"}).json()["total"] == 1
    assert get("/api/v1/tickets", params={"verdict": "host_memory_limit"}).json()["total"] == 1
    assert (
        get("/api/v1/tickets", params={"namespace": "ml-training", "verdict": "shm_exhausted"}).json()[
            "total"
        ]
        == 2
    )
    assert get("/api/v1/tickets", params={"status": "resolved"}).json()["total"] == 0
    one = get("/api/v1/tickets", params={"limit": 3, "offset": 3}).json()
    assert (one["total"], len(one["items"]), one["offset"]) == (4, 1, 3)
    assert get("/api/v1/tickets", params={"status": "bogus"}).status_code == 422
    assert get("/api/v1/tickets/999999").status_code == 404


def test_a_resolved_ticket_reopens_on_recurrence_but_not_for_late_ranks(service: Service) -> None:
    post(service.client, bundle(rank=0, at=T0))
    service.drain()
    t = only_ticket(service)
    r = service.client.patch(f"/api/v1/tickets/{t['id']}", json={"status": "resolved"})
    assert r.status_code == 200 and r.json()["status"] == "resolved"
    post(service.client, bundle(rank=1, at=T0 + timedelta(seconds=5)))  # same crash, posted late
    service.drain()
    t = only_ticket(service)
    assert (t["status"], t["incident_count"], t["reopen_count"]) == ("resolved", 2, 0)
    post(
        service.client, bundle(rank=0, restart=3, at=datetime.now(UTC) + timedelta(seconds=1))
    )  # after the fix
    service.drain()
    t = only_ticket(service)
    assert (t["status"], t["incident_count"], t["reopen_count"], t["resolved_at"]) == ("open", 3, 1, None)
    assert [e["kind"] for e in t["events"]] == ["created", "status", "reopened"]


def test_the_status_workflow_and_assignment(make_service: Callable[..., Service]) -> None:
    svc = make_service(trusted_user_header="X-Forwarded-User")
    post(svc.client, bundle(), token=None)
    svc.drain()
    tid = svc.client.get("/api/v1/tickets", headers={"X-Forwarded-User": "x"}).json()["items"][0]["id"]

    def patch(body: dict[str, Any], user: str = "alice") -> Any:
        return svc.client.patch(f"/api/v1/tickets/{tid}", json=body, headers={"X-Forwarded-User": user})

    assert patch({"status": "acknowledged", "assignee": "bob"}).json()["acknowledged_at"] is not None
    assert patch({"status": "acknowledged"}).status_code == 200  # same status: a no-op
    r = patch({"status": "resolved", "note": "raised /dev/shm to 64Gi"}, user="bob")
    assert r.status_code == 200 and r.json()["status"] == "resolved" and r.json()["assignee"] == "bob"
    r = patch({"status": "acknowledged"})
    assert r.status_code == 409 and "resolved to acknowledged" in r.json()["detail"]
    assert patch({"status": "open"}).json()["status"] == "open"
    assert patch({"assignee": None}).json()["assignee"] is None
    assert patch({"status": "bogus"}).status_code == 422
    assert patch({"unknown": 1}).status_code == 422
    assert svc.client.patch(f"/api/v1/tickets/{tid}", json={"status": "open"}).status_code == 401
    events = svc.client.get(f"/api/v1/tickets/{tid}", headers={"X-Forwarded-User": "x"}).json()["events"]
    assert [(e["kind"], e["actor"]) for e in events] == [
        ("created", "system"),
        ("status", "alice"),
        ("assigned", "alice"),
        ("status", "bob"),
        ("note", "bob"),
        ("status", "alice"),
        ("assigned", "alice"),
    ]
    assert (
        svc.client.get(
            "/api/v1/tickets", params={"assignee": "bob"}, headers={"X-Forwarded-User": "x"}
        ).json()["total"]
        == 0
    )


def test_ticket_changes_reach_the_sinks_outbox_hook(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, str]] = []

    def enqueue(session: Any, ticket: Any, action: str) -> None:
        calls.append((ticket.id, action))
        if action == "update" and len(calls) == 3:
            raise RuntimeError("a broken sink plugin")

    monkeypatch.setattr(tickets, "_outbox", types.SimpleNamespace(enqueue=enqueue))
    post(service.client, bundle(rank=0))
    post(service.client, bundle(rank=1))
    post(service.client, bundle(rank=2))
    service.drain()
    t = only_ticket(service)
    service.client.patch(f"/api/v1/tickets/{t['id']}", json={"status": "acknowledged"})
    assert calls == [(t["id"], "create"), (t["id"], "update"), (t["id"], "update"), (t["id"], "update")]
    assert only_ticket(service)["incident_count"] == 3  # the failing hook lost nothing


def test_leaking_ranks_group_by_leak_site(service: Service) -> None:
    for rank in range(3):
        assert post(service.client, bundle("leak_like_big_batch", seed=0, rank=rank)).status_code == 202
    service.drain()
    t = only_ticket(service)
    assert t["verdict"] == "tensor_leak" and t["owner"] == "algorithm"
    leak = t["summary"]["leak_site"]
    assert t["site"] == f"{leak['filename']}:{leak['line']}"
    assert t["site"] in t["title"] and t["incident_count"] == 3


def _incident(**kw: Any) -> Incident:
    base: dict[str, Any] = {"cluster": "c", "namespace": "ns", "labels": {}}
    base.update(kw)
    return Incident(**base)


def test_fingerprints() -> None:
    inc = _incident(job="llama")
    leak = {"verdict": "tensor_leak", "leak_site": {"filename": "train.py", "line": 42}}
    other_line = {"verdict": "tensor_leak", "leak_site": {"filename": "train.py", "line": 43}}
    assert grouping.fingerprint(incident=inc, diagnosis=leak)[1] == "train.py:42"
    assert grouping.fingerprint(incident=inc, diagnosis=leak) != grouping.fingerprint(
        incident=inc, diagnosis=other_line
    )
    assert grouping.fingerprint(incident=inc, diagnosis=leak) != grouping.fingerprint(
        incident=_incident(job="llama", cluster="d"), diagnosis=leak
    )
    mig = {
        "verdict": "gpu_quota",
        "evidence": [{"rule": "gpu_quota", "fact": "…", "value": {"mig_profile": "1g.10gb"}}],
    }
    cap = {
        "verdict": "gpu_quota",
        "evidence": [{"rule": "gpu_quota", "fact": "…", "value": {"fraction_cap_bytes": 9}}],
    }
    assert grouping.site_of(verdict="gpu_quota", diagnosis=mig) == "mig:1g.10gb"
    assert grouping.site_of(verdict="gpu_quota", diagnosis=cap) == "fraction"
    assert grouping.site_of(verdict="shm_exhausted", diagnosis={}) == "-"


@pytest.mark.parametrize(
    ("fields", "identity"),
    [
        ({"job": "j"}, "j"),
        ({"owner_kind": "PyTorchJob", "owner_name": "p"}, "PyTorchJob/p"),
        ({"labels": {"training.kubeflow.org/job-name": "kf"}}, "kf"),
        ({"pod": "llama-sft-worker-3"}, "llama-sft"),
        ({"pod": "resnet-train-7f9c6d5b4-x2x9z"}, "resnet-train"),
        ({"pod": "bert-dpo-master-0"}, "bert-dpo"),
        ({}, "-"),
    ],
)
def test_job_identity(fields: dict[str, Any], identity: str) -> None:
    assert grouping.job_identity(incident=_incident(**fields)) == identity
