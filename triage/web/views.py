"""What the pages show, as plain data built from the store: the router stays thin, templates stay dumb.

The ticket page reads the ticket, its incidents (the per-rank table), its history and external links,
the latest incident's stored diagnosis (its ``details`` carry the trace timelines and the top live
allocation sites) and the latest bundle's small fields (device, pod, host, the per-step timeline, the
raw error) through a bounded-memory scan. Nothing here re-runs an analysis or loads a snapshot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from triage.diagnosis import VERDICTS
from triage.store.models import TICKET_STATUSES, Incident, OutboxItem, Ticket
from triage.tickets import service
from triage.units import human
from triage.web.charts import Chart, Limit, Marker, Series
from triage.web.export import bundle_facts

log = logging.getLogger("triage.web")

OWNERS = ("algorithm", "platform")
SITES_SHOWN = 10
FRAMES_SHOWN = 40


def safe_url(url: Any) -> str | None:
    """A link target only when it is plainly http(s): never ``javascript:`` or ``data:``."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    return url.strip() if parts.scheme in ("http", "https") and parts.netloc else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class Fact:
    label: str
    value: str


@dataclass
class Site:
    label: str
    bytes: int
    blocks: int
    span: str
    allocs_in_trace: int | None
    frames: list[dict[str, Any]]


@dataclass
class TicketView:
    ticket: Ticket
    permalink: str
    summary: dict[str, Any]
    evidence: list[dict[str, Any]]
    actions: list[str]
    missing: list[str]
    candidates: list[str]
    leak_site: str | None
    latest: Incident | None
    diagnosis: dict[str, Any]
    charts: list[Chart] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    sites_total: int = 0
    device_facts: list[Fact] = field(default_factory=list)
    pod_facts: list[Fact] = field(default_factory=list)
    host_facts: list[Fact] = field(default_factory=list)
    env_facts: list[Fact] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    message: str | None = None
    traceback: str | None = None
    ranks: list[Incident] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    has_snapshot: bool = False
    has_bundle: bool = False
    notes: list[str] = field(default_factory=list)


def leak_text(leak: Any) -> str | None:
    if isinstance(leak, dict) and leak.get("filename"):
        text = f"{leak.get('filename')}:{leak.get('line', '?')}"
        return f"{text} in {leak['name']}" if leak.get("name") else text
    return None


def ticket_view(*, db_session: Session, ticket: Ticket, public_url: str, blob_root: Path) -> TicketView:
    """Everything the ticket page shows."""
    summary = ticket.summary if isinstance(ticket.summary, dict) else {}
    latest = db_session.get(Incident, ticket.latest_incident_id) if ticket.latest_incident_id else None
    diagnosis = _dict(latest.diagnosis) if latest is not None else {}
    source = diagnosis or summary
    view = TicketView(
        ticket=ticket,
        permalink=f"{public_url}/tickets/{ticket.id}",
        summary=summary,
        evidence=[
            {"rule": str(e.get("rule") or ""), "fact": str(e.get("fact") or "")}
            for e in source.get("evidence") or []
            if isinstance(e, dict) and e.get("fact")
        ],
        actions=[str(a) for a in source.get("actions") or []],
        missing=[str(m) for m in source.get("missing") or []],
        candidates=[str(c) for c in source.get("candidates") or []],
        leak_site=leak_text(source.get("leak_site")),
        latest=latest,
        diagnosis=diagnosis,
    )
    details = _dict(diagnosis.get("details"))
    facts: dict[str, Any] = {}
    if latest is not None and latest.blob_path:
        try:
            facts, view.has_snapshot = bundle_facts(blob_root / latest.blob_path, latest.blob_encoding)
            view.has_bundle = True
        except FileNotFoundError:
            view.notes.append("The latest incident's bundle is no longer stored (retention).")
        except Exception as exc:  # a damaged file must not take the page down
            log.warning("bundle unreadable", extra={"incident_id": latest.id, "error": str(exc)[:200]})
            view.notes.append("The latest incident's bundle could not be read.")
    elif latest is not None:
        view.notes.append("The latest incident's bundle is no longer stored (retention).")
    _charts(view, facts, details)
    _sites(view, details)
    _facts(view, facts, details)
    view.ranks = service.ranks(db_session=db_session, ticket_id=ticket.id)
    view.events = service.events(db_session=db_session, ticket_id=ticket.id)
    view.links = [
        {"sink": link.sink, "url": safe_url(link.url), "ref": link.url or link.external_ref}
        for link in service.links(db_session=db_session, ticket_id=ticket.id)
    ]
    view.deliveries = [
        {
            "sink": row.sink,
            "attempts": row.attempts,
            "next_attempt_at": row.next_attempt_at,
            "last_error": row.last_error,
        }
        for row in db_session.scalars(
            select(OutboxItem)
            .where(OutboxItem.ticket_id == ticket.id, OutboxItem.delivered_at.is_(None))
            .order_by(OutboxItem.id)
            .limit(50)
        )
    ]
    return view


