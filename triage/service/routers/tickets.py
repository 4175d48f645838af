"""`/api/v1/tickets`: the grouped problems; filters, the status workflow, assignment. Thin: the work is
in `triage.tickets.service`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from triage.service.api import (
    JSON_BODY_MAX,
    NO_NUL,
    EventOut,
    LinkOut,
    Problem,
    RankRow,
    TicketDetail,
    TicketOut,
    TicketPage,
    TicketPatch,
    TicketStatus,
)
from triage.service.deps import ReaderDep, ReadSessionDep, SessionDep, SettingsDep
from triage.service.incidents import ticket_url
from triage.service.settings import Settings
from triage.store.models import Incident, Ticket
from triage.tickets import service

router = APIRouter(prefix="/api/v1", tags=["tickets"], max_body_size=JSON_BODY_MAX)


def ticket_out(ticket: Ticket, settings: Settings) -> TicketOut:
    data = {name: getattr(ticket, name) for name in TicketOut.model_fields if name != "url"}
    return TicketOut.model_validate({**data, "url": ticket_url(settings, ticket.id)})


def rank_row(incident: Incident) -> RankRow:
    return RankRow(
        rank=incident.rank,
        pod=incident.pod,
        node=incident.node,
        step=incident.step,
        restart=incident.restart_count,
        incident_id=incident.id,
        verdict=incident.verdict,
        status=incident.status,  # type: ignore[arg-type]
        occurred_at=incident.occurred_at,
    )


def ticket_detail(ticket: Ticket, settings: Settings, db_session: SessionDep) -> TicketDetail:
    base = ticket_out(ticket, settings).model_dump()
    return TicketDetail(
        **base,
        summary=ticket.summary or {},
        ranks=[rank_row(i) for i in service.ranks(db_session=db_session, ticket_id=ticket.id)],
        events=[
            EventOut.model_validate(e) for e in service.events(db_session=db_session, ticket_id=ticket.id)
        ],
        links=[
            LinkOut.model_validate(link) for link in service.links(db_session=db_session, ticket_id=ticket.id)
        ],
    )


@router.get("/tickets", response_model=TicketPage, responses={401: {"model": Problem}})
def list_tickets(
    _user: ReaderDep,
    db_session: ReadSessionDep,
    settings: SettingsDep,
    team: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    verdict: Annotated[str | None, Query(max_length=40, pattern=NO_NUL)] = None,
    status_: Annotated[TicketStatus | None, Query(alias="status")] = None,
    namespace: Annotated[str | None, Query(max_length=253, pattern=NO_NUL)] = None,
    cluster: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    owner: Annotated[str | None, Query(max_length=20, pattern=NO_NUL)] = None,
    assignee: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> TicketPage:
    """Tickets matching the filters, most recently seen first."""
    filters = service.TicketFilters(
        team=team,
        verdict=verdict,
        status=status_,
        namespace=namespace,
        cluster=cluster,
        owner=owner,
        assignee=assignee,
    )
    rows, total = service.list_tickets(db_session=db_session, filters=filters, limit=limit, offset=offset)
    return TicketPage(items=[ticket_out(t, settings) for t in rows], total=total, limit=limit, offset=offset)


@router.get(
    "/tickets/{ticket_id}",
    response_model=TicketDetail,
    responses={401: {"model": Problem}, 404: {"model": Problem}},
)
def get_ticket(
    ticket_id: int, _user: ReaderDep, db_session: ReadSessionDep, settings: SettingsDep
) -> TicketDetail:
    """One ticket with its per-rank table, history and external links."""
    ticket = service.get(db_session=db_session, ticket_id=ticket_id) if 0 < ticket_id < 2**31 else None
    if ticket is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such ticket")
    return ticket_detail(ticket, settings, db_session)


@router.patch(
    "/tickets/{ticket_id}",
    response_model=TicketDetail,
    responses={401: {"model": Problem}, 404: {"model": Problem}, 409: {"model": Problem}},
)
def patch_ticket(
    ticket_id: int, change: TicketPatch, user: ReaderDep, db_session: SessionDep, settings: SettingsDep
) -> TicketDetail:
    """Change a ticket's status (open → acknowledged → resolved; reopen), assignee, or add a note."""
    if not 0 < ticket_id < 2**31 or service.get(db_session=db_session, ticket_id=ticket_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such ticket")
    try:
        if change.status is not None:
            service.transition(db_session=db_session, ticket_id=ticket_id, status=change.status, actor=user)
        if "assignee" in change.model_fields_set:
            assignee = (change.assignee or "").replace("\x00", "").strip() or None
            service.assign(db_session=db_session, ticket_id=ticket_id, assignee=assignee, actor=user)
        if change.note:
            service.add_note(
                db_session=db_session, ticket_id=ticket_id, note=change.note.replace("\x00", ""), actor=user
            )
    except service.InvalidTransition as exc:
        db_session.rollback()
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc))
    except service.TicketNotFound:
        db_session.rollback()
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such ticket")
    db_session.commit()
    ticket = service.get(db_session=db_session, ticket_id=ticket_id)
    assert ticket is not None
    return ticket_detail(ticket, settings, db_session)
