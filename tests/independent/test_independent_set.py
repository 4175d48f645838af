"""An independent labelled set of OOM incidents: does the diagnosis generalise beyond our own simulator?

The 73 cases (38 message-only logs, 35 incident bundles) were written from the documentation only --
SNAPSHOT_FORMAT.md, DESIGN.md and docs/bundle.md -- independently of `triage.simulate` and of the rules, and
labelled by hand (`acceptable` = correct; `soft` = defensible but weaker, e.g. inconclusive where a human would
decide). The bundles come from an allocator model of their own (tests/independent/sim.py: rounding, pools,
segment sizes, best fit, split/merge, release-cached-then-retry, the fraction cap), so every bundle is
self-consistent: segments, blocks, trace, memory_stats, timeline and the error message agree.

Each case goes through the library the way the CLI would take it: a log through `diagnose_text` (what
`triage diagnose LOG` does); a bundle is written as JSON under pytest's tmp dir and replayed as
`triage replay BUNDLE.json` does (try it as a snapshot, then read it as an incident bundle, then
`diagnose_bundle`). Nothing is written into the repository.

What must hold:
  * no case raises, and no case gets a confident wrong verdict (anything outside acceptable ∪ soft ∪
    {inconclusive});
  * at least 90% of the cases get an acceptable verdict;
  * for leak cases diagnosed tensor_leak, the leak site (basename:line) is an expected one in >= 90% of them.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.independent.cases import CASE_NAMES, LABELS, Case, build_cases
from triage.commands.replay import _bundle_or_none
from triage.errors import NotASnapshot
from triage.pipeline import diagnose_bundle, diagnose_snapshot, diagnose_text
from triage.snapshot.frames import FrameClassifier
from triage.snapshot.loader import DEFAULT_MAX_BYTES, load_snapshot

MIN_ACCEPTABLE_SHARE = 0.90
MIN_LEAK_SITE_SHARE = 0.90


@dataclass(frozen=True)
class Outcome:
    verdict: str | None = None
    confidence: float | None = None
    leak_site: str | None = None  # "basename:line", or None when the diagnosis has no leak site
    error: str | None = None  # the traceback, when diagnosing raised

    def describe(self) -> str:
        if self.error is not None:
            return f"raised:\n{self.error}"
        return f"verdict={self.verdict} confidence={self.confidence} leak_site={self.leak_site}"


def _site(leak_site: dict[str, Any] | None) -> str | None:
    if not leak_site:
        return None
    return f"{os.path.basename(leak_site.get('filename') or '')}:{leak_site.get('line')}"


def _replay_bundle_file(path: Path) -> Any:
    """What `triage replay PATH` does (triage/commands/replay.py: run), minus the printing."""
    classifier = FrameClassifier.with_patterns([], [])
    try:
        snapshot = load_snapshot(path, max_bytes=DEFAULT_MAX_BYTES)
    except NotASnapshot:
        bundle = _bundle_or_none(str(path), DEFAULT_MAX_BYTES)
        if bundle is None:
            raise
        return diagnose_bundle(bundle, classifier=classifier)
    return diagnose_snapshot(snapshot, classifier=classifier)


def _diagnose(case: Case, workdir: Path) -> Outcome:
    try:
        if case.kind == "log":
            assert isinstance(case.content, str)
            diagnosis, _ = diagnose_text(case.content)
        else:
            path = workdir / f"{case.name}.json"
            path.write_text(json.dumps(case.content))
            diagnosis, _ = _replay_bundle_file(path)
            path.unlink()
    except Exception:
        return Outcome(error=traceback.format_exc())
    return Outcome(diagnosis.verdict, diagnosis.confidence, _site(diagnosis.leak_site))


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    return build_cases()


@pytest.fixture(scope="module")
def outcome(cases: dict[str, Case], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Outcome]:
    """Diagnose a case by name, once per module (the per-case and the aggregate tests share the results)."""
    workdir = tmp_path_factory.mktemp("independent-bundles")
    memo: dict[str, Outcome] = {}

    def get(name: str) -> Outcome:
        if name not in memo:
            memo[name] = _diagnose(cases[name], workdir)
        return memo[name]

    return get


def test_set_is_complete(cases: dict[str, Case]) -> None:
    assert list(cases) == CASE_NAMES
    kinds = [c.kind for c in cases.values()]
    assert (kinds.count("log"), kinds.count("bundle")) == (38, 35), "the labelled set changed size"
    for case in cases.values():
        assert case.acceptable, f"{case.name}: no acceptable verdict"
        if case.kind == "bundle":
            assert isinstance(case.content, dict)
            assert case.content.get("schema") == "oom-triage/incident@1", case.name


@pytest.mark.parametrize("name", CASE_NAMES)
def test_never_confidently_wrong(name: str, outcome: Callable[[str], Outcome]) -> None:
    label = LABELS[name]
    got = outcome(name)
    assert got.error is None, f"{name} ({label.kind}): diagnosing raised:\n{got.error}"
    allowed = {*label.acceptable, *label.soft, "inconclusive"}
    assert got.verdict in allowed, (
        f"{name}: confident wrong verdict {got.verdict!r} (confidence {got.confidence}); "
        f"acceptable {list(label.acceptable)}, soft {list(label.soft)}. Ground truth: {label.why}"
    )


def test_acceptable_share(outcome: Callable[[str], Outcome]) -> None:
    misses = {
        name: outcome(name) for name in CASE_NAMES if outcome(name).verdict not in LABELS[name].acceptable
    }
    share = 1 - len(misses) / len(CASE_NAMES)
    detail = "\n".join(
        f"  {name}: {got.describe()}; acceptable {list(LABELS[name].acceptable)} -- {LABELS[name].why}"
        for name, got in misses.items()
    )
    assert share >= MIN_ACCEPTABLE_SHARE, (
        f"only {len(CASE_NAMES) - len(misses)}/{len(CASE_NAMES)} ({share:.0%}) cases got an acceptable verdict "
        f"(need {MIN_ACCEPTABLE_SHARE:.0%}); not acceptable:\n{detail}"
    )


def test_leak_site_share(outcome: Callable[[str], Outcome]) -> None:
    judged: dict[str, Outcome] = {}
    for name in CASE_NAMES:
        label = LABELS[name]
        if label.leak_sites is not None and outcome(name).verdict == "tensor_leak":
            judged[name] = outcome(name)
    assert judged, "no leak case was diagnosed tensor_leak"
    wrong = {
        name: got for name, got in judged.items() if got.leak_site not in (LABELS[name].leak_sites or ())
    }
    share = 1 - len(wrong) / len(judged)
    detail = "\n".join(
        f"  {name}: leak_site {got.leak_site}, expected one of {list(LABELS[name].leak_sites or ())}"
        for name, got in wrong.items()
    )
    assert share >= MIN_LEAK_SITE_SHARE, (
        f"the leak site is right in only {len(judged) - len(wrong)}/{len(judged)} ({share:.0%}) of the leak cases "
        f"diagnosed tensor_leak (need {MIN_LEAK_SITE_SHARE:.0%}); wrong:\n{detail}"
    )