def _charts(view: TicketView, facts: dict[str, Any], details: dict[str, Any]) -> None:
    limits: list[Limit] = []
    dev = _dict(details.get("device"))
    cap = _int(dev.get("limit_bytes")) or _int(dev.get("total_bytes"))
    if cap:
        limits.append(Limit(cap, "limit" if cap != _int(dev.get("total_bytes")) else "device"))
    steps = facts.get("timeline")
    if isinstance(steps, list) and steps:
        alloc: list[tuple[float, float]] = []
        res: list[tuple[float, float]] = []
        peak: list[tuple[float, float]] = []
        last_step = None
        for i, s in enumerate(steps):
            if not isinstance(s, dict):
                continue
            x = _int(s.get("step"))
            x = i if x is None else x
            last_step = x if last_step is None else max(last_step, x)
            for target, key in (
                (alloc, "allocated_bytes"),
                (res, "reserved_bytes"),
                (peak, "peak_allocated_bytes"),
            ):
                v = _int(s.get(key))
                if v is not None:
                    target.append((x, v))
        workload = _dict(facts.get("workload"))
        oom_step = _int(workload.get("step"))
        if oom_step is None and last_step is not None:
            oom_step = last_step + 1
        chart = Chart(
            title="Memory per step",
            x_label="optimizer step",
            series=[
                Series("reserved", res, "reserved"),
                Series("peak", peak, "peak allocated"),
                Series("allocated", alloc, "allocated (after the step)"),
            ],
            markers=[Marker(oom_step, f"OOM at step {oom_step}")] if oom_step is not None else [],
            limits=limits,
            caption=f"{len(steps)} steps sampled by the collector",
        )
        if not chart.empty:
            view.charts.append(chart)
    for tl in details.get("timelines") or []:
        if not isinstance(tl, dict):
            continue
        points = [p for p in tl.get("points") or [] if isinstance(p, list) and len(p) >= 4]
        if len(points) < 2:
            continue
        oom = _dict(tl.get("oom"))
        markers = []
        if _int(oom.get("index")) is not None:
            size = _int(oom.get("size"))
            markers.append(Marker(oom["index"], f"OOM (asked {human(size)})" if size else "OOM"))
        view.charts.append(
            Chart(
                title=f"Device {tl.get('device')}: memory over the allocator trace",
                x_label="trace entry",
                series=[
                    Series("reserved", [(p[0], p[3]) for p in points], "reserved"),
                    Series("allocated", [(p[0], p[2]) for p in points], "allocated"),
                ],
                markers=markers,
                limits=limits,
                caption=(
                    f"{tl.get('entries', len(points)):,} trace entries; peak allocated "
                    f"{human(_int(tl.get('peak_allocated_bytes')) or 0)}, peak reserved "
                    f"{human(_int(tl.get('peak_reserved_bytes')) or 0)}"
                ),
            )
        )


def _sites(view: TicketView, details: dict[str, Any]) -> None:
    sites = [s for s in details.get("top_sites") or [] if isinstance(s, dict)]
    view.sites_total = len(sites)
    for s in sites[:SITES_SHOWN]:
        site = _dict(s.get("site"))
        first, last = s.get("first_index"), s.get("last_index")
        view.sites.append(
            Site(
                label=str(site.get("label") or leak_text(site) or "unknown"),
                bytes=_int(s.get("bytes")) or 0,
                blocks=_int(s.get("blocks")) or 0,
                span=f"{first}..{last}" if first is not None else "-",
                allocs_in_trace=_int(s.get("allocs_in_trace")),
                frames=[
                    {
                        "filename": str(f.get("filename") or "??"),
                        "line": f.get("line") if f.get("line") is not None else "?",
                        "name": str(f.get("name") or "??"),
                        "user": bool(f.get("user")),
                    }
                    for f in s.get("stack") or []
                    if isinstance(f, dict)
                ][:FRAMES_SHOWN],
            )
        )


def _b(v: Any) -> str | None:
    n = _int(v)
    return f"{human(n)} ({n:,} B)" if n is not None else None


def _add(out: list[Fact], label: str, value: Any) -> None:
    if value is None or value == "" or value == []:
        return
    out.append(Fact(label, value if isinstance(value, str) else str(value)))


