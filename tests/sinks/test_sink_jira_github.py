"""The Jira and GitHub Issues sinks.

No Jira or GitHub can run on the test machines, so these tests serve the documented REST shapes from a
local HTTP server: it checks every request against the documented request shape (paths, headers,
auth, bodies; ADF documents for Jira v3; the multipart upload for Jira attachments) and answers with the
documented response shapes (Jira: developer.atlassian.com/cloud/jira/platform/rest/v2 and v3, "Create
issue", "Add attachment", "Add comment"; GitHub: docs.github.com/rest/issues, API version 2022-11-28).
A request that deviates is answered 400 with the reason, which fails the test.
"""

from __future__ import annotations

import base64
import json
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from tests.realparts import HttpRecorder, Recorded, Reply, json_reply
from tests.sinks.sinkkit import HOSTILE, make_payload
from triage.tickets.sinks.base import PermanentSinkError, RefGone
from triage.tickets.sinks.github import GitHubConfig, GitHubSink
from triage.tickets.sinks.jira import JiraConfig, JiraSink, adf

TOKEN = "tok-for-tests-only"

# -- Jira ---------------------------------------------------------------------------------------------

ADF_BLOCKS = {"paragraph", "bulletList"}


def adf_errors(node: Any, path: str = "doc") -> list[str]:
    """The subset of the ADF schema the sink uses: doc > (paragraph | bulletList > listItem > paragraph) > text."""
    errs: list[str] = []
    if not isinstance(node, dict) or "type" not in node:
        return [f"{path}: not a node"]
    t = node["type"]
    if path == "doc":
        if t != "doc" or node.get("version") != 1 or not isinstance(node.get("content"), list):
            return ["doc: needs type=doc, version=1, content=[]"]
        for i, child in enumerate(node["content"]):
            if child.get("type") not in ADF_BLOCKS:
                errs.append(f"doc.content[{i}]: {child.get('type')} is not a block node")
            errs += adf_errors(child, f"doc.content[{i}]")
        return errs
    if t == "text":
        if not isinstance(node.get("text"), str) or not node["text"]:
            errs.append(f"{path}: text nodes need non-empty text")
        for m in node.get("marks", []):
            if m.get("type") != "link" or not m.get("attrs", {}).get("href"):
                errs.append(f"{path}: unsupported mark {m}")
        return errs
    expected_children = {"paragraph": {"text"}, "bulletList": {"listItem"}, "listItem": {"paragraph"}}
    if t not in expected_children:
        return [f"{path}: unknown node type {t}"]
    content = node.get("content")
    if not isinstance(content, list) or (t != "paragraph" and not content):
        return [f"{path}: {t} needs content"]
    for i, child in enumerate(content):
        if child.get("type") not in expected_children[t]:
            errs.append(f"{path}.content[{i}]: {child.get('type')} not allowed in {t}")
        errs += adf_errors(child, f"{path}.content[{i}]")
    return errs


