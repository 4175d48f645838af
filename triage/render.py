"""Rendering a Diagnosis for people: the terminal (rich) and a standalone HTML page (no CDN, escaped)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from triage.units import human

if TYPE_CHECKING:
    from rich.console import Console

    from triage.diagnosis import Diagnosis
    from triage.evidence import Evidence

_BARS = " ▁▂▃▄▅▆▇█"


def spark_rows(values: list[int], width: int = 64, height: int = 6) -> list[str]:
    """A small block chart of ``values`` (resampled to ``width`` columns, max per column)."""
    if not values:
        return []
    cols: list[int] = []
    n = len(values)
    for c in range(min(width, n)):
        lo = c * n // min(width, n)
        hi = max(lo + 1, (c + 1) * n // min(width, n))
        cols.append(max(values[lo:hi]))
    lo_v = min(cols)
    span = (max(cols) - lo_v) or 1
    rows = []
    for r in range(height - 1, -1, -1):
        line = []
        for v in cols:
            level = (v - lo_v) / span * (height - 1) + 0.5 - r
            line.append(_BARS[max(0, min(8, round(level * 8)))] if level > 0 else " ")
        rows.append("".join(line))
    return rows


def max_batch_text(d: Diagnosis) -> str:
    """The largest batch that fits, said as what it is: an estimate, or only a ceiling when the failing
    step died before its peak."""
    if d.max_batch_size is None:
        return "unknown"
    mb = d.details.get("max_batch_size") if isinstance(d.details, dict) else None
    if isinstance(mb, dict) and mb.get("bound") == "upper":
        return f"at most {d.max_batch_size} (the failing step died before its peak: likely fewer)"
    return str(d.max_batch_size)


def render_terminal(d: Diagnosis, ev: Evidence, console: Console, *, top: int = 8) -> None:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    colour = {"algorithm": "yellow", "platform": "cyan"}.get(d.owner or "", "white")
    title = Text(f"{d.verdict}", style=f"bold {colour}")
    if d.owner:
        title.append(f"  owner: {d.owner}  confidence: {d.confidence:.0%}", style="dim")
    body = Text(d.headline)
    if d.candidates and d.verdict == "inconclusive":
        body.append("\ncandidates: " + ", ".join(d.candidates), style="bold")
    if d.leak_site:
        s = d.leak_site
        body.append(f"\nleak site: {s['filename']}:{s['line']} in {s['name']}", style="bold red")
    if d.max_batch_size is not None:
        body.append(f"\nmax batch size: {max_batch_text(d)}", style="bold")
    console.print(Panel(body, title=title, expand=False))

    s = d.summary
    t = Table(title="Memory accounting (all devices)", show_header=False, box=None)
    for key in (
        "reserved_bytes",
        "allocated_bytes",
        "requested_bytes",
        "active_bytes",
        "free_in_reserved_bytes",
        "largest_free_block_bytes",
    ):
        t.add_row(key.replace("_bytes", "").replace("_", " "), human(s.get(key, 0)), f"{s.get(key, 0):,} B")
    t.add_row(
        "segments / blocks / trace entries",
        f"{s.get('segments', 0)} / {s.get('blocks', 0)} / {s.get('trace_entries', 0)}",
        "",
    )
    console.print(t)

    if d.evidence:
        et = Table(title="Evidence", show_lines=False)
        et.add_column("rule", style="dim")
        et.add_column("fact")
        for item in d.evidence:
            et.add_row(item.rule, item.fact)
        console.print(et)
    if d.actions:
        console.print(Text("Actions", style="bold"))
        for a in d.actions:
            console.print(f"  • {a}", markup=False)
    if d.missing:
        console.print(Text("Missing evidence that would decide", style="bold"))
        for m in d.missing:
            console.print(f"  • {m}", markup=False)

    if ev.sites:
        st = Table(title=f"Top live allocation sites ({len(ev.sites)} sites)")
        st.add_column("site")
        st.add_column("bytes", justify="right")
        st.add_column("blocks", justify="right")
        st.add_column("trace idx first..last", justify="right")
        st.add_column("stack (innermost first)")
        for site in ev.sites[:top]:
            span = f"{site.first_index}..{site.last_index}" if site.first_index is not None else "-"
            stack = ev.classifier.user_stack(site.stack, limit=4)
            stack_txt = "\n".join(
                f"{'*' if fr['user'] else ' '} {str(fr['filename']).rsplit('/', 1)[-1]}:{fr['line']} {fr['name']}"
                for fr in stack
            )
            st.add_row(site.site.label, human(site.bytes), str(site.count), span, stack_txt or "-")
        console.print(st)

    for tl in ev.timelines:
        if tl.entries < 2:
            continue
        vals = [p.allocated for p in tl.points]
        console.print(
            Text(
                f"Device {tl.device}: allocated over {tl.entries} trace entries "
                f"(peak {human(tl.peak_allocated)}, reserved peak {human(tl.peak_reserved)})",
                style="bold",
            )
        )
        rows = spark_rows(vals)
        for i, row in enumerate(rows):
            label = human(max(vals)) if i == 0 else human(min(vals)) if i == len(rows) - 1 else ""
            console.print(f"  {label:>10} │{row}", markup=False, highlight=False)
        if tl.oom is not None:
            console.print(
                f"  OOM at entry {tl.oom.index}: request {human(tl.oom.size)}, device free {human(tl.oom.device_free or 0)}",
                markup=False,
            )
        if not tl.consistency.ok:
            console.print(f"  trace/segments mismatch: {tl.consistency.to_dict()}", markup=False)


def _svg_timeline(points: list[list[Any]], oom_index: int | None, width: int = 720, height: int = 200) -> str:
    if not points:
        return ""
    xs = [p[0] for p in points]
    top = max(max(p[2] for p in points), max(p[3] for p in points), 1)
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)

    def sx(x: int) -> float:
        return 40 + (x - x0) / (x1 - x0) * (width - 50)

    def sy(y: int) -> float:
        return height - 20 - y / top * (height - 30)

    alloc = " ".join(f"{sx(p[0]):.1f},{sy(p[2]):.1f}" for p in points)
    res = " ".join(f"{sx(p[0]):.1f},{sy(p[3]):.1f}" for p in points)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="memory timeline">',
        f'<text x="2" y="14" font-size="11">{html.escape(human(top))}</text>',
        f'<polyline fill="none" stroke="#888" stroke-width="1.5" points="{res}"><title>reserved</title></polyline>',
        f'<polyline fill="none" stroke="#c33" stroke-width="1.5" points="{alloc}"><title>allocated</title></polyline>',
    ]
    if oom_index is not None:
        parts.append(
            f'<line x1="{sx(oom_index):.1f}" x2="{sx(oom_index):.1f}" y1="10" y2="{height - 20}" stroke="black" stroke-dasharray="4"/>'
            f'<text x="{sx(oom_index) - 30:.1f}" y="{height - 5}" font-size="11">OOM</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_html(d: Diagnosis, ev: Evidence, title: str) -> str:
    e = html.escape
    rows = "".join(f"<tr><td>{e(i.rule)}</td><td>{e(i.fact)}</td></tr>" for i in d.evidence)
    actions = "".join(f"<li>{e(a)}</li>" for a in d.actions)
    summary = "".join(
        f"<tr><td>{e(k)}</td><td>{e(human(v) if k.endswith('bytes') else str(v))}</td></tr>"
        for k, v in d.summary.items()
    )
    sites = []
    for s in ev.sites[:15]:
        stack = "".join(
            f'<li class="{"user" if fr["user"] else "lib"}">{e(str(fr["filename"]))}:{e(str(fr["line"]))} in {e(str(fr["name"]))}</li>'
            for fr in ev.classifier.user_stack(s.stack, limit=30)
        )
        sites.append(
            f"<details><summary>{e(s.site.label)} — {e(human(s.bytes))} in {s.count} blocks</summary><ol>{stack}</ol></details>"
        )
    charts = "".join(
        f"<h3>Device {tl.device}</h3>"
        + _svg_timeline(
            [[p.index, p.time_us, p.allocated, p.reserved] for p in tl.points],
            tl.oom.index if tl.oom else None,
        )
        for tl in ev.timelines
        if tl.entries > 1
    )
    leak = ""
    if d.leak_site:
        ls = d.leak_site
        leak = (
            f"<p><b>Leak site:</b> {e(str(ls['filename']))}:{e(str(ls['line']))} in {e(str(ls['name']))}</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}td{{padding:2px 8px;vertical-align:top}}
.user{{font-weight:bold}}.lib{{color:#777}}.verdict{{font-size:1.4em}}</style></head>
<body><h1>{e(title)}</h1>
<p class="verdict"><b>{e(d.verdict)}</b> — owner {e(str(d.owner))}, confidence {d.confidence:.0%}</p>
<p>{e(d.headline)}</p>{leak}
<p>Candidates: {e(", ".join(d.candidates) or "none")}; max batch size: {e(max_batch_text(d))}</p>
<h2>Evidence</h2><table>{rows}</table>
<h2>Actions</h2><ul>{actions}</ul>
<h2>Accounting</h2><table>{summary}</table>
<h2>Memory timeline</h2>{charts or "<p>No trace recorded.</p>"}
<h2>Top live allocation sites</h2>{"".join(sites) or "<p>No live blocks.</p>"}
</body></html>
"""
