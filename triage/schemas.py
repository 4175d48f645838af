"""The incident bundle, wire format v1 (``oom-triage/incident@1``): the one definition in code.

docs/bundle.md describes it in prose; these pydantic models are what the service validates a POST
against, what ``triage simulate --bundle`` writes and what the collector's tests check its plain dicts
with. Rules of the format:

- only ``schema``, ``incident_id``, ``occurred_at`` and ``kind`` are required; every other field may be
  absent or null, because the diagnosis works with whatever arrived;
- unknown keys are kept (``extra="allow"``) and ignored, at every level, so a newer collector can talk
  to an older service;
- byte counts are integers (never negative);
- ``snapshot`` is the ``torch.cuda.memory._snapshot()`` dict as JSON, validated here only as "a dict":
  the service checks it with the snapshot loader, which knows every era of the format.

The collector never imports this module (it runs with the standard library and torch only).
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, NonNegativeInt

SCHEMA_ID = "oom-triage/incident@1"
KINDS = ("cuda_oom", "shm_exhausted", "host_oom", "crash")

Kind = Literal["cuda_oom", "shm_exhausted", "host_oom", "crash"]
Bytes = NonNegativeInt


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class Error(_Part):
    """The exception that ended (or would have ended) the process."""

    type: str | None = None  # "torch.OutOfMemoryError", "RuntimeError", …
    message: str | None = None  # the full exception text
    traceback: str | None = None  # formatted as Python prints it, chained exceptions included
    exit_code: int | None = None  # the exit status the process has/had, when known (1: uncaught)
    thread: str | None = None  # the thread's name when it was not the main thread


class Workload(_Part):
    """Who crashed: Kubernetes identity, distributed ranks, training progress, processes."""

    namespace: str | None = None
    pod: str | None = None
    node: str | None = None
    container: str | None = None
    hostname: str | None = None
    job: str | None = None
    owner_kind: str | None = None
    owner_name: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    team: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    restart_count: int | None = None
    step: int | None = None
    batch_size: int | None = None
    pid: int | None = None
    pids: list[int] | None = None


class GpuProcess(_Part):
    """One compute process NVML reports on the device (any container's, as NVML sees pids)."""

    pid: int | None = None
    used_bytes: Bytes | None = None
    name: str | None = None


class Device(_Part):
    index: int | None = None  # inside the process (relative to CUDA_VISIBLE_DEVICES)
    name: str | None = None
    uuid: str | None = None
    total_bytes: Bytes | None = None
    free_bytes: Bytes | None = None
    declared_total_bytes: Bytes | None = None
    mig_mode: bool | None = None
    mig_profile: str | None = None
    processes: list[GpuProcess] | None = None


class OomObservation(_Part):
    """The four ints torch's OOM observer was called with (the first call for this OOM)."""

    device: int | None = None
    alloc_size: Bytes | None = None  # the segment size being requested, not the tensor size
    device_total_or_cap: Bytes | None = None  # the device total, or the fraction cap when one is set
    device_free: Bytes | None = None


class FractionSetBy(_Part):
    """The ``set_per_process_memory_fraction`` call in effect: its arguments and its caller."""

    fraction: float | None = None
    device: int | None = None
    filename: str | None = None
    line: int | None = None
    function: str | None = None


class Allocator(_Part):
    memory_stats: dict[str, int | float] | None = None
    settings: dict[str, Any] | None = None
    fraction: float | None = None
    fraction_cap_bytes: Bytes | None = None
    fraction_set_by: FractionSetBy | None = None
    observer: OomObservation | None = None


class TimelineSample(_Part):
    """One sample per optimizer step (or ``collector.step()``), oldest first."""

    step: int | None = None
    allocated_bytes: Bytes | None = None
    reserved_bytes: Bytes | None = None
    peak_allocated_bytes: Bytes | None = None
    time_us: int | None = None
    batch_size: int | None = None
    device: int | None = None  # the device sampled (the process's current device)


class Cgroup(_Part):
    version: Literal[1, 2] | None = None
    memory_limit_bytes: Bytes | None = None  # null: no limit
    memory_usage_bytes: Bytes | None = None
    oom_kill_count: NonNegativeInt | None = None


class DeadWorker(_Part):
    """A DataLoader worker that died, as the main process saw it."""

    pid: int | None = None
    exitcode: int | None = None  # negative: killed by that signal
    signal: str | None = None  # "SIGBUS" (shared memory), "SIGKILL" (the OOM killer), …


class Host(_Part):
    shm_total_bytes: Bytes | None = None
    shm_used_bytes: Bytes | None = None
    cgroup: Cgroup | None = None
    rss_bytes: Bytes | None = None
    cpu_count: int | None = None
    cpu_affinity: list[int] | None = None
    dataloader_workers: int | None = None
    dead_dataloader_workers: list[DeadWorker] | None = None


class Environment(_Part):
    CUDA_VISIBLE_DEVICES: str | None = None
    PYTORCH_CUDA_ALLOC_CONF: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    python_version: str | None = None
    RANK: str | None = None
    LOCAL_RANK: str | None = None
    WORLD_SIZE: str | None = None


class CollectorInfo(_Part):
    version: str | None = None
    history_max_entries: int | None = None  # the trace ring the collector set (null: not set by it)
    history_by_user: bool | None = None  # the job enabled the history itself; its settings were kept
    capture_ms: float | None = None  # building, encoding, compressing and spooling the bundle
    snapshot_ms: float | None = None  # of which inside torch.cuda.memory._snapshot()
    # "oom": taken inside the OOM observer (the allocator's state at the OOM); "capture": at the crash,
    # after the exception unwound the failing step (its tensors are freed, their blocks show as holes)
    snapshot_at: Literal["oom", "capture"] | None = None
    observer_calls: int | None = None  # calls of the OOM observer for this OOM (deduplicated)
    peak_scope: Literal["run", "step"] | None = None  # what timeline[].peak_allocated_bytes covers
    source: Literal["excepthook", "threading", "atexit"] | None = None  # which hook captured it
    spool: str | None = None


class IncidentBundle(_Part):
    """One incident: what the collector (or the simulator) POSTs to ``/api/v1/incidents``."""

    schema_: Literal["oom-triage/incident@1"] = Field(alias="schema")
    incident_id: UUID  # the idempotency key: the same on every retry
    occurred_at: AwareDatetime
    kind: Kind
    error: Error | None = None
    workload: Workload | None = None
    device: Device | None = None
    allocator: Allocator | None = None
    timeline: list[TimelineSample] | None = None
    host: Host | None = None
    environment: Environment | None = None
    snapshot: dict[str, Any] | None = None
    collector: CollectorInfo | None = None
