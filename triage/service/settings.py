"""The service's one settings object: environment variables with the `TRIAGE_` prefix (docs/service.md).

Validated once at start. Outside development it refuses placeholder secrets, a missing ingest token and
open reads, so a production deployment cannot come up half-configured.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDERS = frozenset(
    {"changethis", "changeme", "change-me", "secret", "token", "example", "password", "xxx"}
)
MIN_SECRET_CHARS = 16


def hash_token(token: str) -> str:
    """The sha256 (hex) under which an ingest token is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Settings(BaseSettings):
    """Every setting of `triage serve`; see docs/service.md for each variable."""

    model_config = SettingsConfigDict(env_prefix="TRIAGE_", extra="ignore", validate_default=True)

    env: Literal["development", "production"] = "development"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    data_dir: Path = Path("triage-data")
    database_url: str = ""
    db_pool_size: int = Field(default=10, ge=1, le=200)
    blob_dir: Path | None = None
    retention_days: int = Field(default=30, ge=0)
    max_upload_bytes: int = Field(default=1 << 30, ge=1024)
    max_bundle_bytes: int = Field(default=4 << 30, ge=1024)
    ingest_tokens: SecretStr = SecretStr("")
    read_token: SecretStr = SecretStr("")
    trusted_user_header: str = ""
    public_url: str = ""
    sinks_config: Path | None = None
    contract: Path | None = None
    worker: bool = True
    worker_concurrency: int = Field(default=1, ge=1, le=64)
    worker_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    analysis_timeout_seconds: float = Field(default=300.0, gt=0)
    analysis_isolation: Literal["process", "thread"] = "process"
    lease_seconds: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=100)
    retry_backoff_seconds: float = Field(default=10.0, ge=0)
    k8s_enrich: Literal["auto", "on", "off"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _derive_and_check(self) -> Self:
        self.data_dir = self.data_dir.expanduser().resolve()
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'triage.db'}"
        self.blob_dir = (self.blob_dir or self.data_dir / "blobs").expanduser().resolve()
        if not self.public_url:
            host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
            self.public_url = f"http://{host}:{self.port}"
        self.public_url = self.public_url.rstrip("/")
        tokens = self.ingest_token_map()  # raises on a malformed list
        if self.lease_seconds < self.analysis_timeout_seconds + 10:
            raise ValueError(
                "TRIAGE_LEASE_SECONDS must exceed TRIAGE_ANALYSIS_TIMEOUT_SECONDS by at least 10 s "
                "(a claim must outlive its analysis)"
            )
        if self.env != "development":
            for cluster, token in tokens.items():
                _refuse_placeholder(f"TRIAGE_INGEST_TOKENS ({cluster})", token)
            if self.read_token.get_secret_value():
                _refuse_placeholder("TRIAGE_READ_TOKEN", self.read_token.get_secret_value())
            if not tokens:
                raise ValueError("TRIAGE_INGEST_TOKENS is required outside development (cluster=token,...)")
            if not self.read_token.get_secret_value() and not self.trusted_user_header:
                raise ValueError(
                    "reads would be open: set TRIAGE_READ_TOKEN or TRIAGE_TRUSTED_USER_HEADER outside development"
                )
        return self

    def ingest_token_map(self) -> dict[str, str]:
        """`cluster=token,...` as {cluster: token}."""
        out: dict[str, str] = {}
        text = self.ingest_tokens.get_secret_value().strip()
        if not text:
            return out
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            cluster, sep, token = item.partition("=")
            cluster, token = cluster.strip(), token.strip()
            if not sep or not cluster or not token:
                raise ValueError("TRIAGE_INGEST_TOKENS must be cluster=token pairs separated by commas")
            if cluster in out:
                raise ValueError(f"TRIAGE_INGEST_TOKENS names cluster {cluster!r} twice")
            out[cluster] = token
        if len(set(out.values())) != len(out):
            raise ValueError("TRIAGE_INGEST_TOKENS gives two clusters the same token")
        return out

    @property
    def blobs(self) -> Path:
        """The blob directory (always set after validation)."""
        assert self.blob_dir is not None
        return self.blob_dir

    @property
    def reads_open(self) -> bool:
        """Development with no read token and no trusted header: anyone may read."""
        return (
            self.env == "development"
            and not self.read_token.get_secret_value()
            and not self.trusted_user_header
        )


def _refuse_placeholder(name: str, value: str) -> None:
    if value.lower() in PLACEHOLDERS or len(value) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{name} is a placeholder or shorter than {MIN_SECRET_CHARS} characters: set a real secret "
            "(placeholders are only accepted with TRIAGE_ENV=development)"
        )
