"""Redmine (REST API, www.redmine.org/projects/redmine/wiki/Rest_api): one issue per ticket.

- create: ``POST /uploads.json`` (``application/octet-stream``, the evidence JSON) → ``{"upload":
  {"token"}}``, then ``POST /issues.json`` with ``{"issue": {project_id, subject, description, uploads:
  [{token, filename, content_type}]}}`` → ``201 {"issue": {"id"}}``.
- update: ``PUT /issues/<id>.json`` with ``{"issue": {"notes": …}}`` → ``204``; a recurrence is a journal
  note on the same issue, never a new issue. A resolved ticket may also move the issue to
  ``close_status_id``.
- authentication: the ``X-Redmine-API-Key`` header (the key is a ``SecretStr``).

Every subject carries the ticket's tag (``[oom-triage:<fingerprint>]``). Before creating, the sink searches
the project for an issue with that tag (``GET /issues.json?subject=~<tag>&status_id=*``): if an earlier
attempt created the issue but its reply was lost, the retry finds it instead of opening a duplicate.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import SecretStr

from triage.tickets.sinks.base import ExternalRef, PermanentSinkError, Sink, SinkConfig
from triage.tickets.sinks.payload import Markup, TicketPayload

EVIDENCE_FILENAME = "evidence.json"


class RedmineConfig(SinkConfig):
    kind: Literal["redmine"] = "redmine"
    url: str
    api_key: SecretStr
    project: str  # identifier ("oom") or numeric id
    tracker_id: int | None = None
    priority_id: int | None = None
    assigned_to_id: int | None = None
    category_id: int | None = None
    close_status_id: int | None = None  # set on a resolved ticket; None: leave the status to people
    text_formatting: Literal["common_mark", "markdown", "textile"] = "common_mark"
    attach_evidence: bool = True
    attach_on_update: bool = False
    find_existing: bool = True


class RedmineSink(Sink[RedmineConfig]):
    kind = "redmine"
    config_model = RedmineConfig

    @property
    def _base(self) -> str:
        return self.config.url.rstrip("/")

    @property
    def _markup(self) -> Markup:
        return "textile" if self.config.text_formatting == "textile" else "markdown"

    def _headers(self) -> dict[str, str]:
        return {"X-Redmine-API-Key": self.config.api_key.get_secret_value()}

    def issue_url(self, issue_id: str) -> str:
        return f"{self._base}/issues/{issue_id}"

    def find(self, payload: TicketPayload) -> str | None:
        """The id of an issue in the project already carrying this ticket's tag, if any."""
        response = self.request(
            "GET",
            f"{self._base}/issues.json",
            params={
                "project_id": self.config.project,
                "status_id": "*",
                "subject": f"~{payload.tag}",
                "limit": 5,
            },
            headers=self._headers(),
        )
        for issue in _json(response).get("issues") or []:
            if isinstance(issue, dict) and payload.tag in str(issue.get("subject", "")):
                return str(issue["id"])
        return None

    def upload(self, content: bytes, filename: str = EVIDENCE_FILENAME) -> dict[str, str]:
        """Upload a file; the returned dict goes into an issue's ``uploads`` list."""
        response = self.request(
            "POST",
            f"{self._base}/uploads.json",
            params={"filename": filename},
            content=content,
            headers={**self._headers(), "Content-Type": "application/octet-stream"},
        )
        token = (_json(response).get("upload") or {}).get("token")
        if not isinstance(token, str):
            raise PermanentSinkError(f"{self.name}: /uploads.json answered without a token")
        return {"token": token, "filename": filename, "content_type": "application/json"}

    def create(self, payload: TicketPayload) -> ExternalRef:
        if self.config.find_existing:
            found = self.find(payload)
            if found is not None:
                return self.ref(found, self.issue_url(found))
        issue: dict[str, Any] = {
            "project_id": self.config.project,
            "subject": payload.subject(),
            "description": payload.body(self._markup),
        }
        for key in ("tracker_id", "priority_id", "assigned_to_id", "category_id"):
            value = getattr(self.config, key)
            if value is not None:
                issue[key] = value
        if self.config.attach_evidence:
            issue["uploads"] = [self.upload(payload.evidence_json())]
        response = self.request(
            "POST", f"{self._base}/issues.json", json={"issue": issue}, headers=self._headers()
        )
        issue_id = (_json(response).get("issue") or {}).get("id")
        if issue_id is None:
            raise PermanentSinkError(f"{self.name}: /issues.json answered without an issue id")
        return self.ref(str(issue_id), self.issue_url(str(issue_id)))

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        change: dict[str, Any] = {"notes": payload.body(self._markup, update=True)}
        if self.config.attach_evidence and self.config.attach_on_update:
            change["uploads"] = [self.upload(payload.evidence_json())]
        if payload.action == "resolved" and self.config.close_status_id is not None:
            change["status_id"] = self.config.close_status_id
        self.request(
            "PUT",
            f"{self._base}/issues/{ref.id}.json",
            json={"issue": change},
            headers=self._headers(),
            gone_on_404=True,
        )


def _json(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
