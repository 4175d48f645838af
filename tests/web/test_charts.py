"""The server-side SVG chart and the page views on odd data: escaping, limits, markers, downsampling."""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

from sqlalchemy import update

from tests.pagekit import HOSTILE, App, bundle
from triage.store.models import Incident
from triage.web.charts import Chart, Limit, Marker, Series, downsample, render
from triage.web.views import safe_url


def test_chart_is_well_formed_svg_with_escaped_labels() -> None:
    chart = Chart(
        title=f"Device {HOSTILE}",
        x_label="step",
        series=[
            Series("allocated", [(0, 1 << 30), (1, 2 << 30), (2, 3 << 30)], HOSTILE),
            Series("reserved", []),
        ],
        markers=[Marker(2, f"OOM {HOSTILE}")],
        limits=[Limit(4 << 30, "device")],
    )
    svg = str(render(chart))
    assert HOSTILE not in svg and "&lt;script&gt;" in svg
    root = ElementTree.fromstring(svg)  # well-formed XML
    assert root.tag.endswith("svg")
    assert 'data-series="allocated"' in svg and 'data-marker="oom"' in svg and "device 4.0 GiB" in svg
    assert "reserved" not in re.findall(r'data-series="(\w+)"', svg)


def test_empty_and_single_point_charts() -> None:
    assert str(render(Chart(title="t", x_label="x", series=[Series("allocated", [])]))) == ""
    one = str(render(Chart(title="t", x_label="x", series=[Series("allocated", [(5, 100)])])))
    assert "<circle" in one


def test_downsample_keeps_peaks() -> None:
    pts = [(float(i), float(i % 97)) for i in range(100_000)]
    out = downsample(pts, 500)
    assert len(out) == 500 and max(p[1] for p in out) == 96


def test_only_http_links_are_links() -> None:
    assert safe_url("https://redmine.internal/issues/1") == "https://redmine.internal/issues/1"
    for bad in ("javascript:alert(1)", "data:text/html,x", "//evil", "", None, 42):
        assert safe_url(bad) is None


def test_a_ticket_whose_bundle_expired_still_renders(tmp_path: Path) -> None:
    app = App(tmp_path / "svc")
    try:
        posted = app.post(bundle(job="expired-job"))
        app.drain()
        with app.db.session() as s:
            s.execute(update(Incident).values(blob_path=None))
            s.commit()
        ticket_id = app.client.get("/api/v1/tickets").json()["items"][0]["id"]
        page = app.client.get(f"/tickets/{ticket_id}")
        assert page.status_code == 200
        assert "no longer stored" in page.text and 'id="evidence"' in page.text
        assert page.text.count('<svg class="chart"') == 1  # the trace timeline lives in the diagnosis
        assert app.client.get(f"/incidents/{posted['incident_id']}/bundle.json").status_code == 410
        assert app.client.get(f"/incidents/{posted['incident_id']}/snapshot.pickle").status_code == 410
    finally:
        app.close()
