"""GitHub Issues (REST, docs.github.com/rest/issues): one issue per ticket, a comment per recurrence.

- create: ``POST /repos/{owner}/{repo}/issues`` with ``{"title", "body", "labels", "assignees"}`` →
  ``201 {"id", "number", "html_url", …}``.
- update: ``POST /repos/{owner}/{repo}/issues/{number}/comments`` with ``{"body"}`` → ``201``; a resolved
  ticket also closes the issue (``PATCH …/issues/{number}`` with ``{"state": "closed", "state_reason":
  "completed"}`` → ``200``).
- headers: ``Authorization: Bearer <token>``, ``Accept: application/vnd.github+json``,
  ``X-GitHub-Api-Version: 2022-11-28``. GitHub Enterprise: set ``api_url`` to ``https://HOST/api/v3``.

No GitHub can run on the test machines: tests check these shapes against a local server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from triage.tickets.sinks.base import ExternalRef, PermanentSinkError, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload

API_VERSION = "2022-11-28"
BODY_MAX = 65000  # GitHub refuses bodies over 65,536 characters


class GitHubConfig(SinkConfig):
    kind: Literal["github"] = "github"
    api_url: str = "https://api.github.com"
    repository: str  # owner/name
    token: SecretStr
    labels: list[str] = Field(default_factory=lambda: ["oom-triage"])
    assignees: list[str] = Field(default_factory=list)
    close_on_resolve: bool = True

    @field_validator("repository")
    @classmethod
    def _owner_slash_name(cls, value: str) -> str:
        parts = value.split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError("repository must be 'owner/name'")
        return value


class GitHubSink(Sink[GitHubConfig]):
    kind = "github"
    config_model = GitHubConfig

    @property
    def _repo(self) -> str:
        return f"{self.config.api_url.rstrip('/')}/repos/{self.config.repository}"

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.config.token.get_secret_value()}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
        }

    def create(self, payload: TicketPayload) -> ExternalRef:
        body: dict[str, Any] = {
            "title": payload.subject(),
            "body": payload.body("markdown")[:BODY_MAX],
            "labels": list(self.config.labels),
        }
        if self.config.assignees:
            body["assignees"] = list(self.config.assignees)
        response = self.request("POST", f"{self._repo}/issues", json=body, headers=self._headers())
        data = response.json() if response.content else {}
        number = data.get("number") if isinstance(data, dict) else None
        if not isinstance(number, int):
            raise PermanentSinkError(f"{self.name}: create issue answered without a number")
        html_url = data.get("html_url")
        return self.ref(str(number), html_url if isinstance(html_url, str) else None)

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        self.request(
            "POST",
            f"{self._repo}/issues/{ref.id}/comments",
            json={"body": payload.body("markdown", update=True)[:BODY_MAX]},
            headers=self._headers(),
            gone_on_404=True,
        )
        if payload.action == "resolved" and self.config.close_on_resolve:
            self.request(
                "PATCH",
                f"{self._repo}/issues/{ref.id}",
                json={"state": "closed", "state_reason": "completed"},
                headers=self._headers(),
                gone_on_404=True,
            )
