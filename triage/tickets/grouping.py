"""Grouping: one ticket per problem of one job, whatever the number of ranks and restarts.

The fingerprint is (cluster, namespace, job identity, verdict, site): the job identity comes from the
workload's job/owner or well-known labels, falling back to the pod name without its rank and hash
suffixes; the site is the leaking source line for a tensor leak, the kind of quota for gpu_quota, else
"-". Every rank of a job that leaks at the same line, and every restart of it, folds into one ticket with
counts, first/last seen and a per-rank table (the ticket's incidents). A resolved ticket reopens when an
incident that happened after the resolution folds in.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from triage.store.models import OPEN, RESOLVED, Incident, Ticket, TicketEvent, utcnow
from triage.tickets.service import enqueue_sinks

log = logging.getLogger("triage.tickets")

JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "batch.kubernetes.io/job-name",
    "job-name",
    "ray.io/cluster",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/name",
    "app",
)
TEAM_LABELS = ("team", "owner-team", "app.kubernetes.io/part-of")
# "<job>-worker-3", "<job>-master-0-abcde", "<job>-7f9c6d5b4-x2x9z": the job part of a pod name
_POD_SUFFIX = re.compile(
    r"(-(worker|master|launcher|chief|ps|evaluator|head|rank))?(-\d+)*(-[a-z0-9]{9,10})?(-[a-z0-9]{5})?$"
)
SUMMARY_EVIDENCE_MAX = 40


def job_identity(*, incident: Incident) -> str:
    """The job an incident belongs to: its job/owner, a job label, or its pod name without suffixes."""
    if incident.job:
        return incident.job
    if incident.owner_name:
        return f"{incident.owner_kind or 'owner'}/{incident.owner_name}"
    labels = incident.labels or {}
    for key in JOB_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    if incident.pod:
        base = _POD_SUFFIX.sub("", incident.pod)
        return base or incident.pod
    return "-"


def team_of(*, incident: Incident) -> str | None:
    """The owning team, from the bundle or a team label."""
    if incident.team:
        return incident.team
    labels = incident.labels or {}
    for key in TEAM_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def site_of(*, verdict: str, diagnosis: dict[str, Any]) -> str:
    """What distinguishes two problems of one job with the same verdict: leak line or quota kind."""
    if verdict == "tensor_leak":
        leak = diagnosis.get("leak_site") or {}
        if isinstance(leak, dict) and leak.get("filename"):
            return f"{leak.get('filename')}:{leak.get('line', '?')}"
        return "-"
    if verdict == "gpu_quota":
        values: dict[str, Any] = {}
        for item in diagnosis.get("evidence") or []:
            if (
                isinstance(item, dict)
                and item.get("rule") == "gpu_quota"
                and isinstance(item.get("value"), dict)
            ):
                values.update(item["value"])
        if values.get("mig_profile"):
            return f"mig:{values['mig_profile']}"
        if values.get("fraction_cap_bytes"):
            return "fraction"
        if values.get("vgpu_limit_bytes"):
            return "vgpu"
        if values.get("declared_total_bytes"):
            return "smaller_gpu"
        return "quota"
    return "-"


def fingerprint(*, incident: Incident, diagnosis: dict[str, Any]) -> tuple[str, str]:
    """The grouping key (sha256 hex) and the site that is part of it."""
    verdict = str(diagnosis.get("verdict") or "inconclusive")
    site = site_of(verdict=verdict, diagnosis=diagnosis)
    parts = (incident.cluster, incident.namespace or "-", job_identity(incident=incident), verdict, site)
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest(), site


def summarize(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """The part of a diagnosis a ticket keeps (no timelines or site tables: those stay on the incident)."""
    keys = ("verdict", "owner", "confidence", "candidates", "leak_site", "max_batch_size", "actions")
    out = {k: diagnosis.get(k) for k in keys}
    out["headline"] = diagnosis.get("headline") or ""
    out["missing"] = diagnosis.get("missing") or []
    out["evidence"] = (diagnosis.get("evidence") or [])[:SUMMARY_EVIDENCE_MAX]
    out["summary"] = diagnosis.get("summary") or {}
    return out


def title_of(*, incident: Incident, verdict: str, site: str) -> str:
    """The ticket's one-line title."""
    where = job_identity(incident=incident)
    if incident.namespace:
        where = f"{incident.namespace}/{where}"
    title = f"{verdict.replace('_', ' ')} in {where}"
    if site != "-":
        title += f" ({site})"
    return title[:500]


