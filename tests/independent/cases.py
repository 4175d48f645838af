"""The independent labelled set, in memory: name -> Case (a log's text, or an incident bundle dict).

Names and labels are known at import (cheap, for test ids); `build_cases()` runs the allocator model to
produce the bundles (seconds), so call it once per test module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tests.independent import bundles_def, logs_def


@dataclass(frozen=True)
class Label:
    kind: Literal["log", "bundle"]
    acceptable: tuple[str, ...]  # the correct verdicts
    soft: tuple[str, ...]  # defensible but weaker verdicts (e.g. inconclusive where a human would decide)
    why: str
    # for leak bundles: the acceptable leak sites as "basename:line" (None = no stacks, leak_site must be null)
    leak_sites: tuple[str | None, ...] | None = None


@dataclass(frozen=True)
class Case:
    name: str
    label: Label
    content: str | dict[str, Any]  # the log text, or the bundle dict

    @property
    def kind(self) -> str:
        return self.label.kind

    @property
    def acceptable(self) -> tuple[str, ...]:
        return self.label.acceptable

    @property
    def soft(self) -> tuple[str, ...]:
        return self.label.soft

    @property
    def leak_sites(self) -> tuple[str | None, ...] | None:
        return self.label.leak_sites


def _labels() -> dict[str, Label]:
    labels: dict[str, Label] = {}
    for name, (_text, acc, soft, why) in logs_def.LOGS.items():
        labels[name] = Label("log", tuple(acc), tuple(soft), why)
    for name, (_build, acc, soft, why, leak_sites) in bundles_def.BUNDLES.items():
        assert name not in labels, name
        sites = None if leak_sites is None else tuple(leak_sites)
        labels[name] = Label("bundle", tuple(acc), tuple(soft), why, sites)
    return labels


LABELS: dict[str, Label] = _labels()
CASE_NAMES: list[str] = list(LABELS)


def build_cases() -> dict[str, Case]:
    """Every case with its content, built fresh (deterministic: same bytes on every call)."""
    cases: dict[str, Case] = {}
    for name, (text, *_rest) in logs_def.LOGS.items():
        cases[name] = Case(name, LABELS[name], text)
    for name, (build, *_rest) in bundles_def.BUNDLES.items():
        cases[name] = Case(name, LABELS[name], build())
    return cases
