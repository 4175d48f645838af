"""The platform resource contract: the pre-submit gate, the pod audit, MFU and scale-up decisions.

The thresholds live in one versioned file (`contract.toml`, shipped with the package; `--contract`
or `$TRIAGE_CONTRACT` pick another). Modules:

- `load`      read and validate the contract file → `ContractFile` → `Contract` per namespace
- `manifest`  `triage audit manifest`: the pre-submit gate on a workload manifest
- `pod`       `triage audit pod`: the running pod's /dev/shm, CPUs, NUMA, cgroup memory
- `mfu`       `triage audit mfu`: MFU, the peak-FLOPs table, the job gate and algorithm SLA
- `scaleup`   `decide_scale_up`: approve a scale-up from a small-scale report
- `evidence`  `pod_violations`: a crashed pod's violations as OOM-ticket evidence

Importing this package imports nothing heavy: the `triage` CLI imports `triage.contract.cli` to build
its parser, and each handler imports what it needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AuditReport": "triage.contract.model",
    "Check": "triage.contract.model",
    "Contract": "triage.contract.model",
    "ContractError": "triage.contract.errors",
    "ManifestError": "triage.contract.errors",
    "ReportError": "triage.contract.errors",
    "ContractFile": "triage.contract.load",
    "load_contract": "triage.contract.load",
    "load_contract_file": "triage.contract.load",
    "decide_scale_up": "triage.contract.scaleup",
    "pod_violations": "triage.contract.evidence",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'triage.contract' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
