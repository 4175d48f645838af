"""Per-team sink configuration: the file format, ${VAR} secrets, routing, and refusing bad files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from triage.tickets.sinks.alertmanager import AlertmanagerSink
from triage.tickets.sinks.redmine import RedmineSink
from triage.tickets.sinks.registry import ConfigError, Registry, from_settings, load, parse
from triage.tickets.sinks.slack import SlackSink

EXAMPLE = """
default_team: platform
owners:
  platform: platform
teams:
  platform:
    sinks:
      - kind: redmine
        url: http://redmine.internal
        api_key: ${REDMINE_KEY}
        project: gpu-platform
      - kind: alertmanager
        url: http://am:9093
        labels: {severity: warning}
  ml-research:
    sinks:
      - {kind: slack, webhook_url: "https://hooks.example/services/${SLACK_PATH}"}
      - {kind: webhook, name: tracker, url: "http://tracker/in", secret: "${HOOK_SECRET}", enabled: false}
delivery:
  backoff_base_s: 1
"""

ENV = {
    "REDMINE_KEY": "redmine-key-abcdef",
    "SLACK_PATH": "T/B/slack-secret",
    "HOOK_SECRET": "hook-secret-xyz",
}


def test_yaml_file_with_env_secrets(tmp_path: Path) -> None:
    path = tmp_path / "sinks.yaml"
    path.write_text(EXAMPLE)
    reg = load(path, env=ENV)
    try:
        assert [type(s) for s in reg.sinks("platform")] == [RedmineSink, AlertmanagerSink]
        assert [type(s) for s in reg.sinks("ml-research")] == [SlackSink]  # the disabled webhook is left out
        redmine = reg.sink("platform", "redmine")
        assert isinstance(redmine, RedmineSink)
        assert redmine.config.api_key.get_secret_value() == "redmine-key-abcdef"
        text = repr(reg.config) + str(reg.config.model_dump())
        for secret in ENV.values():
            assert secret not in text
        assert reg.delivery.backoff_base_s == 1 and reg.delivery.backoff_max_s == 900
    finally:
        reg.close()


def test_routing_owner_then_team_then_default() -> None:
    reg = Registry(
        parse(
            {
                "default_team": "platform",
                "owners": {"platform": "platform"},
                "teams": {"ml": {}, "platform": {}},
            }
        )
    )
    assert reg.team_for("ml", "platform") == "platform"  # a quota problem is the platform's to fix
    assert reg.team_for("ml", "algorithm") == "ml"  # a leak is the job team's
    assert reg.team_for("unknown-team", "algorithm") == "platform"
    assert reg.team_for(None, None) == "platform"
    assert Registry().team_for("x") == "default" and Registry().sinks("default") == []


def test_json_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "sinks.json"
    path.write_text('{"teams": {"default": {"sinks": [{"kind": "alertmanager", "url": "http://am:9093"}]}}}')
    reg = load(path)
    assert reg.team_for(None) == "default" and len(reg.sinks("default")) == 1
    reg.close()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"teams": {"t": {"sinks": [{"kind": "pagerduty"}]}}}, "teams.t.sinks.0"),
        (
            {"teams": {"t": {"sinks": [{"kind": "redmine", "url": "u", "project": "p"}]}}},
            "api_key: Field required",
        ),
        (
            {
                "teams": {
                    "t": {
                        "sinks": [{"kind": "alertmanager", "url": "u"}, {"kind": "alertmanager", "url": "v"}]
                    }
                }
            },
            "repeated: alertmanager",
        ),
        (
            {"teams": {"t": {"sinks": [{"kind": "alertmanager", "url": "u", "colour": "red"}]}}},
            "colour: Extra inputs",
        ),
        (
            {"teams": {"t": {"sinks": [{"kind": "alertmanager", "url": "u", "timeout_s": 200}]}}},
            "under a third of delivery.lease_s",
        ),
        (
            {"teams": {"t": {"sinks": [{"kind": "webhook", "url": "u", "secret": "${NOPE}"}]}}},
            "NOPE is not set",
        ),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_configuration_is_refused_with_the_place(doc: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(doc, env={})
    assert message in str(err.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    badj = tmp_path / "bad.json"
    badj.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load(badj)


def test_from_settings_reloads_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "sinks.yaml"
    path.write_text("default_team: a\n")
    settings = SimpleNamespace(sinks_config=str(path))
    first = from_settings(settings)
    assert from_settings(settings) is first and first.team_for(None) == "a"
    path.write_text("default_team: bb\n")
    import os

    os.utime(path, (1, 1))
    second = from_settings(settings)
    assert second is not first and second.team_for(None) == "bb"
    assert from_settings(SimpleNamespace(sinks_config=None)).sinks("default") == []


def test_the_service_shutting_down_closes_the_cached_sinks_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker pool's stop closes what the cached registries' sinks hold open (their HTTP connections
    to Redmine, Alertmanager, …); a sink used again afterwards opens a new one."""
    from triage.tickets.sinks import registry as registry_module
    from triage.worker import WorkerPool

    path = tmp_path / "sinks.yaml"
    path.write_text(
        "default_team: a\nteams:\n  a:\n    sinks:\n"
        "      - {kind: alertmanager, name: am, url: 'http://127.0.0.1:9/'}\n"
    )
    reg = from_settings(SimpleNamespace(sinks_config=str(path)))
    sink = reg.sinks("a")[0]
    first = sink.client
    assert not first.is_closed
    WorkerPool(SimpleNamespace(), SimpleNamespace()).stop()  # type: ignore[arg-type]  # no threads started
    assert first.is_closed and sink.client is not first and not sink.client.is_closed
    registry_module.close_cached()
    monkeypatch.setattr(registry_module, "_cache", {})
