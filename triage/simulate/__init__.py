"""Simulated CUDA caching-allocator runs with ground-truth labels (fixtures, demos, benchmarks).

- :mod:`triage.simulate.allocator`: a model of torch's CUDACachingAllocator that writes torch-format
  snapshots, trace entries, ``memory_stats()`` and OOM messages;
- :mod:`triage.simulate.scenarios`: training-loop scenarios (healthy runs, leaks, batches that do not
  fit, fragmentation, neighbours, quotas, host-side incidents, hard negatives) with their truth;
- :mod:`triage.simulate.cli`: ``triage simulate``.

Standard library only (no torch): ``random.Random(seed)`` makes every run reproducible.
"""

from __future__ import annotations

from triage.simulate.allocator import CachingAllocator, SimulatedOOM, format_size, oom_message
from triage.simulate.scenarios import (
    ScenarioResult,
    labelled_set,
    large_trace_snapshot,
    run_scenario,
    scenario_names,
)

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
