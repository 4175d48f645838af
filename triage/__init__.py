"""oom-triage: is a CUDA out-of-memory crash the platform's or the training code's?

The public API is small and pinned by ``tests/test_public_api.py``::

    from triage import load_snapshot, diagnose_file, diagnose_text, diagnose_bundle
    diagnosis, evidence = diagnose_file("snapshot.pickle", message=open("crash.log").read())
    diagnosis.to_dict()   # the Diagnosis JSON of DESIGN.md

Everything else is private to the package and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Diagnosis",
    "InputError",
    "TriageError",
    "__version__",
    "diagnose_bundle",
    "diagnose_file",
    "diagnose_text",
    "load_snapshot",
]

_LAZY = {
    "Diagnosis": "triage.diagnosis",
    "InputError": "triage.errors",
    "TriageError": "triage.errors",
    "diagnose_bundle": "triage.pipeline",
    "diagnose_file": "triage.pipeline",
    "diagnose_text": "triage.pipeline",
    "load_snapshot": "triage.snapshot.loader",
}

if TYPE_CHECKING:
    from triage.diagnosis import Diagnosis
    from triage.errors import InputError, TriageError
    from triage.pipeline import diagnose_bundle, diagnose_file, diagnose_text
    from triage.snapshot.loader import load_snapshot


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'triage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
