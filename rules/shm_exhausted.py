"""shm_exhausted: DataLoader workers ran out of shared memory (/dev/shm), not GPU memory.

Behaviour relied on: DataLoader worker processes hand batches to the main process through shared
memory files under /dev/shm (``/torch_<pid>_<n>``). Docker and Kubernetes give a container a 64 MiB
/dev/shm unless a Memory-backed emptyDir is mounted there; a few batches of images fill it. The
failure shows as "unable to write to file </torch_…>", "No space left on device (28)", or a worker
"killed by signal: Bus error" — never as a CUDA OOM. A /dev/shm at or near the 64 MiB default, or
below the platform contract's floor, strengthens the verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rules.base import CANDIDATE, LIKELY, STRONG, Finding
from triage.units import MiB, human

if TYPE_CHECKING:
    from triage.evidence import Evidence

ID = "shm_exhausted"
VERDICT = "shm_exhausted"
OWNER = "platform"

DEFAULT_SHM = 64 * MiB
BUS_ERRORS = frozenset({"shm-bus-error", "shm-worker-bus-error"})
# where a DataLoader worker writes into shared memory: the collate function's shared storage, torch's
# storage and multiprocessing code
SHARED_MEMORY_CODE = (
    "torch/utils/data/_utils/collate.py",
    "torch/storage.py",
    "torch/multiprocessing/",
    "torch/_utils.py",
)
ENOMEM = "12"


def evaluate(ev: Evidence) -> Finding | None:
    # after a CUDA OOM that ended the job, shm lines are its workers dying with it (or an earlier error the
    # job went on after): a later shm failure that ended the job makes the incident's kind shm_exhausted
    shm_msgs = [m for m in ev.messages if m.kind == "shm_exhausted"] if not ev.is_cuda_oom else []
    f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    if ev.kind == "shm_exhausted" or shm_msgs:
        f.score = STRONG
        if shm_msgs:
            f.facts.append(f"The job failed with a shared-memory error: {shm_msgs[0].text.strip()[:200]}")
    elif ev.kind in ("crash", "unknown") and ev.dead_workers_sigbus:
        f.score = LIKELY + 0.05
        f.facts.append(f"{ev.dead_workers_sigbus} DataLoader worker(s) died of SIGBUS: a full /dev/shm.")
    elif (
        ev.kind in ("crash", "unknown")
        and ev.shm_total_bytes
        and ev.shm_used_bytes is not None
        and ev.shm_used_bytes >= 0.9 * ev.shm_total_bytes
    ):
        f.score = LIKELY - 0.1
        f.facts.append("/dev/shm was at least 90% full when the job crashed.")
    else:
        return None
    said = [m for m in ev.messages if m.kind == "shm_exhausted"]
    full = (
        ev.shm_total_bytes is not None
        and ev.shm_used_bytes is not None
        and ev.shm_used_bytes >= 0.9 * ev.shm_total_bytes
    )
    if (
        said
        and all(m.format == "shm-unable-to-mmap" and m.extra.get("errno") == ENOMEM for m in said)
        and not full
        and not ev.dead_workers_sigbus
    ):
        # mapping a file under /dev/shm takes no room in it: ENOMEM there is the process's count of
        # mappings (vm.max_map_count) or its address space running out; a full /dev/shm fails the writer
        # (ENOSPC, or a bus error when a page is touched)
        f.facts.append(
            "Mapping a shared-memory file failed with ENOMEM (12), not ENOSPC: the process ran out of memory "
            "mappings (vm.max_map_count) or address space, which a full /dev/shm does not cause."
        )
        f.score = min(f.score, CANDIDATE)
        f.actions.append(
            "Raise vm.max_map_count on the node, or lower DataLoader num_workers, or set the sharing strategy "
            "to file_system (torch.multiprocessing.set_sharing_strategy)."
        )
    fault = ev.bus_error_frame
    if (
        said
        and fault is not None
        and all(m.format in BUS_ERRORS for m in said)
        and not full
        and not any(w in fault[0].replace("\\", "/") for w in SHARED_MEMORY_CODE)
    ):
        # a full /dev/shm faults the worker where it writes a batch into a shared-memory file (the collate
        # function's shared storage); a fault elsewhere is a memory-mapped file that could not be read
        f.facts.append(
            f"The worker faulted in {fault[0].rsplit('/', 1)[-1]}:{fault[1]} ({fault[2]}), not where a batch is "
            "written to shared memory: a memory-mapped file that could not be read (truncated, or a network "
            "filesystem's I/O error) raises the same SIGBUS."
        )
        f.score = min(f.score, CANDIDATE)
        f.missing.append("/dev/shm's usage at the crash (df /dev/shm), and the filesystem's errors (dmesg)")
    if ev.shm_total_bytes is not None:
        used = f", {human(ev.shm_used_bytes)} in use" if ev.shm_used_bytes is not None else ""
        f.facts.append(f"/dev/shm is {human(ev.shm_total_bytes)}{used}.")
        f.values["shm_total_bytes"] = ev.shm_total_bytes
        if ev.shm_total_bytes <= DEFAULT_SHM:
            f.facts.append(
                "That is the container runtime's 64 MiB default: no Memory-backed volume is mounted at /dev/shm."
            )
            f.score = min(1.0, f.score + 0.1)
    for v in ev.contract_violations:
        if getattr(v, "related_verdict", None) == VERDICT:
            f.facts.append(str(getattr(v, "sentence", v)))
            f.score = min(1.0, f.score + 0.05)
    if ev.dataloader_workers:
        f.values["dataloader_workers"] = ev.dataloader_workers
    f.actions.append(
        "Mount a Memory-backed emptyDir at /dev/shm in the pod (volumes: emptyDir {medium: Memory, sizeLimit: 16Gi} or more)."
    )
    f.actions.append(
        "Or lower DataLoader num_workers / prefetch_factor, or set the sharing strategy to file_system."
    )
    return f
