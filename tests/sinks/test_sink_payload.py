"""The payload every sink receives: its subject, its text in each markup, its evidence attachment."""

from __future__ import annotations

import json

from tests.sinks.sinkkit import HOSTILE, make_payload


def test_subject_carries_the_tag_and_fits_every_tracker() -> None:
    p = make_payload()
    assert p.subject().startswith("[oom-triage:0f1e2d3c4b5a] tensor_leak in ml/llama-70b-sft")
    long = make_payload(title="x" * 1000)
    assert len(long.subject()) <= 240 and long.subject().endswith("…")


def test_markdown_escapes_html_so_a_frame_name_stays_text() -> None:
    body = make_payload().body("markdown")
    assert HOSTILE not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "**Verdict**: tensor\\_leak (owner: algorithm, confidence 93%)" in body
    assert "* Detach the loss" in body
    assert "http://triage.test/tickets/42" in body


def test_slack_escapes_only_what_mrkdwn_needs() -> None:
    body = make_payload(headline="<!channel> & <@U123>").body("slack")
    assert "<!channel>" not in body and "&lt;!channel&gt; &amp; &lt;@U123&gt;" in body
    assert "<http://triage.test/tickets/42|open ticket>" in body


def test_jira_and_textile_escape_their_markup() -> None:
    p = make_payload(headline="a *bold* {code} [link|x]")
    assert "a \\*bold\\* \\{code\\} \\[link\\|x\\]" in p.body("jira")
    assert "[open ticket|http://triage.test/tickets/42]" in p.body("jira")
    assert "a &#42;bold&#42;" in p.body("textile")


def test_update_text_is_a_short_recurrence_note() -> None:
    body = make_payload(action="updated").body("markdown", update=True)
    assert body.startswith("**Recurrence**: 3 incident(s) on 2 rank(s), 1 restart(s)")
    assert "Evidence" not in body
    assert "Fingerprint: oom-triage:0f1e2d3c4b5a" in body


def test_evidence_json_is_the_diagnosis_with_the_ticket() -> None:
    doc = json.loads(make_payload().evidence_json())
    assert doc["ticket"]["fingerprint"] == "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    assert doc["ticket"]["counts"]["ranks"] == 2
    assert doc["diagnosis"]["summary"]["allocated_bytes"] == 123
