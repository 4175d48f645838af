"""Jira (Cloud and Data Center), REST API v2 or v3: one issue per ticket, a comment per recurrence.

Documented shapes (developer.atlassian.com/cloud/jira/platform/rest/v2 and /v3):

- create: ``POST /rest/api/{2|3}/issue`` with ``{"fields": {"project": {"key"}, "summary", "description",
  "issuetype": {"name"}, "labels": [...]}}`` → ``201 {"id", "key", "self"}``. In v2 the description is
  wiki markup (a string); in v3 it is an Atlassian Document Format (ADF) document.
- evidence: ``POST /rest/api/{2|3}/issue/<key>/attachments`` (multipart field ``file``, header
  ``X-Atlassian-Token: no-check``) → ``200 [{"id", "filename", …}]``.
- update: ``POST /rest/api/{2|3}/issue/<key>/comment`` with ``{"body": <string | ADF>}`` → ``201``.
- auth: with ``user``, HTTP Basic ``user:token`` (Cloud API tokens); without, ``Bearer <token>`` (a Data
  Center personal access token).

No Jira can run on the test machines: tests check these shapes against a local server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr

from triage.tickets.sinks.base import ExternalRef, PermanentSinkError, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload

EVIDENCE_FILENAME = "evidence.json"


class JiraConfig(SinkConfig):
    kind: Literal["jira"] = "jira"
    url: str  # https://example.atlassian.net
    api_version: Literal[2, 3] = 2
    project_key: str
    issue_type: str = "Bug"
    user: str | None = None
    token: SecretStr
    labels: list[str] = Field(default_factory=lambda: ["oom-triage"])
    extra_fields: dict[str, Any] = Field(
        default_factory=dict
    )  # e.g. {"components": [{"name": "training"}], "priority": {"name": "High"}}
    attach_evidence: bool = True


def adf(text: str) -> dict[str, Any]:
    """Plain text as an ADF document: a paragraph per line, ``* `` lines as bullet lists, URLs as links."""
    content: list[dict[str, Any]] = []
    bullets: list[dict[str, Any]] = []

    def flush() -> None:
        if bullets:
            content.append({"type": "bulletList", "content": list(bullets)})
            bullets.clear()

    for line in text.splitlines():
        if not line.strip():
            flush()
            continue
        if line.startswith("* "):
            bullets.append(
                {"type": "listItem", "content": [{"type": "paragraph", "content": _inline(line[2:])}]}
            )
            continue
        flush()
        content.append({"type": "paragraph", "content": _inline(line)})
    flush()
    return {"type": "doc", "version": 1, "content": content}


def _inline(line: str) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for i, word in enumerate(line.split(" ")):
        text = word if i == 0 else " " + word
        if word.startswith(("http://", "https://")):
            if i:
                nodes.append({"type": "text", "text": " "})
            nodes.append({"type": "text", "text": word, "marks": [{"type": "link", "attrs": {"href": word}}]})
        elif nodes and "marks" not in nodes[-1]:
            nodes[-1]["text"] += text
        elif text:
            nodes.append({"type": "text", "text": text})
    return [n for n in nodes if n["text"]] or [{"type": "text", "text": " "}]


class JiraSink(Sink[JiraConfig]):
    kind = "jira"
    config_model = JiraConfig

    @property
    def _api(self) -> str:
        return f"{self.config.url.rstrip('/')}/rest/api/{self.config.api_version}"

    def _auth(self) -> dict[str, Any]:
        token = self.config.token.get_secret_value()
        if self.config.user:
            return {"auth": (self.config.user, token)}
        return {"headers": {"Authorization": f"Bearer {token}"}}

    def _text(self, payload: TicketPayload, *, update: bool = False) -> Any:
        if self.config.api_version == 3:
            return adf(payload.body("plain", update=update))
        return payload.body("jira", update=update)

    def create(self, payload: TicketPayload) -> ExternalRef:
        fields: dict[str, Any] = {
            **self.config.extra_fields,
            "project": {"key": self.config.project_key},
            "summary": payload.subject().replace("\n", " "),
            "description": self._text(payload),
            "issuetype": {"name": self.config.issue_type},
            "labels": [*self.config.labels, payload.tag.replace(":", "-")],
        }
        auth = self._auth()
        response = self.request(
            "POST",
            f"{self._api}/issue",
            json={"fields": fields},
            headers={"Accept": "application/json", **auth.get("headers", {})},
            auth=auth.get("auth"),
        )
        data = response.json() if response.content else {}
        key = data.get("key") if isinstance(data, dict) else None
        if not isinstance(key, str):
            raise PermanentSinkError(f"{self.name}: create issue answered without a key")
        if self.config.attach_evidence:
            self.request(
                "POST",
                f"{self._api}/issue/{key}/attachments",
                files={"file": (EVIDENCE_FILENAME, payload.evidence_json(), "application/json")},
                headers={
                    "X-Atlassian-Token": "no-check",
                    "Accept": "application/json",
                    **auth.get("headers", {}),
                },
                auth=auth.get("auth"),
            )
        return self.ref(key, f"{self.config.url.rstrip('/')}/browse/{key}", id=str(data.get("id", "")))

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        auth = self._auth()
        self.request(
            "POST",
            f"{self._api}/issue/{ref.id}/comment",
            json={"body": self._text(payload, update=True)},
            headers={"Accept": "application/json", **auth.get("headers", {})},
            auth=auth.get("auth"),
            gone_on_404=True,
        )
