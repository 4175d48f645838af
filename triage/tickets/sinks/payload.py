"""The ticket payload: what every sink is given, built from a ticket and its latest diagnosis.

A payload is plain data (pydantic, frozen) so a sink never touches the database, and so tests can build
one by hand. It carries the event (``created`` / ``updated`` / ``resolved``), the idempotency key of the
delivery, the permalink, and everything a human needs to act without opening the link: verdict, owner,
confidence, the evidence sentences, the actions, the counts. ``evidence_document`` is the diagnosis JSON
that sinks able to take files attach as ``evidence.json``.

Text from the workload (job names, frame names, file names) is untrusted: the renderers here escape it
for the markup of each destination (``markdown``, ``textile``, ``jira``, ``slack``, ``plain``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Action = Literal["created", "updated", "resolved"]
Markup = Literal["markdown", "textile", "jira", "slack", "plain"]

TITLE_MAX = 240  # Redmine subjects and Jira summaries stop at 255


class Counts(BaseModel):
    """How much of the job this ticket groups."""

    model_config = ConfigDict(frozen=True)

    incidents: int = 0
    ranks: int = 0
    restarts: int = 0
    pods: int = 0


class TicketPayload(BaseModel):
    """One ticket as sinks see it (one delivery)."""

    model_config = ConfigDict(frozen=True)

    ticket_id: str
    fingerprint: str
    action: Action = "created"
    delivery_id: str = ""  # the outbox row: the same on every retry of one delivery
    title: str
    verdict: str
    owner: str | None = None
    team: str | None = None
    confidence: float = 0.0
    status: str = "open"
    url: str = ""
    headline: str = ""
    evidence: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    candidates: list[str] = Field(default_factory=list)
    counts: Counts = Field(default_factory=Counts)
    namespace: str | None = None
    job: str | None = None
    leak_site: str | None = None
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    evidence_document: dict[str, Any] = Field(default_factory=dict)

    @property
    def short_fingerprint(self) -> str:
        return self.fingerprint[:12]

    @property
    def tag(self) -> str:
        """The marker every external ticket carries, so a lost reply can be found again by search."""
        return f"oom-triage:{self.short_fingerprint}"

    def subject(self) -> str:
        """A one-line title with the tag, cut to fit every tracker's limit."""
        title = f"[{self.tag}] {self.title}"
        return title if len(title) <= TITLE_MAX else title[: TITLE_MAX - 1] + "…"

    def summary_line(self) -> str:
        owner = self.owner or "undecided"
        return f"{self.verdict} (owner: {owner}, confidence {self.confidence:.0%})"

    def evidence_json(self) -> bytes:
        """The evidence attachment: the diagnosis JSON with the ticket's identity beside it."""
        doc = {
            "ticket": {
                "id": self.ticket_id,
                "fingerprint": self.fingerprint,
                "url": self.url,
                "verdict": self.verdict,
                "owner": self.owner,
                "team": self.team,
                "counts": self.counts.model_dump(),
            },
            "diagnosis": self.evidence_document,
        }
        return json.dumps(doc, indent=2, sort_keys=True, default=str).encode()

    def body(self, markup: Markup = "markdown", *, update: bool = False) -> str:
        """The ticket text (or, with ``update``, the comment for a recurrence) in ``markup``."""
        esc = _ESCAPE[markup]
        bullet = "•" if markup == "slack" else "*"
        lines: list[str] = []
        if update or self.action != "created":
            lines.append(
                f"{_bold(markup, 'Recurrence' if self.action == 'updated' else self.action.capitalize())}: "
                f"{self.counts.incidents} incident(s) on {self.counts.ranks} rank(s), "
                f"{self.counts.restarts} restart(s), last seen {_when(self.last_seen)}."
            )
            lines.append("")
        lines.append(f"{_bold(markup, 'Verdict')}: {esc(self.summary_line())}")
        if self.team:
            lines.append(f"{_bold(markup, 'Team')}: {esc(self.team)}")
        if self.job or self.namespace:
            lines.append(
                f"{_bold(markup, 'Job')}: {esc('/'.join(x for x in (self.namespace, self.job) if x))}"
            )
        if self.leak_site:
            lines.append(f"{_bold(markup, 'Leak site')}: {esc(self.leak_site)}")
        if self.candidates and self.verdict == "inconclusive":
            lines.append(f"{_bold(markup, 'Candidates')}: {esc(', '.join(self.candidates))}")
        if self.headline:
            lines += ["", esc(self.headline)]
        if not update:
            for heading, items in (
                ("Evidence", self.evidence),
                ("Actions", self.actions),
                ("Missing evidence", self.missing),
            ):
                if items:
                    lines += ["", _bold(markup, heading)]
                    lines += [f"{bullet} {esc(i)}" for i in items]
            lines += [
                "",
                f"Counts: {self.counts.incidents} incident(s), {self.counts.ranks} rank(s), "
                f"{self.counts.restarts} restart(s); first seen {_when(self.first_seen)}, "
                f"last seen {_when(self.last_seen)}.",
            ]
        if self.url:
            lines += ["", f"Ticket: {_link(markup, self.url)}"]
        lines.append(f"Fingerprint: {esc(self.tag)}")
        return "\n".join(lines)


def _when(t: datetime | None) -> str:
    if t is None:
        return "-"
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bold(markup: Markup, text: str) -> str:
    if markup == "markdown":
        return f"**{text}**"
    return text if markup == "plain" else f"*{text}*"


def _link(markup: Markup, url: str) -> str:
    if markup == "slack":
        return f"<{url.replace('>', '%3E').replace('|', '%7C')}|open ticket>"
    if markup == "textile":
        return f'"open ticket":{url}'
    if markup == "jira":
        return f"[open ticket|{url}]"
    return url


def _escape_html(text: str) -> str:
    # markdown and textile both pass raw HTML through to their sanitiser; entities show the text as written
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_markdown(text: str) -> str:
    text = _escape_html(text)
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def _escape_textile(text: str) -> str:
    text = _escape_html(text)
    # textile: neutralise inline markers without changing what is read
    for ch in "*_+^~@|[]":
        text = text.replace(ch, f"&#{ord(ch)};")
    return text


def _escape_jira(text: str) -> str:
    # Jira wiki markup: a backslash makes the next character literal
    for ch in "\\{}[]*_|^~+!":
        text = text.replace(ch, "\\" + ch)
    return text


def _escape_slack(text: str) -> str:
    # Slack's mrkdwn needs only these three escaped (api.slack.com/reference/surfaces/formatting)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_ESCAPE = {
    "markdown": _escape_markdown,
    "textile": _escape_textile,
    "jira": _escape_jira,
    "slack": _escape_slack,
    "plain": lambda s: s,
}
