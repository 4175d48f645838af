"""API fuzzing with schemathesis against the app's own OpenAPI schema: no 5xx, responses match the
schema, invalid authentication is refused, schema-valid requests are accepted. Then the worker analyses
whatever the fuzzer managed to store, without a store error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.configuration import set_hypothesis_home_dir
from sqlalchemy import select

from tests.service.svckit import Service, bundle, post
from triage.store.models import Incident

INGEST = "ingest-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
EXAMPLES = {"POST /api/v1/incidents": 40}
DEFAULT_EXAMPLES = 20


def _fuzz(schema: schemathesis.BaseSchema, label: str) -> None:
    op = schema[label.split(" ", 1)[1]][label.split(" ", 1)[0]]
    token = INGEST if label == "POST /api/v1/incidents" else READ

    @settings(
        max_examples=EXAMPLES.get(label, DEFAULT_EXAMPLES),
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=op.as_strategy())
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"})

    run()


@pytest.fixture(autouse=True)
def _hypothesis_home(tmp_path: Path) -> Iterator[None]:
    """Hypothesis writes caches under ./.hypothesis by default: keep them out of the checkout."""
    set_hypothesis_home_dir(tmp_path / "hypothesis")
    yield
    set_hypothesis_home_dir(None)


def test_the_api_survives_fuzzing(make_service: Callable[..., Service]) -> None:
    svc = make_service(ingest_tokens=f"c={INGEST}", read_token=READ)
    for rank in range(3):
        assert post(svc.client, bundle(rank=rank, job=f"job-{rank}"), token=INGEST).status_code == 202
    svc.drain()
    schema = schemathesis.openapi.from_asgi("/openapi.json", svc.app)
    labels = [f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()]
    assert "POST /api/v1/incidents" in labels and "PATCH /api/v1/tickets/{ticket_id}" in labels
    _fuzz(schema, "POST /api/v1/incidents")
    svc.drain()  # whatever was stored is analysed or failed, never a store error
    with svc.db.read_session() as s:
        states = set(s.scalars(select(Incident.status)))
    assert states <= {"done", "failed"}
    for label in labels:
        if label != "POST /api/v1/incidents":
            _fuzz(schema, label)
