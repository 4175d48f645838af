"""`/api/v1/scale-up-requests`: a small-scale report in, the contract's approved/denied with reasons
out (`triage.contract.scaleup.decide_scale_up`), stored and listed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from sqlalchemy import func, select

from triage.service.api import JSON_BODY_MAX, NO_NUL, Problem, ScaleUpIn, ScaleUpOut, ScaleUpPage
from triage.service.deps import ReaderDep, ReadSessionDep, SessionDep, ingest_cluster_or_none, reader_or_none
from triage.service.incidents import clean_json
from triage.store.models import ScaleUpRequest

router = APIRouter(prefix="/api/v1", tags=["scale-up"], max_body_size=JSON_BODY_MAX)


def require_submitter(
    user: Annotated[str | None, Depends(reader_or_none)],
    cluster: Annotated[str | None, Depends(ingest_cluster_or_none)],
) -> str:
    """Read access or a cluster's ingest token (a CI job posting its report)."""
    if user is not None:
        return user
    if cluster is not None:
        return f"cluster:{cluster}"
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "a read or ingest token is required",
        headers={"WWW-Authenticate": "Bearer"},
    )


def contract_file(request: Request) -> Any:
    """The contract file (loaded once per app: `TRIAGE_CONTRACT` or the packaged default)."""
    cached = getattr(request.app.state, "contract_file", None)
    if cached is None:
        from triage.contract.load import load_contract_file

        settings = request.app.state.settings
        cached = load_contract_file(str(settings.contract) if settings.contract else None)
        request.app.state.contract_file = cached
    return cached


def scale_up_out(row: ScaleUpRequest) -> ScaleUpOut:
    return ScaleUpOut(
        id=row.id,
        created_at=row.created_at,
        requested_by=row.requested_by,
        namespace=row.namespace,
        job=row.job,
        gpus=row.gpus,
        requested_gpus=row.requested_gpus,
        mfu=row.mfu,
        gpu_utilization=row.gpu_utilization,
        step_time_s=row.step_time_s,
        approved=row.approved,
        decision="approved" if row.approved else "denied",
        reasons=list(row.reasons or []),
        checks=list((row.decision or {}).get("checks") or []),
        contract_version=row.contract_version,
    )


@router.post(
    "/scale-up-requests",
    status_code=status.HTTP_201_CREATED,
    response_model=ScaleUpOut,
    responses={401: {"model": Problem}, 422: {"model": Problem}},
)
def post_scale_up(
    report: ScaleUpIn,
    submitter: Annotated[str, Depends(require_submitter)],
    db_session: SessionDep,
    contract: Annotated[Any, Depends(contract_file)],
) -> ScaleUpOut:
    """Decide a scale-up request from its small-scale report (approved or denied, with reasons)."""
    from triage.contract.errors import ReportError
    from triage.contract.scaleup import decide_scale_up

    try:
        decision = decide_scale_up(report.model_dump(), contract)
    except ReportError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))
    parsed = decision.report
    assert parsed is not None
    data = clean_json(decision.to_dict())
    row = ScaleUpRequest(
        requested_by=submitter[:200],
        namespace=(parsed.namespace or "").replace("\x00", "")[:253] or None,
        job=(parsed.job or "").replace("\x00", "")[:500] or None,
        gpus=parsed.gpus,
        requested_gpus=parsed.requested_gpus,
        mfu=parsed.mfu,
        gpu_utilization=parsed.gpu_utilization,
        step_time_s=parsed.step_time_s,
        approved=decision.approved,
        reasons=data["reasons"],
        decision=data,
        contract_version=str(decision.contract_version)[:100],
    )
    db_session.add(row)
    db_session.commit()
    return scale_up_out(row)


@router.get("/scale-up-requests", response_model=ScaleUpPage, responses={401: {"model": Problem}})
def list_scale_ups(
    _user: ReaderDep,
    db_session: ReadSessionDep,
    namespace: Annotated[str | None, Query(max_length=253, pattern=NO_NUL)] = None,
    approved: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> ScaleUpPage:
    """Stored scale-up requests, newest first."""
    stmt = select(ScaleUpRequest)
    count = select(func.count()).select_from(ScaleUpRequest)
    if namespace is not None:
        stmt, count = (
            stmt.where(ScaleUpRequest.namespace == namespace),
            count.where(ScaleUpRequest.namespace == namespace),
        )
    if approved is not None:
        stmt, count = (
            stmt.where(ScaleUpRequest.approved == approved),
            count.where(ScaleUpRequest.approved == approved),
        )
    total = db_session.scalar(count) or 0
    rows = db_session.scalars(
        stmt.order_by(ScaleUpRequest.created_at.desc(), ScaleUpRequest.id.desc()).limit(limit).offset(offset)
    ).all()
    return ScaleUpPage(items=[scale_up_out(r) for r in rows], total=int(total), limit=limit, offset=offset)


@router.get(
    "/scale-up-requests/{request_id}",
    response_model=ScaleUpOut,
    responses={401: {"model": Problem}, 404: {"model": Problem}},
)
def get_scale_up(request_id: int, _user: ReaderDep, db_session: ReadSessionDep) -> ScaleUpOut:
    """One stored scale-up request and its decision."""
    row = db_session.get(ScaleUpRequest, request_id) if 0 < request_id < 2**31 else None
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such scale-up request")
    return scale_up_out(row)
