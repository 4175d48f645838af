"""The one small interface every ticket system implements.

A sink turns a :class:`~triage.tickets.sinks.payload.TicketPayload` into something outside: an issue in a
tracker, a chat message, an alert. Two calls, both synchronous and safe to retry:

- ``create(payload) -> ExternalRef``: the first delivery of a ticket; the reference is stored (the
  ``SinkLink`` table) so every later delivery of the same ticket is an
- ``update(ref, payload) -> None``: a recurrence, a new rank, a resolution: a comment, a re-sent alert.

Errors form a small tree; the outbox retries all of them with exponential backoff, so an outage delays a
delivery but never loses it::

    SinkError                 transient: connection refused, timeout, 5xx, 429 — retried
    ├── PermanentSinkError    the request is refused as written (4xx): retried at the slowest pace
    └── RefGone               the external ticket no longer exists (404 on update): create a new one

Each sink has its own pydantic config (secrets as ``SecretStr``, never printed), selected by ``kind`` in
the per-team configuration (``registry.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from triage import __version__
from triage.errors import TriageError
from triage.tickets.sinks.payload import TicketPayload

USER_AGENT = f"oom-triage/{__version__}"


class SinkError(TriageError):
    """A delivery that did not happen; retry later."""

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


class PermanentSinkError(SinkError):
    """The system refused the request as written (bad credentials, unknown project, invalid field)."""


class RefGone(SinkError):
    """The external ticket behind a reference was deleted; the next delivery creates a new one."""


class ExternalRef(BaseModel):
    """Where a ticket lives in one external system."""

    model_config = ConfigDict(frozen=True)

    sink: str  # the configured sink's name (unique within a team)
    kind: str  # redmine, jira, github, alertmanager, webhook, slack
    id: str  # the external key: issue id, Jira key, GitHub number, alert fingerprint
    url: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)  # what update() needs besides the id


class SinkConfig(BaseModel):
    """Fields every sink has. Subclasses add their own (URL, project, credentials)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    name: str = ""  # defaults to ``kind``; must be unique within a team
    enabled: bool = True
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    notify_updates: bool = True  # False: only the first delivery goes out, recurrences stay internal

    @property
    def sink_name(self) -> str:
        return self.name or self.kind


C = TypeVar("C", bound=SinkConfig)


class Sink(Generic[C]):
    """Base class: one instance per configured sink. Subclasses set ``kind`` and ``config_model``."""

    kind: ClassVar[str] = ""
    config_model: ClassVar[type[SinkConfig]] = SinkConfig

    def __init__(self, config: C, *, client: httpx.Client | None = None):
        self.config = config
        self.name = config.sink_name
        self._client = client
        self._own_client = client is None

    # -- the interface -------------------------------------------------------------------------------
    def create(self, payload: TicketPayload) -> ExternalRef:
        """Open the ticket outside; return where it lives."""
        raise NotImplementedError

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        """Tell the external ticket what changed (a recurrence, more ranks, a resolution)."""
        raise NotImplementedError

    # -- helpers for subclasses ----------------------------------------------------------------------
    def ref(self, external_id: str, url: str | None = None, **data: Any) -> ExternalRef:
        return ExternalRef(sink=self.name, kind=self.kind, id=external_id, url=url, data=data)

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                timeout=self.config.timeout_s,
                headers={"User-Agent": USER_AGENT},
                follow_redirects=False,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None and self._own_client:
            self._client.close()
            self._client = None

    def request(
        self, method: str, url: str, *, gone_on_404: bool = False, secret_url: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Send one request; map transport failures and error statuses onto the error tree.

        ``secret_url``: the URL is itself a credential (a Slack webhook): errors name only its host.
        """
        shown = _host_only(url) if secret_url else _safe(url)
        try:
            response = self.client.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            raise SinkError(f"{self.name}: {method} {shown} timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise SinkError(f"{self.name}: {method} {shown} failed: {type(exc).__name__}") from None
        status = response.status_code
        if status < 300:
            return response
        text = _excerpt(response)
        message = f"{self.name}: {method} {shown} → HTTP {status}: {text}"
        if status == 404 and gone_on_404:
            raise RefGone(message, status=status)
        if status in (408, 409, 423, 425, 429) or status >= 500:
            raise SinkError(message, retry_after=_retry_after(response), status=status)
        raise PermanentSinkError(message, status=status)

    def __enter__(self) -> Sink[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _safe(url: str) -> str:
    """A URL without its query (tokens sometimes travel there) for error messages."""
    return url.split("?", 1)[0]


def _host_only(url: str) -> str:
    try:
        u = httpx.URL(url)
    except Exception:
        return "<url>"
    return f"{u.scheme}://{u.host}/…"


def _excerpt(response: httpx.Response, limit: int = 300) -> str:
    try:
        text = response.text
    except Exception:  # undecodable body
        return "<unreadable body>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
