"""triage/schemas.py: the wire format's one definition, checked against docs/bundle.md and the simulator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from triage import schemas

DOC = Path(__file__).resolve().parents[2] / "docs" / "bundle.md"


def _minimal() -> dict[str, Any]:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "0b7c1e52-5a5e-4bd6-9a3f-1a2b3c4d5e6f",
        "occurred_at": "2025-06-01T12:00:00.000+00:00",
        "kind": "cuda_oom",
    }


def test_only_four_fields_are_required_and_unknown_keys_are_kept() -> None:
    b = schemas.IncidentBundle.model_validate({**_minimal(), "future": {"x": 1}, "host": {"gpu_temp_c": 70}})
    assert b.error is None and b.snapshot is None
    dumped = b.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["schema"] == "oom-triage/incident@1"
    assert dumped["future"] == {"x": 1} and dumped["host"] == {"gpu_temp_c": 70}
    for key in ("schema", "incident_id", "occurred_at", "kind"):
        with pytest.raises(ValidationError):
            schemas.IncidentBundle.model_validate({k: v for k, v in _minimal().items() if k != key})


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ({"schema": "oom-triage/incident@2"}, "another version"),
        ({"kind": "gpu_fell_off_the_bus"}, "unknown kind"),
        ({"incident_id": "not-a-uuid"}, "id"),
        ({"occurred_at": "2025-06-01T12:00:00"}, "no time zone"),
        ({"device": {"total_bytes": -1}}, "negative bytes"),
        ({"device": {"free_bytes": 1.5}}, "fractional bytes"),
        ({"host": {"cgroup": {"version": 3}}}, "cgroup version"),
        ({"snapshot": [1, 2]}, "snapshot is a dict"),
    ],
)
def test_refusals(patch: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError):
        schemas.IncidentBundle.model_validate({**_minimal(), **patch})


def test_every_name_in_the_doc_is_a_model_field() -> None:
    """Each key in docs/bundle.md's example is a field of the models (no drift between prose and code)."""
    block = DOC.read_text().split("```", 2)[1]
    models = [
        schemas.IncidentBundle,
        schemas.Error,
        schemas.Workload,
        schemas.Device,
        schemas.GpuProcess,
        schemas.Allocator,
        schemas.OomObservation,
        schemas.FractionSetBy,
        schemas.TimelineSample,
        schemas.Host,
        schemas.DeadWorker,
        schemas.Cgroup,
        schemas.Environment,
        schemas.CollectorInfo,
    ]
    fields = {f.alias or name for m in models for name, f in m.model_fields.items()}
    names = {n for n in re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', block)}
    assert len(names) > 60
    assert sorted(names - fields) == []


def test_the_simulator_bundles_validate() -> None:
    sim = pytest.importorskip("triage.simulate.scenarios")
    for name in sim.scenario_names():
        res = sim.run_scenario(name, seed=1)
        b = schemas.IncidentBundle.model_validate(res.bundle)
        assert b.kind in schemas.KINDS
