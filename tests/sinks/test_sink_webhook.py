"""The generic webhook and the Slack-compatible webhook, against a local HTTP server that records requests."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import SecretStr

from tests.realparts import HttpRecorder, Recorded, free_port, json_reply
from tests.sinks.sinkkit import HOSTILE, make_payload
from triage.tickets.sinks.base import PermanentSinkError, SinkError
from triage.tickets.sinks.slack import SlackConfig, SlackSink
from triage.tickets.sinks.webhook import WebhookConfig, WebhookSink, sign, verify

SECRET = "s3cr3t-for-the-test-only"


def test_webhook_is_signed_and_verifiable(recorder: HttpRecorder) -> None:
    with WebhookSink(
        WebhookConfig(url=f"{recorder.url}/in", secret=SecretStr(SECRET), headers={"X-Env": "t"})
    ) as sink:
        p = make_payload(delivery_id="99")
        ref = sink.create(p)
        assert ref.id == p.ticket_id and ref.url == p.url
        [req] = recorder.requests
        assert req.method == "POST" and req.path == "/in"
        assert req.header("X-Triage-Event") == "ticket.created"
        assert req.header("X-Triage-Delivery") == "99"
        assert req.header("X-Env") == "t"
        assert verify(SECRET, req.headers, req.body)
        assert not verify("another-secret", req.headers, req.body)
        assert not verify(SECRET, req.headers, req.body.replace(b"tensor_leak", b"gpu_quota"))
        old = float(req.header("X-Triage-Timestamp") or 0) + 3600
        assert not verify(SECRET, req.headers, req.body, now=old)  # replayed an hour later
        doc = req.json()
        assert doc["event"] == "ticket.created" and doc["delivery_id"] == "99"
        assert doc["ticket"]["verdict"] == "tensor_leak" and doc["ticket"]["url"] == p.url
        assert HOSTILE in doc["ticket"]["leak_site"]  # JSON carries the text as is; receivers escape

        sink.update(ref, p.model_copy(update={"action": "updated"}))
        upd = recorder.requests[1]
        assert upd.header("X-Triage-Event") == "ticket.updated" and upd.json()["external_id"] == ref.id


def test_signature_format_is_documented() -> None:
    ts = "1700000000"
    body = b'{"a":1}'
    import hashlib
    import hmac

    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", ts, body) == f"sha256={expected}"
    headers = {"x-triage-signature-256": f"sha256={expected}", "x-triage-timestamp": ts}
    assert verify("k", headers, body, now=1700000010)
    assert not verify("k", {"x-triage-timestamp": "soon"}, body)


def test_webhook_keeps_the_receivers_own_id() -> None:
    def handler(req: Recorded) -> tuple[int, dict[str, str], bytes]:
        return json_reply(201, {"id": 1234, "url": "https://tracker.internal/T-1234"})

    with (
        HttpRecorder(handler=handler) as rec,
        WebhookSink(WebhookConfig(url=rec.url, secret=SecretStr(SECRET))) as sink,
    ):
        ref = sink.create(make_payload())
    assert (ref.id, ref.url) == ("1234", "https://tracker.internal/T-1234")


def test_webhook_errors_are_classified() -> None:
    statuses = iter([503, 429, 400])

    def handler(req: Recorded) -> tuple[int, dict[str, str], bytes]:
        status = next(statuses)
        return status, {"Retry-After": "7"} if status == 429 else {}, b"nope"

    with (
        HttpRecorder(handler=handler) as rec,
        WebhookSink(WebhookConfig(url=rec.url, secret=SecretStr(SECRET))) as sink,
    ):
        with pytest.raises(SinkError) as e1:
            sink.create(make_payload())
        assert type(e1.value) is SinkError and e1.value.status == 503
        with pytest.raises(SinkError) as e2:
            sink.create(make_payload())
        assert e2.value.retry_after == 7.0
        with pytest.raises(PermanentSinkError):
            sink.create(make_payload())
    down = WebhookConfig(url=f"http://127.0.0.1:{free_port()}/", secret=SecretStr(SECRET))
    with WebhookSink(down) as sink, pytest.raises(SinkError) as e3:
        sink.create(make_payload())
    assert "ConnectError" in str(e3.value)


def test_slack_message_shape_and_escaping(recorder: HttpRecorder) -> None:
    hook = f"{recorder.url}/services/T000/B000/XXXXSECRET"
    cfg = SlackConfig(webhook_url=SecretStr(hook), channel="#oom", username="oom-triage")
    assert "XXXXSECRET" not in repr(cfg)
    with SlackSink(cfg) as sink:
        p = make_payload(headline="<!channel> please look")
        ref = sink.create(p)
        assert ref.kind == "slack"
        body = recorder.requests[0].json()
        assert recorder.requests[0].path == "/services/T000/B000/XXXXSECRET"
        assert body["channel"] == "#oom" and body["username"] == "oom-triage"
        assert body["text"].startswith(
            "[oom-triage:0f1e2d3c4b5a] tensor_leak in ml/llama-70b-sft: tensor_leak"
        )
        header, section, actions = body["blocks"]
        assert header["type"] == "header" and header["text"]["type"] == "plain_text"
        assert section["text"]["type"] == "mrkdwn"
        text = section["text"]["text"]
        assert "<!channel>" not in text and "&lt;!channel&gt;" in text
        assert HOSTILE not in json.dumps(body["blocks"][1])
        assert actions["elements"][0]["url"] == p.url
        sink.update(ref, p.model_copy(update={"action": "updated"}))
        assert (
            recorder.requests[1].json()["blocks"][1]["text"]["text"].startswith("*Recurrence*: 3 incident(s)")
        )


def test_slack_errors_never_print_the_webhook_url() -> None:
    port = free_port()
    with (
        SlackSink(
            SlackConfig(webhook_url=SecretStr(f"http://127.0.0.1:{port}/services/T/B/XXXXSECRET"))
        ) as sink,
        pytest.raises(SinkError) as err,
    ):
        sink.create(make_payload())
    assert "XXXXSECRET" not in str(err.value) and "127.0.0.1" in str(err.value)


def test_timeouts_are_transient() -> None:
    def slow(req: Recorded) -> tuple[int, dict[str, str], bytes]:
        time.sleep(1.5)
        return 200, {}, b"ok"

    with (
        HttpRecorder(handler=slow) as rec,
        WebhookSink(WebhookConfig(url=rec.url, secret=SecretStr(SECRET), timeout_s=0.3)) as sink,
        pytest.raises(SinkError) as err,
    ):
        sink.create(make_payload())
    assert "timed out" in str(err.value) and type(err.value) is SinkError
