"""The settings object: derived defaults, environment variables, and refusing unsafe production setups."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from triage.service.settings import Settings, hash_token

GOOD = "k9Zq3vX7pL2mW8rT5nB4"
REPO = Path(__file__).resolve().parents[2]


def test_defaults_derive_from_the_data_dir(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.database_url == f"sqlite:///{tmp_path / 'triage.db'}"
    assert s.blobs == tmp_path / "blobs"
    assert s.public_url == "http://127.0.0.1:8080"
    assert s.reads_open
    assert s.ingest_token_map() == {}


def test_environment_variables_use_the_triage_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRIAGE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TRIAGE_DATABASE_URL", "postgresql+psycopg://u@db:5432/triage")
    monkeypatch.setenv("TRIAGE_INGEST_TOKENS", f"gpu-east={GOOD}, gpu-west={GOOD[::-1]}")
    monkeypatch.setenv("TRIAGE_PUBLIC_URL", "https://triage.example.org/")
    monkeypatch.setenv("TRIAGE_RETENTION_DAYS", "7")
    monkeypatch.setenv("TRIAGE_LOG_LEVEL", "debug")
    s = Settings()
    assert s.database_url.startswith("postgresql+psycopg://")
    assert s.ingest_token_map() == {"gpu-east": GOOD, "gpu-west": GOOD[::-1]}
    assert s.public_url == "https://triage.example.org"
    assert s.retention_days == 7
    assert s.log_level == "DEBUG"
    assert GOOD not in repr(s)  # secrets never print


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRIAGE_INGEST_TOKENS": "a=changethis", "TRIAGE_READ_TOKEN": GOOD}, "placeholder"),
        ({"TRIAGE_INGEST_TOKENS": "a=short", "TRIAGE_READ_TOKEN": GOOD}, "placeholder"),
        ({"TRIAGE_INGEST_TOKENS": f"a={GOOD}", "TRIAGE_READ_TOKEN": "changeme"}, "TRIAGE_READ_TOKEN"),
        ({"TRIAGE_READ_TOKEN": GOOD}, "TRIAGE_INGEST_TOKENS is required"),
        ({"TRIAGE_INGEST_TOKENS": f"a={GOOD}"}, "reads would be open"),
    ],
)
def test_production_refuses_unsafe_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("TRIAGE_ENV", "production")
    monkeypatch.setenv("TRIAGE_DATA_DIR", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValidationError, match=message):
        Settings()


def test_production_accepts_a_real_setup(tmp_path: Path) -> None:
    s = Settings(
        env="production",
        data_dir=tmp_path,
        ingest_tokens=f"east={GOOD}",
        trusted_user_header="X-Forwarded-User",
    )
    assert not s.reads_open
    # development accepts placeholders (a laptop) but still parses strictly
    assert Settings(data_dir=tmp_path, ingest_tokens="a=changethis").ingest_token_map() == {"a": "changethis"}


@pytest.mark.parametrize("value", ["nocluster", "=tok", "a=", "a=x,a=y", "a=x,b=x"])
def test_malformed_ingest_tokens_are_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValidationError, match="TRIAGE_INGEST_TOKENS"):
        Settings(data_dir=tmp_path, ingest_tokens=value)


def test_a_lease_must_outlive_the_analysis(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="TRIAGE_LEASE_SECONDS"):
        Settings(data_dir=tmp_path, analysis_timeout_seconds=300, lease_seconds=300)


def test_tokens_are_hashed_with_sha256() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_serve_refuses_to_start_with_unsafe_production_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIAGE_")}
    env.update(TRIAGE_ENV="production", TRIAGE_DATA_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, "-m", "triage.cli", "serve"], capture_output=True, env=env, cwd=REPO, timeout=60
    )
    assert r.returncode == 2
    assert b"invalid settings" in r.stderr and b"TRIAGE_INGEST_TOKENS" in r.stderr
    assert not (tmp_path / "triage.db").exists()
