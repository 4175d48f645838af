"""What a rule is: metadata validated when the rule loads, and the Finding it returns.

A rule module defines ``ID``, ``VERDICT``, ``OWNER``, a docstring that *is* its documentation (the
allocator behaviour it relies on), and ``evaluate(evidence) -> Finding | None``. Rules only read the
Evidence: no I/O, no clock, no randomness.

Scores: ``score`` is how strongly the facts support the verdict, 0..1. A rule that cannot rule its
verdict out but has nothing for it returns a low score (a *candidate*, < 0.35); it returns None when
the facts exclude its verdict. The engine decides between findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triage.evidence import Evidence

CANDIDATE = 0.25  # cannot be ruled out, nothing for it
POSSIBLE = 0.45  # some support, not enough alone
LEAD = POSSIBLE + 0.1  # when the input cannot decide: the first candidate, never the verdict
LIKELY = 0.7
STRONG = 0.85

# thresholds two rules read the same way
UNLIKE_EARLIER = 1.25  # a step that wants this much more than every earlier step's peak is a new demand
BEYOND_USABLE = (
    1.05  # a step aligned with the one before it that would need this much more than the job may hold
)
MIN_WASTE_FRACTION = 0.05  # cached free memory below this share of what the job may hold decides nothing


@dataclass
class Finding:
    rule: str
    verdict: str
    score: float
    facts: list[str] = field(default_factory=list)  # human sentences with the numbers
    values: dict[str, Any] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # evidence that would decide
    leak_site: dict[str, Any] | None = None
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        self.score = max(0.0, min(1.0, self.score))


@dataclass(frozen=True)
class Rule:
    id: str
    verdict: str
    owner: str
    doc: str
    evaluate: Callable[[Evidence], Finding | None]


class RuleDefinitionError(Exception):
    """A rule module lacks its metadata or documentation."""


def rule_from_module(module: ModuleType) -> Rule:
    from triage.diagnosis import OWNER_OF, VERDICTS

    name = module.__name__
    rid = getattr(module, "ID", None)
    verdict = getattr(module, "VERDICT", None)
    owner = getattr(module, "OWNER", None)
    doc = (module.__doc__ or "").strip()
    fn = getattr(module, "evaluate", None)
    if not isinstance(rid, str) or not rid:
        raise RuleDefinitionError(f"{name}: ID missing")
    if verdict not in VERDICTS or verdict == "inconclusive":
        raise RuleDefinitionError(f"{name}: VERDICT {verdict!r} is not a verdict")
    if not isinstance(owner, str) or owner != OWNER_OF[verdict]:
        raise RuleDefinitionError(
            f"{name}: OWNER {owner!r} is not the owner of {verdict} ({OWNER_OF[verdict]})"
        )
    if len(doc) < 80:
        raise RuleDefinitionError(
            f"{name}: the docstring must document the allocator behaviour the rule relies on"
        )
    if not callable(fn):
        raise RuleDefinitionError(f"{name}: evaluate(evidence) missing")
    return Rule(rid, verdict, owner, doc, fn)
