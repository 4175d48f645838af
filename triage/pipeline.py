"""One pipeline, several doors: a snapshot file, a log, or an incident bundle → Evidence → Diagnosis."""

from __future__ import annotations

import os
from typing import Any

from triage.diagnosis import Diagnosis
from triage.engine import decide, diagnose
from triage.errors import NotASnapshot
from triage.evidence import Evidence, build_evidence
from triage.snapshot.frames import FrameClassifier
from triage.snapshot.loader import load_snapshot, normalise
from triage.snapshot.model import Snapshot


def diagnose_snapshot(
    snapshot: Snapshot,
    *,
    message: str | None = None,
    bundle: dict[str, Any] | None = None,
    batch_size: int | None = None,
    classifier: FrameClassifier | None = None,
    rules: bool = True,
) -> tuple[Diagnosis, Evidence]:
    ev = build_evidence(
        snapshot, message, bundle, batch_size=batch_size, classifier=classifier, survivors=rules
    )
    return (diagnose(ev) if rules else decide(ev, [])), ev


def diagnose_file(
    path: str | os.PathLike[str],
    *,
    message: str | None = None,
    batch_size: int | None = None,
    classifier: FrameClassifier | None = None,
) -> tuple[Diagnosis, Evidence]:
    """`triage replay`: a snapshot file (pickle/JSON, maybe gzip'd), optionally with the error text."""
    return diagnose_snapshot(
        load_snapshot(path), message=message, batch_size=batch_size, classifier=classifier
    )


def diagnose_text(text: str, *, batch_size: int | None = None) -> tuple[Diagnosis, Evidence]:
    """`triage diagnose`: only the log / error text."""
    ev = build_evidence(None, text, None, batch_size=batch_size)
    return diagnose(ev), ev


def diagnose_bundle(
    bundle: dict[str, Any], *, classifier: FrameClassifier | None = None
) -> tuple[Diagnosis, Evidence]:
    """The service's door: an incident bundle (docs/bundle.md) with its snapshot inline (or null).

    A snapshot that cannot be read (a corrupt or hand-edited bundle) does not cost the rest of the
    bundle its diagnosis: the message, the device, its processes and the pod's limits are diagnosed
    without it, and the diagnosis says what was wrong with the snapshot.
    """
    raw = bundle.get("snapshot")
    try:
        snap = normalise(raw, source="bundle", shared_frames=False) if isinstance(raw, dict | list) else None
        ev = build_evidence(snap, None, bundle, classifier=classifier)
    except NotASnapshot as exc:
        ev = build_evidence(None, None, bundle, classifier=classifier)
        ev.notes.append(f"The bundle's snapshot could not be read ({exc}); diagnosed without it.")
    return diagnose(ev), ev
