"""Generic webhook: the payload as JSON, signed with HMAC-SHA256 so the receiver can trust it.

Each POST carries::

    Content-Type: application/json
    X-Triage-Event: ticket.created | ticket.updated | ticket.resolved
    X-Triage-Delivery: <delivery id>          the same on every retry of one delivery: dedupe on it
    X-Triage-Timestamp: <unix seconds>
    X-Triage-Signature-256: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>

The timestamp is inside the signed bytes, so a captured request cannot be replayed later than the
receiver's tolerance (:func:`verify` defaults to five minutes). The body is
``{"event", "delivery_id", "sent_at", "ticket": <TicketPayload JSON>}``. A 2xx reply is a delivery; a reply
with a JSON ``{"id": ..., "url": ...}`` names the receiver's own ticket, kept as the external reference.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, SecretStr

from triage.tickets.sinks.base import ExternalRef, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload

SIGNATURE_HEADER = "X-Triage-Signature-256"
TIMESTAMP_HEADER = "X-Triage-Timestamp"
EVENT_HEADER = "X-Triage-Event"
DELIVERY_HEADER = "X-Triage-Delivery"


class WebhookConfig(SinkConfig):
    kind: Literal["webhook"] = "webhook"
    url: str
    secret: SecretStr
    headers: dict[str, str] = Field(default_factory=dict)


def sign(secret: str | bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    key = secret.encode() if isinstance(secret, str) else secret
    digest = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """For receivers: is this request signed with ``secret`` and recent? (constant-time compare)."""
    lower = {k.lower(): v for k, v in headers.items()}
    given = lower.get(SIGNATURE_HEADER.lower(), "")
    timestamp = lower.get(TIMESTAMP_HEADER.lower(), "")
    try:
        sent = float(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance_s:
        return False
    return hmac.compare_digest(given, sign(secret, timestamp, body))


class WebhookSink(Sink[WebhookConfig]):
    kind = "webhook"
    config_model = WebhookConfig

    def create(self, payload: TicketPayload) -> ExternalRef:
        data = self._post(payload)
        ext_id = data.get("id") if isinstance(data, dict) else None
        ext_url = data.get("url") if isinstance(data, dict) else None
        return self.ref(
            str(ext_id)
            if isinstance(ext_id, str | int) and not isinstance(ext_id, bool)
            else payload.ticket_id,
            ext_url if isinstance(ext_url, str) else payload.url or None,
        )

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        self._post(payload, external_id=ref.id)

    def _post(self, payload: TicketPayload, external_id: str | None = None) -> Any:
        event = f"ticket.{payload.action}"
        doc: dict[str, Any] = {
            "event": event,
            "delivery_id": payload.delivery_id,
            "sent_at": datetime.now(UTC).isoformat(),
            "ticket": payload.model_dump(mode="json"),
        }
        if external_id is not None:
            doc["external_id"] = external_id
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        timestamp = str(int(time.time()))
        headers = {
            **self.config.headers,
            "Content-Type": "application/json",
            EVENT_HEADER: event,
            DELIVERY_HEADER: payload.delivery_id,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(self.config.secret.get_secret_value(), timestamp, body),
        }
        response = self.request("POST", self.config.url, content=body, headers=headers)
        if "json" not in response.headers.get("content-type", ""):
            return None
        try:
            return response.json()
        except ValueError:
            return None
