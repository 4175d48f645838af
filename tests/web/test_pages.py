"""The pages over HTTP (the app's TestClient): list and filters, the ticket page's sections, escaping,
security headers, downloads (bundle JSON; the snapshot pickle equal to torch's own), access control."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

from tests.pagekit import HOSTILE, App, Seeded, bundle
from triage.simulate.scenarios import run_scenario


def test_root_redirects_to_the_list(seeded: Seeded) -> None:
    r = seeded.app.client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/tickets"


def test_list_and_filters(seeded: Seeded) -> None:
    c = seeded.app.client
    page = c.get("/tickets")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert len(re.findall(r'<tr data-ticket="\d+">', page.text)) == 3
    assert "3 tickets" in page.text
    only = c.get("/tickets", params={"verdict": "tensor_leak"})
    assert re.findall(r'<tr data-ticket="(\d+)">', only.text) == [str(seeded.leak["id"])]
    assert '<option value="tensor_leak" selected>' in only.text
    vision = c.get("/tickets", params={"namespace": "vision", "owner": "platform"})
    assert len(re.findall(r'<tr data-ticket="\d+">', vision.text)) == 2
    none = c.get("/tickets", params={"team": "nobody"})
    assert "No tickets match these filters." in none.text
    # an unknown choice is ignored rather than failing the page
    assert c.get("/tickets", params={"verdict": "<bogus>"}).status_code == 200


def test_ticket_page_shows_everything_on_call_needs(seeded: Seeded) -> None:
    t = seeded.leak
    r = seeded.app.client.get(f"/tickets/{t['id']}")
    assert r.status_code == 200
    html = r.text
    for section in (
        "evidence",
        "actions",
        "timeline",
        "sites",
        "facts",
        "message",
        "ranks",
        "downloads",
        "links",
    ):
        assert f'id="{section}"' in html, section
    assert '<span class="verdict" id="verdict">tensor_leak</span>' in html
    assert "owner: algorithm" in html
    assert re.search(r'id="confidence">confidence \d+%', html)
    assert f'href="http://triage.test/tickets/{t["id"]}"' in html  # the permalink
    assert html.count('<svg class="chart"') == 2  # per step and over the trace
    assert (
        'data-marker="oom"' in html and 'data-series="allocated"' in html and 'data-series="reserved"' in html
    )
    assert '<details class="site"' in html and 'class="frame user"' in html
    assert "NVIDIA" in html and "speech" not in html.split('id="pod-facts"')[1].split("</table>")[0]
    assert len(re.findall(r"<tr>\s*<td class=\"num\">\d</td>", html)) == 4  # four ranks
    assert "/snapshot.pickle" in html and "/bundle.json" in html


def test_hostile_names_render_as_text(seeded: Seeded) -> None:
    html = seeded.app.client.get(f"/tickets/{seeded.leak['id']}").text
    assert HOSTILE not in html  # never as markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # always as text
    assert "<script" not in html.lower()
    assert "/workspace/src/&lt;script&gt;alert(1)&lt;/script&gt;.py" in html


def test_security_headers(seeded: Seeded) -> None:
    r = seeded.app.client.get(f"/tickets/{seeded.leak['id']}")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp  # no script may run at all
    assert r.headers["x-content-type-options"] == "nosniff"
    assert seeded.app.client.get("/static/triage.css").status_code == 200


def test_missing_things_are_404_pages(seeded: Seeded) -> None:
    c = seeded.app.client
    for path in ("/tickets/999999", "/tickets/abc", "/tickets/99999999999999999999", "/incidents/not-a-uuid"):
        r = c.get(path)
        assert r.status_code == 404 and "Not found" in r.text, path
    r = c.get("/incidents/00000000-0000-0000-0000-000000000000/bundle.json")
    assert r.status_code == 404


def test_incident_link_leads_to_its_ticket(seeded: Seeded) -> None:
    incident_id = next(i for i, b in seeded.bundles.items() if b["workload"]["job"] == "evil-job")
    r = seeded.app.client.get(f"/incidents/{incident_id}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/tickets/{seeded.leak['id']}"


def test_bundle_download_is_what_was_posted(seeded: Seeded) -> None:
    incident_id, posted = next(iter(seeded.bundles.items()))
    r = seeded.app.client.get(f"/incidents/{incident_id}/bundle.json")
    assert r.status_code == 200
    assert r.headers["content-disposition"] == f'attachment; filename="incident-{incident_id}.json"'
    assert json.loads(r.content) == posted


def test_snapshot_download_is_torchs_own_snapshot(seeded: Seeded) -> None:
    """The pickle is the allocator's snapshot as torch writes it (tuples restored), so memory_viz opens it."""
    incident_id = next(i for i, b in seeded.bundles.items() if b["workload"]["job"] == "vit-dpo")
    r = seeded.app.client.get(f"/incidents/{incident_id}/snapshot.pickle")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    data = pickle.loads(r.content)  # plain builtins only: it came from our own server
    original = run_scenario("other_process", 1).snapshot
    assert data == original
    assert isinstance(data["segments"][0]["segment_pool_id"], tuple)
    # torch's own reader of these files accepts it
    torch_viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "Summary of segments" in torch_viz.segsum(data)


