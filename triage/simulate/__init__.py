"""Simulated CUDA caching-allocator runs with ground-truth labels (fixtures, demos, benchmarks).

- :mod:`triage.simulate.allocator`: a model of torch's CUDACachingAllocator that writes torch-format
  snapshots, trace entries, ``memory_stats()`` and OOM messages;
- :mod:`triage.simulate.scenarios`: training-loop scenarios (healthy runs, leaks, batches that do not
  fit, fragmentation, neighbours, quotas, host-side incidents, hard negatives) with their truth;
- :mod:`triage.simulate.cli`: ``triage simulate``.

Standard library only (no torch): ``random.Random(seed)`` makes every run reproducible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triage.simulate.allocator import CachingAllocator, SimulatedOOM, format_size, oom_message
    from triage.simulate.scenarios import (
        ScenarioResult,
        labelled_set,
        large_trace_snapshot,
        run_scenario,
        scenario_names,
    )

_WHERE = {
    "CachingAllocator": "allocator",
    "SimulatedOOM": "allocator",
    "format_size": "allocator",
    "oom_message": "allocator",
    "ScenarioResult": "scenarios",
    "labelled_set": "scenarios",
    "large_trace_snapshot": "scenarios",
    "run_scenario": "scenarios",
    "scenario_names": "scenarios",
}


def __getattr__(name: str) -> Any:
    """Import lazily: the CLI imports ``triage.simulate.cli`` to build its parser on every command."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'triage.simulate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"triage.simulate.{where}"), name)


__all__ = [
    "CachingAllocator",
    "ScenarioResult",
    "SimulatedOOM",
    "format_size",
    "labelled_set",
    "large_trace_snapshot",
    "oom_message",
    "run_scenario",
    "scenario_names",
]
