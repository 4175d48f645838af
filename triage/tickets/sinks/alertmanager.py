"""Prometheus Alertmanager: one alert per ticket, posted to ``/api/v2/alerts``; the ticket URL rides along.

The alert (prometheus.io/docs/alerting/latest/clients, the v2 OpenAPI ``postableAlerts``)::

    [{"labels": {"alertname": "OOMTriageTicket", "fingerprint": …, "verdict": …, "owner": …, "team": …,
                 "namespace": …, "job": …, <static labels>},
      "annotations": {"summary": …, "description": …, "ticket_url": <permalink>, "evidence": …},
      "generatorURL": <permalink>, "startsAt": …, "endsAt": …}]

Alertmanager identifies an alert by its label set, so a recurrence re-posts the labels of the first
delivery (kept in the external reference) with fresh annotations: the same alert, updated, never a second
one. ``endsAt`` is ``resolve_after_s`` ahead (re-posting extends it); a resolved ticket ends it now.
Routing to receivers (team → Slack, PagerDuty, …) is Alertmanager's own configuration.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import Field, SecretStr

from triage.tickets.sinks.base import ExternalRef, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload

ANNOTATION_MAX = 4000


class AlertmanagerConfig(SinkConfig):
    kind: Literal["alertmanager"] = "alertmanager"
    url: str  # the Alertmanager base URL, e.g. http://alertmanager:9093
    alertname: str = "OOMTriageTicket"
    labels: dict[str, str] = Field(default_factory=dict)  # static labels: cluster, severity, …
    resolve_after_s: float | None = Field(default=6 * 3600, gt=0)  # None: Alertmanager's resolve_timeout
    bearer_token: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None


def _rfc3339(t: datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertmanagerSink(Sink[AlertmanagerConfig]):
    kind = "alertmanager"
    config_model = AlertmanagerConfig

    def labels(self, payload: TicketPayload) -> dict[str, str]:
        labels = {
            **self.config.labels,
            "alertname": self.config.alertname,
            "fingerprint": payload.short_fingerprint,
            "verdict": payload.verdict,
            "owner": payload.owner or "",
            "team": payload.team or "",
            "namespace": payload.namespace or "",
            "job": payload.job or "",
        }
        return {k: v for k, v in labels.items() if v}  # an empty label is no label in Alertmanager

    def alert(self, payload: TicketPayload, labels: dict[str, str]) -> dict[str, Any]:
        now = datetime.now(UTC)
        description = payload.body("plain")
        annotations = {
            "summary": payload.subject(),
            "description": description[:ANNOTATION_MAX],
            "ticket_url": payload.url,
            "confidence": f"{payload.confidence:.2f}",
            "incidents": str(payload.counts.incidents),
            "ranks": str(payload.counts.ranks),
        }
        if payload.evidence:
            annotations["evidence"] = "\n".join(payload.evidence)[:ANNOTATION_MAX]
        if payload.actions:
            annotations["actions"] = "\n".join(payload.actions)[:ANNOTATION_MAX]
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": {k: v for k, v in annotations.items() if v},
            "startsAt": _rfc3339(payload.first_seen or now),
        }
        if payload.url:
            alert["generatorURL"] = payload.url
        if payload.action == "resolved" or payload.status in ("resolved", "closed"):
            alert["endsAt"] = _rfc3339(now)
        elif self.config.resolve_after_s is not None:
            alert["endsAt"] = _rfc3339(now + timedelta(seconds=self.config.resolve_after_s))
        return alert

    def create(self, payload: TicketPayload) -> ExternalRef:
        labels = self.labels(payload)
        self._post(self.alert(payload, labels))
        return self.ref(payload.short_fingerprint, payload.url or None, labels=labels)

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        stored = ref.data.get("labels")
        labels = (
            {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else self.labels(payload)
        )
        self._post(self.alert(payload, labels))

    def _post(self, alert: dict[str, Any]) -> None:
        headers: dict[str, str] = {}
        auth: tuple[str, str] | None = None
        if self.config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.config.bearer_token.get_secret_value()}"
        elif self.config.username and self.config.password is not None:
            auth = (self.config.username, self.config.password.get_secret_value())
        url = self.config.url.rstrip("/") + "/api/v2/alerts"
        self.request("POST", url, json=[alert], headers=headers, auth=auth)
