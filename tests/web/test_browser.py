"""The pages in a real headless Chromium (Debian chromium, driven by Playwright) against a real uvicorn
server: open the list, filter, open a ticket, expand a stack, see the chart. A frame and file name of
``<script>alert(1)</script>`` shows as text and no dialog ever opens. The screenshot is saved under
``artifacts/`` (gitignored) and its path printed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pagekit import HOSTILE, SCREENSHOTS, Seeded, UvicornThread
from tests.realparts import CHROMIUM, CHROMIUM_ARGS, require

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(seeded: Seeded) -> Iterator[UvicornThread]:
    with UvicornThread(seeded.app.app) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(Path(CHROMIUM).exists(), "Chromium", "chromium")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (never `playwright install`)"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def test_list_filter_open_expand_chart(server: UvicornThread, browser: Any, seeded: Seeded) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(f"{server.url}/", wait_until="load")
        assert page.url == f"{server.url}/tickets"
        assert page.locator("#tickets tbody tr").count() == 3

        page.select_option("#filter-verdict", "tensor_leak")
        page.click("#apply-filters")
        page.wait_for_url("**/tickets?*verdict=tensor_leak*")
        rows = page.locator("#tickets tbody tr")
        assert rows.count() == 1

        rows.first.locator("a").click()
        page.wait_for_url(f"**/tickets/{seeded.leak['id']}")
        assert page.locator("#verdict").inner_text() == "tensor_leak"
        assert HOSTILE in page.locator("#leak-site").inner_text()  # shown literally, as text

        first_site = page.locator("details.site").first
        frames = first_site.locator("li.frame")
        assert not frames.first.is_visible()
        first_site.locator("summary").click()
        assert frames.first.is_visible()
        stack_text = first_site.inner_text()
        assert HOSTILE in stack_text and f"/workspace/src/{HOSTILE}.py" in stack_text

        chart = page.locator("svg.chart").first
        chart.scroll_into_view_if_needed()
        assert chart.is_visible()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 150
        assert page.locator("svg.chart polyline[data-series='allocated']").count() >= 1
        assert page.locator("svg.chart [data-marker='oom']").count() >= 1
        assert HOSTILE in page.locator("#raw-message").inner_text()

        # nothing from the bundle became markup: no script element, no dialog, nothing blocked by the CSP
        assert page.evaluate("document.querySelectorAll('script').length") == 0
        assert dialogs == []
        assert not [e for e in console_errors if "Content Security Policy" in e], console_errors

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "ticket-page.png"
        first_site.scroll_into_view_if_needed()
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        SCREENSHOTS.append(shot)
        print(f"\nscreenshot: {shot}")
    finally:
        context.close()
