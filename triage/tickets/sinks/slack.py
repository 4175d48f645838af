"""Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat): one message per delivery.

``POST <webhook_url>`` with ``{"text": fallback, "blocks": [...]}`` (api.slack.com/messaging/webhooks);
the reply is ``200 ok``. Incoming webhooks cannot edit a message, so a recurrence is a short new message
(turn it off with ``notify_updates: false``). The webhook URL is itself the credential: a ``SecretStr``.
Text is escaped for mrkdwn (``&``, ``<``, ``>``), so a frame name can never become a link or a mention.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import SecretStr

from triage.tickets.sinks.base import ExternalRef, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload, _escape_slack

SECTION_MAX = 3000  # Slack's limit for a section's text


class SlackConfig(SinkConfig):
    kind: Literal["slack"] = "slack"
    webhook_url: SecretStr
    channel: str | None = None  # honoured by legacy webhooks and Mattermost
    username: str | None = None


def message(payload: TicketPayload, *, update: bool = False) -> dict[str, Any]:
    """The webhook body for one delivery."""
    title = _escape_slack(payload.subject())
    text = payload.body("slack", update=update)
    if len(text) > SECTION_MAX:
        text = text[: SECTION_MAX - 1] + "…"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": payload.subject()[:150], "emoji": False}},
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
    ]
    if payload.url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open ticket"},
                        "url": payload.url,
                    }
                ],
            }
        )
    return {"text": f"{title}: {_escape_slack(payload.summary_line())}", "blocks": blocks}


class SlackSink(Sink[SlackConfig]):
    kind = "slack"
    config_model = SlackConfig

    def create(self, payload: TicketPayload) -> ExternalRef:
        self._send(message(payload))
        return self.ref(payload.ticket_id, payload.url or None)

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        self._send(message(payload, update=True))

    def _send(self, body: dict[str, Any]) -> None:
        if self.config.channel:
            body["channel"] = self.config.channel
        if self.config.username:
            body["username"] = self.config.username
        self.request("POST", self.config.webhook_url.get_secret_value(), json=body, secret_url=True)