class FakeJira:
    def __init__(self, version: int, *, basic: bool) -> None:
        self.version = version
        self.basic = basic
        self.issues: dict[str, dict[str, Any]] = {}
        self.attachments: dict[str, list[tuple[str, bytes]]] = {}
        self.comments: dict[str, list[Any]] = {}

    def _auth_ok(self, req: Recorded) -> bool:
        auth = req.header("Authorization") or ""
        if self.basic:
            return auth == "Basic " + base64.b64encode(f"bot@example.com:{TOKEN}".encode()).decode()
        return auth == f"Bearer {TOKEN}"

    def _text_ok(self, value: Any) -> str | None:
        if self.version == 2:
            return None if isinstance(value, str) else "v2 takes wiki-markup strings"
        errs = adf_errors(value)
        return "; ".join(errs) if errs else None

    def __call__(self, req: Recorded) -> Reply:
        if not self._auth_ok(req):
            return json_reply(401, {"errorMessages": ["You are not authenticated."], "errors": {}})
        api = f"/rest/api/{self.version}"
        if req.method == "POST" and req.path == f"{api}/issue":
            fields = req.json().get("fields", {})
            problems = []
            if fields.get("project") != {"key": "OOM"}:
                problems.append("project must be {key}")
            if fields.get("issuetype") != {"name": "Bug"}:
                problems.append("issuetype must be {name}")
            if (
                not isinstance(fields.get("summary"), str)
                or "\n" in fields["summary"]
                or len(fields["summary"]) > 255
            ):
                problems.append("summary: one line, at most 255")
            if not all(isinstance(x, str) and " " not in x for x in fields.get("labels", [])):
                problems.append("labels: strings without spaces")
            if (why := self._text_ok(fields.get("description"))) is not None:
                problems.append(f"description: {why}")
            if problems:
                return json_reply(400, {"errorMessages": [], "errors": {"fields": "; ".join(problems)}})
            n = len(self.issues) + 1
            key = f"OOM-{n}"
            self.issues[key] = fields
            return json_reply(
                201, {"id": str(10000 + n), "key": key, "self": f"http://jira{api}/issue/{10000 + n}"}
            )
        parts = req.path.split("/")
        if req.method == "POST" and len(parts) == 7 and parts[4] == "issue":
            key, what = parts[5], parts[6]
            if key not in self.issues:
                return json_reply(
                    404,
                    {
                        "errorMessages": ["Issue does not exist or you do not have permission to see it."],
                        "errors": {},
                    },
                )
            if what == "attachments":
                if req.header("X-Atlassian-Token") != "no-check":
                    return json_reply(403, {"errorMessages": ["XSRF check failed"], "errors": {}})
                ctype = req.header("Content-Type") or ""
                msg = BytesParser(policy=HTTP).parsebytes(
                    f"Content-Type: {ctype}\r\n\r\n".encode() + req.body
                )
                files = [
                    (p.get_filename(), p.get_payload(decode=True))
                    for p in msg.iter_parts()
                    if p.get_param("name", header="content-disposition") == "file"
                ]
                if not files:
                    return json_reply(
                        400, {"errorMessages": ["multipart field 'file' missing"], "errors": {}}
                    )
                self.attachments.setdefault(key, []).extend(files)
                return json_reply(
                    200,
                    [
                        {"id": "1", "filename": f, "size": len(b), "mimeType": "application/json"}
                        for f, b in files
                    ],
                )
            if what == "comment":
                body = req.json().get("body")
                if (why := self._text_ok(body)) is not None:
                    return json_reply(400, {"errorMessages": [], "errors": {"body": why}})
                self.comments.setdefault(key, []).append(body)
                return json_reply(
                    201, {"id": "10000", "body": body, "self": f"http://jira{api}/issue/{key}/comment/10000"}
                )
        return json_reply(404, {"errorMessages": [f"no route {req.method} {req.path}"], "errors": {}})


@pytest.mark.parametrize(("version", "basic"), [(2, True), (3, True), (2, False)])
def test_jira_create_attach_comment(version: int, basic: bool) -> None:
    fake = FakeJira(version, basic=basic)
    with HttpRecorder(handler=fake) as rec:
        cfg = JiraConfig(
            url=rec.url,
            api_version=version,  # type: ignore[arg-type]
            project_key="OOM",
            user="bot@example.com" if basic else None,
            token=SecretStr(TOKEN),
        )
        with JiraSink(cfg) as sink:
            p = make_payload()
            ref = sink.create(p)
            assert (ref.id, ref.url) == ("OOM-1", f"{rec.url}/browse/OOM-1")
            fields = fake.issues["OOM-1"]
            assert fields["summary"] == p.subject()
            assert fields["labels"] == ["oom-triage", "oom-triage-0f1e2d3c4b5a"]
            text = json.dumps(fields["description"])
            assert "llama-70b-sft" in text and p.url in text
            [(name, content)] = fake.attachments["OOM-1"]
            assert name == "evidence.json" and json.loads(content)["ticket"]["fingerprint"] == p.fingerprint
            sink.update(ref, p.model_copy(update={"action": "updated"}))
            assert len(fake.comments["OOM-1"]) == 1
            assert "Recurrence" in json.dumps(fake.comments["OOM-1"][0])
            with pytest.raises(RefGone):
                sink.update(sink.ref("OOM-99"), p)


def test_jira_v2_text_escapes_wiki_markup_and_v3_is_valid_adf() -> None:
    p = make_payload(headline="see {code} and [link|http://x]")
    v2 = p.body("jira")
    assert "\\{code\\}" in v2 and "\\[link\\|http://x\\]" in v2
    doc = adf(p.body("plain"))
    assert adf_errors(doc) == []
    assert HOSTILE in json.dumps(doc)  # ADF is structured data: Jira renders text nodes as text
    links = [m["attrs"]["href"] for n in _walk(doc) for m in n.get("marks", [])]
    assert p.url in links


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("content", []):
        out += _walk(child)
    return out


