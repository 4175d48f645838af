"""Typed dependencies (`Annotated` aliases): settings, store, sessions, and the two kinds of access.

Ingest and reads are separate: a cluster's ingest token can only post incidents; the read API and the
pages need the read token or the trusted user header set by the cluster's SSO proxy (or nothing, in
development with neither configured).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from triage.service.blobs import BlobStore
from triage.service.metrics import Metrics
from triage.service.settings import Settings, hash_token
from triage.store.models import IngestToken
from triage.store.session import Database

DEV_CLUSTER = "local"  # the cluster of incidents posted without a token in development
TOKEN_CACHE_TTL_S = 30.0  # a token revoked in the database stops working within this time

_bearer = HTTPBearer(auto_error=False, description="the read token, or a cluster's ingest token")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_database(request: Request) -> Database:
    return request.app.state.db


def get_blobs(request: Request) -> BlobStore:
    return request.app.state.blobs


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]
BlobsDep = Annotated[BlobStore, Depends(get_blobs)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def get_session(db: DatabaseDep) -> Iterator[Session]:
    """A read-write session; the handler commits (an exception rolls back)."""
    with db.session() as session:
        yield session


def get_read_session(db: DatabaseDep) -> Iterator[Session]:
    """A read-only session (a consistent snapshot; never takes the write lock on SQLite)."""
    with db.read_session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]


def reader_or_none(request: Request, settings: SettingsDep, bearer: BearerDep) -> str | None:
    """The acting user when the request may read: the trusted header's user, `token`, `anonymous`."""
    if settings.trusted_user_header:
        user = request.headers.get(settings.trusted_user_header, "").replace("\x00", "").strip()
        if user:
            return user[:200]
    token = settings.read_token.get_secret_value()
    if token and bearer is not None and hmac.compare_digest(bearer.credentials.encode(), token.encode()):
        return "token"
    if settings.reads_open:
        return "anonymous"
    return None


def require_reader(user: Annotated[str | None, Depends(reader_or_none)]) -> str:
    """Read access, or 401."""
    if user is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "read access needs the read token or the SSO proxy's user header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return user


ReaderDep = Annotated[str, Depends(require_reader)]


class TokenCache:
    """Recently verified ingest tokens (sha256 → cluster), so a burst of posts costs one lookup."""

    def __init__(self, ttl_s: float = TOKEN_CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._known: dict[str, tuple[str, float]] = {}

    def get(self, digest: str) -> str | None:
        hit = self._known.get(digest)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, digest: str, cluster: str) -> None:
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[digest] = (cluster, time.monotonic() + self.ttl_s)


def ingest_cluster_or_none(
    request: Request, settings: SettingsDep, db: DatabaseDep, bearer: BearerDep
) -> str | None:
    """The cluster of a valid ingest token (looked up by its sha256); `local` in open development."""
    if bearer is not None and bearer.credentials:
        digest = hash_token(bearer.credentials)
        cache: TokenCache = request.app.state.token_cache
        cluster = cache.get(digest)
        if cluster is None:
            with db.read_session() as s:
                cluster = s.scalar(select(IngestToken.cluster).where(IngestToken.token_sha256 == digest))
            if cluster is not None:
                cache.put(digest, cluster)
        if cluster is not None:
            return cluster
    if settings.env == "development" and not settings.ingest_token_map():
        return DEV_CLUSTER
    return None


def require_ingest(cluster: Annotated[str | None, Depends(ingest_cluster_or_none)], bearer: BearerDep) -> str:
    """A cluster's ingest token, or 401 (none given) / 403 (not a known token)."""
    if cluster is None:
        if bearer is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "an ingest token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        raise HTTPException(status.HTTP_403_FORBIDDEN, "not a valid ingest token")
    return cluster


IngestClusterDep = Annotated[str, Depends(require_ingest)]