def test_snapshot_download_without_a_snapshot_is_404(seeded: Seeded) -> None:
    incident_id = next(i for i, b in seeded.bundles.items() if b["workload"]["job"] == "dino-sft")
    r = seeded.app.client.get(f"/incidents/{incident_id}/snapshot.pickle")
    assert r.status_code == 404 and "no allocator snapshot" in r.text


def test_pages_need_read_access(tmp_path: Path) -> None:
    app = App(tmp_path / "locked", read_token="read-token-for-tests-0123456789")
    try:
        posted = app.post(bundle("shm_exhausted", 0))
        app.drain()
        for path in ("/", "/tickets", "/tickets/1", f"/incidents/{posted['incident_id']}/bundle.json"):
            assert app.client.get(path).status_code == 401, path
        ok = app.client.get("/tickets/1", headers={"Authorization": "Bearer read-token-for-tests-0123456789"})
        assert ok.status_code == 200
    finally:
        app.close()


def test_an_incident_not_yet_analysed_shows_its_status(tmp_path: Path) -> None:
    app = App(tmp_path / "queued")
    try:
        posted = app.post(bundle("shm_exhausted", 0))
        r = app.client.get(f"/incidents/{posted['incident_id']}", follow_redirects=False)
        assert r.status_code == 200 and "has not finished yet" in r.text and "queued" in r.text
        app.drain()
        r = app.client.get(f"/incidents/{posted['incident_id']}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/tickets/")
    finally:
        app.close()


def test_scale_up_requests_are_listed_with_their_decision(seeded: Seeded) -> None:
    c = seeded.app.client
    empty = c.get("/scale-up-requests")
    assert empty.status_code == 200 and "No scale-up requests yet" in empty.text
    report = {"gpus": 4, "mfu": 0.42, "gpu_utilization": 0.7, "step_time_s": 1.5, "requested_gpus": 64}
    assert (
        c.post("/api/v1/scale-up-requests", json={**report, "namespace": "ml", "job": "llama"}).status_code
        == 201
    )
    low = {**report, "mfu": 0.30, "job": "<script>alert(1)</script>"}
    assert c.post("/api/v1/scale-up-requests", json=low).status_code == 201
    page = c.get("/scale-up-requests")
    assert page.status_code == 200
    rows = re.findall(r'<tr class="(approved|denied)">', page.text)
    assert rows == ["denied", "approved"]  # newest first
    assert "42.0%" in page.text and "30.0%" in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>" not in page.text
    assert 'href="/scale-up-requests"' in c.get("/tickets").text
