"""Which sinks a ticket goes to: the per-team configuration file (``TRIAGE_SINKS_CONFIG``).

YAML or JSON (by extension; JSON is also valid YAML)::

    default_team: platform            # tickets whose team has no entry go here
    owners:                           # optional: verdict owner → team, ahead of the job's own team
      platform: platform              #   (a quota or /dev/shm problem is the platform team's to fix)
    teams:
      platform:
        sinks:
          - kind: redmine
            url: https://redmine.internal
            api_key: ${REDMINE_API_KEY}  # ${VAR} is read from the environment at load time
            project: gpu-platform
          - kind: alertmanager
            url: http://alertmanager.monitoring:9093
            labels: {severity: warning, cluster: prod-a}
      ml-research:
        sinks:
          - {kind: slack, webhook_url: "${ML_SLACK_WEBHOOK}"}
          - {kind: github, repository: acme/trainer, token: "${GITHUB_TOKEN}"}
    delivery:                         # outbox pacing (all optional)
      backoff_base_s: 5
      backoff_max_s: 900
      lease_s: 300

A ticket's team: ``owners[<verdict owner>]`` when listed, else the ticket's own team (the workload's
``team``) when it has an entry, else ``default_team``. Each sink's ``name`` (default: its ``kind``) is
unique within its team; it is the key of the delivery state, so renaming a sink starts a new external
ticket. Secrets are ``SecretStr``: never printed, never in ``repr``. Kinds: webhook, slack,
alertmanager, redmine, jira, github.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from triage.errors import InputError
from triage.tickets.sinks.alertmanager import AlertmanagerConfig, AlertmanagerSink
from triage.tickets.sinks.base import Sink, SinkConfig
from triage.tickets.sinks.github import GitHubConfig, GitHubSink
from triage.tickets.sinks.jira import JiraConfig, JiraSink
from triage.tickets.sinks.redmine import RedmineConfig, RedmineSink
from triage.tickets.sinks.slack import SlackConfig, SlackSink
from triage.tickets.sinks.webhook import WebhookConfig, WebhookSink

SINK_CLASSES: dict[str, type[Sink[Any]]] = {
    cls.kind: cls for cls in (WebhookSink, SlackSink, AlertmanagerSink, RedmineSink, JiraSink, GitHubSink)
}

AnySinkConfig = Annotated[
    WebhookConfig | SlackConfig | AlertmanagerConfig | RedmineConfig | JiraConfig | GitHubConfig,
    Field(discriminator="kind"),
]


class ConfigError(InputError):
    """The sinks configuration file cannot be used; the message says where."""


class TeamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sinks: list[AnySinkConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> TeamConfig:
        names = [s.sink_name for s in self.sinks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"sink names must be unique within a team; repeated: {', '.join(dupes)}")
        return self


class DeliveryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff_base_s: float = Field(default=5.0, gt=0)
    backoff_max_s: float = Field(default=900.0, gt=0)
    lease_s: float = Field(default=300.0, gt=0)  # a claim not finished by then is retried
    batch: int = Field(default=50, ge=1, le=1000)  # deliveries per deliver_due() call


class SinksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default_team: str = "default"
    owners: dict[str, str] = Field(default_factory=dict)
    teams: dict[str, TeamConfig] = Field(default_factory=dict)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)

    @model_validator(mode="after")
    def _lease_covers_timeouts(self) -> SinksConfig:
        for team, tc in self.teams.items():
            for s in tc.sinks:
                # a create may take a search, an upload and the create itself
                if 3 * s.timeout_s >= self.delivery.lease_s:
                    raise ValueError(
                        f"teams.{team}: sink {s.sink_name!r} timeout_s={s.timeout_s} must be under a third of "
                        f"delivery.lease_s={self.delivery.lease_s}"
                    )
        return self


class Registry:
    """The loaded configuration and one sink instance per configured sink (HTTP clients reused)."""

    def __init__(self, config: SinksConfig | None = None, *, sinks: Iterable[tuple[str, Sink[Any]]] = ()):
        self.config = config or SinksConfig()
        self._sinks: dict[tuple[str, str], Sink[Any]] = {}
        for team, tc in self.config.teams.items():
            for sc in tc.sinks:
                if sc.enabled:
                    self._sinks[(team, sc.sink_name)] = SINK_CLASSES[sc.kind](sc)
        for team, sink in sinks:  # tests: sinks built by hand (e.g. with their own HTTP client)
            self._sinks[(team, sink.name)] = sink

    @property
    def delivery(self) -> DeliveryConfig:
        return self.config.delivery

    def team_for(self, team: str | None, owner: str | None = None) -> str:
        """The team whose sinks receive a ticket (see the module docstring for the order)."""
        if owner and owner in self.config.owners:
            return self.config.owners[owner]
        if team and any(t == team for t, _ in self._sinks):
            return team
        if team and team in self.config.teams:
            return team
        return self.config.default_team

    def sinks(self, team: str) -> list[Sink[Any]]:
        return [s for (t, _), s in self._sinks.items() if t == team]

    def sink(self, team: str, name: str) -> Sink[Any] | None:
        return self._sinks.get((team, name))

    def close(self) -> None:
        for s in self._sinks.values():
            s.close()


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: Any, where: str, env: dict[str, str]) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in env:
                raise ConfigError(f"{where}: environment variable {m.group(1)} is not set")
            return env[m.group(1)]

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}", env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", env) for i, v in enumerate(value)]
    return value


def parse(data: Any, *, source: str = "<sinks config>", env: dict[str, str] | None = None) -> SinksConfig:
    """Validate a loaded document (``${VAR}`` expanded from ``env``, default the process environment)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    expanded = _expand(data, source, dict(os.environ) if env is None else env)
    try:
        return SinksConfig.model_validate(expanded)
    except ValidationError as exc:
        # pydantic never echoes SecretStr inputs, but other fields could be secret-looking: keep it short
        errors = "; ".join(
            (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "") + e["msg"]
            for e in exc.errors(include_input=False)
        )
        raise ConfigError(f"{source}: {errors}") from None


def load(path: str | os.PathLike[str], *, env: dict[str, str] | None = None) -> Registry:
    """Read and validate a sinks configuration file (YAML, or JSON by ``.json``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the sinks configuration ({exc.strerror})") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError (below) both
        raise ConfigError(f"{p}: not valid JSON: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"{p}: not valid YAML: {type(exc).__name__}") from None
    return Registry(parse(data, source=str(p), env=env))


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, Registry]] = {}


def from_settings(settings: Any) -> Registry:
    """The registry for ``settings.sinks_config`` (reloaded when the file changes; empty when unset)."""
    raw = getattr(settings, "sinks_config", None)
    path = str(raw) if raw else ""
    if not path:
        return Registry()
    try:
        mtime = Path(path).stat().st_mtime
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the sinks configuration ({exc.strerror})") from None
    with _cache_lock:
        hit = _cache.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        registry = load(path)
        if hit is not None:
            hit[1].close()
        _cache[path] = (mtime, registry)
        return registry


def close_cached() -> None:
    """Close the connections the cached registries' sinks hold (the service shutting down). The registries
    stay cached: a sink opens a new connection when it is next used."""
    with _cache_lock:
        for _, registry in _cache.values():
            registry.close()


__all__ = [
    "SINK_CLASSES",
    "ConfigError",
    "DeliveryConfig",
    "Registry",
    "SinkConfig",
    "SinksConfig",
    "TeamConfig",
    "close_cached",
    "from_settings",
    "load",
    "parse",
]
