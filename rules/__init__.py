"""The verdict rules, one file each. ``RULES`` is the ordered, validated list the engine runs."""

from __future__ import annotations

import importlib

from rules.base import (
    CANDIDATE,
    LIKELY,
    POSSIBLE,
    STRONG,
    Finding,
    Rule,
    RuleDefinitionError,
    rule_from_module,
)

RULE_MODULES = (
    "rules.tensor_leak",
    "rules.workload_too_large",
    "rules.fragmentation",
    "rules.other_process",
    "rules.gpu_quota",
    "rules.shm_exhausted",
    "rules.host_memory_limit",
)


def load_rules() -> list[Rule]:
    return [rule_from_module(importlib.import_module(m)) for m in RULE_MODULES]


__all__ = [
    "CANDIDATE",
    "LIKELY",
    "POSSIBLE",
    "RULE_MODULES",
    "STRONG",
    "Finding",
    "Rule",
    "RuleDefinitionError",
    "load_rules",
]