def _facts(view: TicketView, facts: dict[str, Any], details: dict[str, Any]) -> None:
    d = _dict(facts.get("device"))
    dd = _dict(details.get("device"))
    alloc = _dict(facts.get("allocator"))
    out = view.device_facts
    _add(out, "GPU", d.get("name") or dd.get("name"))
    _add(out, "index", d.get("index") if d.get("index") is not None else dd.get("index"))
    _add(out, "UUID", d.get("uuid"))
    _add(out, "total memory", _b(d.get("total_bytes") or dd.get("total_bytes")))
    _add(out, "free at the OOM", _b(d.get("free_bytes") or dd.get("free_bytes")))
    _add(
        out, "declared (promised) memory", _b(d.get("declared_total_bytes") or dd.get("declared_total_bytes"))
    )
    if d.get("mig_mode") or d.get("mig_profile") or dd.get("mig_profile"):
        _add(out, "MIG profile", d.get("mig_profile") or dd.get("mig_profile") or "MIG mode on")
    _add(out, "per-process fraction", alloc.get("fraction"))
    _add(out, "fraction cap", _b(alloc.get("fraction_cap_bytes") or dd.get("fraction_cap_bytes")))
    _add(out, "other processes on the GPU", _b(dd.get("other_process_bytes")))
    _add(out, "non-PyTorch memory of this process", _b(dd.get("non_pytorch_bytes")))
    _add(out, "request at the OOM", _b(details.get("request_bytes")))
    view.processes = [
        {"pid": p.get("pid"), "name": p.get("name"), "used_bytes": p.get("used_bytes")}
        for p in d.get("processes") or []
        if isinstance(p, dict)
    ][:50]

    w = _dict(facts.get("workload"))
    latest = view.latest
    out = view.pod_facts
    _add(out, "cluster", latest.cluster if latest else None)
    _add(out, "namespace", w.get("namespace") or (latest.namespace if latest else None))
    _add(out, "pod", w.get("pod") or (latest.pod if latest else None))
    _add(out, "node", w.get("node") or (latest.node if latest else None))
    _add(out, "container", w.get("container"))
    _add(out, "job", w.get("job") or view.ticket.job)
    if w.get("owner_kind") or w.get("owner_name"):
        _add(out, "owner", f"{w.get('owner_kind') or '?'}/{w.get('owner_name') or '?'}")
    _add(out, "team", w.get("team") or view.ticket.team)
    if w.get("rank") is not None:
        _add(out, "rank", f"{w.get('rank')} of {w.get('world_size') or '?'} (local {w.get('local_rank')})")
    _add(out, "restart count", w.get("restart_count"))
    _add(out, "step", w.get("step"))
    _add(out, "batch size", w.get("batch_size"))

    h = _dict(facts.get("host"))
    cg = _dict(h.get("cgroup"))
    out = view.host_facts
    if h.get("shm_total_bytes") is not None:
        _add(out, "/dev/shm", f"{_b(h.get('shm_used_bytes')) or '?'} used of {_b(h.get('shm_total_bytes'))}")
    _add(out, "cgroup memory limit", _b(cg.get("memory_limit_bytes")) or ("none" if cg else None))
    _add(out, "cgroup memory usage", _b(cg.get("memory_usage_bytes")))
    _add(out, "cgroup OOM kills", cg.get("oom_kill_count"))
    _add(out, "process RSS", _b(h.get("rss_bytes")))
    _add(out, "CPUs", h.get("cpu_count"))
    _add(out, "DataLoader workers", h.get("dataloader_workers"))

    env = _dict(facts.get("environment"))
    out = view.env_facts
    for key, label in (
        ("torch_version", "torch"),
        ("cuda_version", "CUDA"),
        ("driver_version", "driver"),
        ("python_version", "Python"),
        ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"),
        ("CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    ):
        _add(out, label, env.get(key))

    err = _dict(facts.get("error"))
    msg = err.get("message")
    if not msg:
        msg = _dict(details.get("message")).get("text")
    view.message = str(msg) if msg else None
    view.traceback = str(err["traceback"]) if err.get("traceback") else None


@dataclass
class ListFilters:
    status: str | None = None
    verdict: str | None = None
    owner: str | None = None
    team: str | None = None
    namespace: str | None = None
    cluster: str | None = None

    def service_filters(self) -> service.TicketFilters:
        return service.TicketFilters(
            status=self.status,
            verdict=self.verdict,
            owner=self.owner,
            team=self.team,
            namespace=self.namespace,
            cluster=self.cluster,
        )

    def query(self, **override: Any) -> str:
        from urllib.parse import urlencode

        values = {k: v for k, v in vars(self).items() if v} | {
            k: v for k, v in override.items() if v is not None
        }
        return urlencode(values)


FILTER_CHOICES = {"status": TICKET_STATUSES, "verdict": VERDICTS, "owner": OWNERS}


def when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t is not None else "-"