def test_jira_wrong_token_is_permanent() -> None:
    with (
        HttpRecorder(handler=FakeJira(2, basic=False)) as rec,
        JiraSink(JiraConfig(url=rec.url, project_key="OOM", token=SecretStr("wrong"))) as sink,
        pytest.raises(PermanentSinkError) as err,
    ):
        sink.create(make_payload())
    assert err.value.status == 401


# -- GitHub -------------------------------------------------------------------------------------------


class FakeGitHub:
    def __init__(self) -> None:
        self.issues: dict[int, dict[str, Any]] = {}
        self.comments: dict[int, list[str]] = {}

    def __call__(self, req: Recorded) -> Reply:
        if req.header("Authorization") != f"Bearer {TOKEN}":
            return json_reply(
                401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}
            )
        if (
            req.header("Accept") != "application/vnd.github+json"
            or req.header("X-GitHub-Api-Version") != "2022-11-28"
        ):
            return json_reply(400, {"message": "missing Accept or X-GitHub-Api-Version"})
        base = "/api/v3/repos/acme/trainer/issues"
        if req.method == "POST" and req.path == base:
            doc = req.json()
            if not isinstance(doc.get("title"), str) or not isinstance(doc.get("body"), str):
                return json_reply(422, {"message": "Validation Failed", "errors": [{"field": "title"}]})
            if not all(isinstance(x, str) for x in doc.get("labels", [])):
                return json_reply(422, {"message": "Validation Failed", "errors": [{"field": "labels"}]})
            n = len(self.issues) + 17
            self.issues[n] = doc | {"state": "open"}
            return json_reply(
                201,
                {
                    "id": 1000 + n,
                    "node_id": "I_x",
                    "number": n,
                    "html_url": f"https://github.example/acme/trainer/issues/{n}",
                    "url": f"http://api{base}/{n}",
                    "title": doc["title"],
                    "state": "open",
                },
            )
        parts = req.path.removeprefix(base + "/").split("/")
        if parts[0].isdigit():
            n = int(parts[0])
            if n not in self.issues:
                return json_reply(
                    404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
                )
            if req.method == "POST" and parts[1:] == ["comments"]:
                self.comments.setdefault(n, []).append(req.json()["body"])
                return json_reply(
                    201, {"id": 1, "body": req.json()["body"], "html_url": "https://github.example/c/1"}
                )
            if req.method == "PATCH" and parts[1:] == []:
                doc = req.json()
                if doc.get("state") not in ("open", "closed") or doc.get("state_reason") not in (
                    None,
                    "completed",
                    "not_planned",
                    "reopened",
                ):
                    return json_reply(422, {"message": "Validation Failed"})
                self.issues[n].update(doc)
                return json_reply(200, {"number": n, "state": doc["state"]})
        return json_reply(404, {"message": "Not Found"})


def test_github_create_comment_close() -> None:
    fake = FakeGitHub()
    with HttpRecorder(handler=fake) as rec:
        cfg = GitHubConfig(
            api_url=f"{rec.url}/api/v3",
            repository="acme/trainer",
            token=SecretStr(TOKEN),
            assignees=["alice"],
        )
        with GitHubSink(cfg) as sink:
            p = make_payload()
            ref = sink.create(p)
            assert (ref.id, ref.url) == ("17", "https://github.example/acme/trainer/issues/17")
            issue = fake.issues[17]
            assert (
                issue["title"] == p.subject()
                and issue["labels"] == ["oom-triage"]
                and issue["assignees"] == ["alice"]
            )
            assert HOSTILE not in issue["body"] and "&lt;script&gt;" in issue["body"]
            sink.update(ref, p.model_copy(update={"action": "updated"}))
            assert fake.comments[17][0].startswith("**Recurrence**")
            assert fake.issues[17]["state"] == "open"
            sink.update(ref, p.model_copy(update={"action": "resolved", "status": "resolved"}))
            assert fake.issues[17]["state"] == "closed" and fake.issues[17]["state_reason"] == "completed"
            with pytest.raises(RefGone):
                sink.update(sink.ref("99"), p)
        with (
            GitHubSink(cfg.model_copy(update={"token": SecretStr("nope")})) as bad,
            pytest.raises(PermanentSinkError),
        ):
            bad.create(p)


def test_github_repository_must_be_owner_slash_name() -> None:
    with pytest.raises(ValidationError):
        GitHubConfig(repository="trainer", token=SecretStr(TOKEN))
