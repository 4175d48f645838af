"""The GPU incidents' own code, run here on the CPU so it cannot rot between the sessions that have a GPU.

tests/gpu/ is not collected by the normal run (it needs a CUDA GPU). Its workloads script,
tests/gpu/incidents.py, has a smoke mode (OOMT_INCIDENTS_SMOKE=1: a tiny model on the CPU, a few steps,
no OOM); every mode of its table runs here in one process. What it checks is the script itself (the modes
exist, take the arguments the GPU tests pass, and train), not any OOM.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "gpu" / "incidents.py"

# the arguments tests/gpu/test_gpu_incidents.py passes, scaled down
ARGS = {
    "leak": (),
    "too-large": (2,),
    "neighbour": (2,),
    "too-large-later": (2, 32, 64),
    "fragmentation": (2,),
    "slow-leak": (2,),
    "batch-grow": (2, 3),
    "eval-leak": (2,),
    "bisect": (64, 4),
}


def test_every_gpu_incident_mode_runs_in_smoke_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("OOMT_INCIDENTS_SMOKE", "1")
    spec = importlib.util.spec_from_file_location("gpu_incidents_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.SMOKE and str(mod.dev) == "cpu"
    assert set(mod.MODES) == set(ARGS) | {"hold"}  # hold allocates GiB on the device: GPU only
    for mode, args in ARGS.items():
        mod.MODES[mode](*args)