def fold(*, db_session: Session, incident: Incident) -> Ticket:
    """Fold an analysed incident into its ticket (created, updated or reopened), in the caller's
    transaction; the ticket row is locked so concurrent folds of one fingerprint serialize."""
    diagnosis = incident.diagnosis or {}
    verdict = str(diagnosis.get("verdict") or "inconclusive")
    fp, site = fingerprint(incident=incident, diagnosis=diagnosis)
    incident.fingerprint = fp
    now = utcnow()
    values: dict[str, Any] = {
        "fingerprint": fp,
        "title": title_of(incident=incident, verdict=verdict, site=site),
        "cluster": incident.cluster,
        "namespace": incident.namespace,
        "job": job_identity(incident=incident)[:500],
        "team": team_of(incident=incident),
        "owner": diagnosis.get("owner"),
        "verdict": verdict,
        "site": site[:1000],
        "status": OPEN,
        "incident_count": 0,
        "rank_count": 0,
        "pod_count": 0,
        "first_seen": incident.occurred_at,
        "last_seen": incident.occurred_at,
        "created_at": now,
        "updated_at": now,
        "reopen_count": 0,
        "headline": "",
        "summary": {},
    }
    bind = db_session.get_bind()
    insert = pg_insert if bind.dialect.name == "postgresql" else sqlite_insert
    stmt = insert(Ticket).values(**values).on_conflict_do_nothing(index_elements=["fingerprint"])
    created = db_session.execute(stmt.returning(Ticket.id)).first() is not None
    ticket = db_session.scalars(
        select(Ticket)
        .where(Ticket.fingerprint == fp)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()

    incident.ticket_id = ticket.id
    db_session.flush()
    ticket.incident_count += 1
    ticket.first_seen = min(ticket.first_seen, incident.occurred_at)
    newest = incident.occurred_at >= ticket.last_seen or created
    ticket.last_seen = max(ticket.last_seen, incident.occurred_at)
    if incident.team and not ticket.team:
        ticket.team = incident.team
    ranks, pods, max_restart = db_session.execute(
        select(
            func.count(func.distinct(func.coalesce(Incident.rank, -1))),
            func.count(func.distinct(Incident.pod)),
            func.max(Incident.restart_count),
        ).where(Incident.ticket_id == ticket.id)
    ).one()
    ticket.rank_count, ticket.pod_count, ticket.max_restart = int(ranks), int(pods), max_restart
    if newest:
        ticket.latest_incident_id = incident.id
        ticket.headline = str(diagnosis.get("headline") or "")
        conf = diagnosis.get("confidence")
        ticket.confidence = float(conf) if isinstance(conf, int | float) else None
        ticket.summary = summarize(diagnosis)
        ticket.owner = diagnosis.get("owner")
    ticket.updated_at = now

    if created:
        db_session.add(TicketEvent(ticket_id=ticket.id, kind="created", detail={"incident_id": incident.id}))
        action = "create"
    else:
        action = "update"
        if (
            ticket.status == RESOLVED
            and ticket.resolved_at is not None
            and incident.occurred_at > ticket.resolved_at
        ):
            ticket.status = OPEN
            ticket.reopen_count += 1
            db_session.add(
                TicketEvent(
                    ticket_id=ticket.id,
                    kind="reopened",
                    detail={"incident_id": incident.id, "resolved_at": ticket.resolved_at.isoformat()},
                )
            )
            ticket.resolved_at = None
            ticket.acknowledged_at = None
            log.info("ticket reopened", extra={"ticket_id": ticket.id, "incident_id": incident.id})
    db_session.flush()
    enqueue_sinks(db_session=db_session, ticket=ticket, action=action)
    return ticket
