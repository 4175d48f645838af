"""The Alertmanager sink against a real Prometheus Alertmanager (Debian prometheus-alertmanager), routing
to a local webhook receiver, as an on-call route would."""

from __future__ import annotations

import pytest

from tests.realparts import Alertmanager, HttpRecorder
from tests.sinks.sinkkit import make_payload
from triage.tickets.sinks.alertmanager import AlertmanagerConfig, AlertmanagerSink

pytestmark = pytest.mark.slow


def test_alert_reaches_the_route_with_the_ticket_url(
    alertmanager: Alertmanager, receiver: HttpRecorder
) -> None:
    with AlertmanagerSink(AlertmanagerConfig(url=alertmanager.url, labels={"severity": "warning"})) as sink:
        p = make_payload(fingerprint="e5" * 16)
        ref = sink.create(p)
        assert ref.id == p.short_fingerprint and ref.data["labels"]["verdict"] == "tensor_leak"

        note = receiver.wait_for(1)[-1].json()
        assert note["version"] == "4" and note["status"] == "firing"
        [alert] = note["alerts"]
        assert alert["labels"] == {
            "alertname": "OOMTriageTicket",
            "fingerprint": p.short_fingerprint,
            "verdict": "tensor_leak",
            "owner": "algorithm",
            "team": "ml-research",
            "namespace": "ml",
            "job": "llama-70b-sft",
            "severity": "warning",
        }
        assert alert["annotations"]["ticket_url"] == "http://triage.test/tickets/42"
        assert alert["generatorURL"] == "http://triage.test/tickets/42"
        assert (
            "<script>" in alert["annotations"]["evidence"]
        )  # plain text: the receiver escapes for its medium

        # a recurrence updates the same alert (same label set), it does not add one
        sink.update(ref, p.model_copy(update={"action": "updated", "confidence": 0.97}))
        mine = [a for a in alertmanager.alerts() if a["labels"].get("fingerprint") == p.short_fingerprint]
        assert len(mine) == 1
        assert mine[0]["annotations"]["confidence"] == "0.97"

        # a resolved ticket resolves the alert
        sink.update(ref, p.model_copy(update={"action": "resolved", "status": "resolved"}))
        resolved = receiver.wait_for(2, timeout=15)[-1].json()
        assert resolved["status"] == "resolved"
        assert resolved["alerts"][0]["labels"]["fingerprint"] == p.short_fingerprint


def test_update_keeps_the_label_set_of_the_first_delivery(alertmanager: Alertmanager) -> None:
    with AlertmanagerSink(AlertmanagerConfig(url=alertmanager.url)) as sink:
        p = make_payload(fingerprint="f6" * 16)
        ref = sink.create(p)
        sink.update(ref, p.model_copy(update={"action": "updated", "team": "renamed"}))
        mine = [a for a in alertmanager.alerts() if a["labels"].get("fingerprint") == p.short_fingerprint]
        assert [a["labels"]["team"] for a in mine] == ["ml-research"]
