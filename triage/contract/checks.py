"""The contract checks shared by the manifest gate, the pod audit and the OOM-ticket evidence.

Each function takes facts already read (nothing here does I/O) and returns `Check`s whose sentences
carry the numbers, so the same fact reads the same way in `triage audit` and on a ticket.
"""

from __future__ import annotations

from dataclasses import dataclass

from triage.contract.model import Check, Contract, Status
from triage.contract.quantity import fmt_bytes, fmt_number, fmt_percent, fmt_quantity, millicores_to_cores

SHM = "shm_exhausted"
HOST_MEMORY = "host_memory_limit"


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11]; ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            first, last = int(lo), int(hi)
            if first > last or first < 0:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(first, last + 1))
        else:
            cpu = int(part)
            if cpu < 0:
                raise ValueError(f"bad CPU {part!r}")
            cpus.add(cpu)
    return sorted(cpus)


def fmt_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] → `0-3,8`."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _cpus(millicores: int) -> str:
    n = millicores_to_cores(millicores)
    return f"{fmt_number(n)} CPU" + ("" if n == 1 else "s")


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def shm_size_check(
    contract: Contract,
    subject: str,
    size_bytes: int | None,
    memory_limit_bytes: int | None,
    *,
    size_label: str,
    cap_label: str,
    fix: str,
) -> Check:
    """Effective /dev/shm (the tmpfs size, capped by the memory limit its pages count against) vs floor/SLA.

    `size_bytes` None means the size is not bounded by the volume (manifest: no sizeLimit);
    `size_label` and `cap_label` name the two numbers in the sentence.
    """
    terms = contract.shm
    sla, floor = fmt_bytes(terms.sla_bytes), fmt_bytes(terms.floor_bytes)
    if size_bytes is None and memory_limit_bytes is None:
        return Check(
            id="shm.size",
            status="warn",
            subject=subject,
            sentence=(
                f"/dev/shm has no {size_label} and the pod no memory limit: it is sized to the node's "
                f"allocatable memory, so the contract floor of {floor} (SLA {sla}) is not guaranteed"
            ),
            fix=fix,
            value=None,
            threshold=terms.floor_bytes,
            related_verdict=SHM,
        )
    detail = ""
    if size_bytes is None:
        assert memory_limit_bytes is not None
        effective = memory_limit_bytes
        detail = f" (no {size_label}: sized to the {cap_label} of {fmt_bytes(memory_limit_bytes)})"
    elif memory_limit_bytes is not None and memory_limit_bytes < size_bytes:
        effective = memory_limit_bytes
        detail = (
            f" (its {size_label} is {fmt_bytes(size_bytes)}, but its pages count against the "
            f"{cap_label} of {fmt_bytes(memory_limit_bytes)})"
        )
    else:
        effective = size_bytes
    head = f"/dev/shm is {fmt_bytes(effective)}{detail}"
    status: Status
    if effective < terms.floor_bytes:
        status, sentence = "fail", f"{head}, below the contract floor of {floor} (SLA {sla})"
    elif effective < terms.sla_bytes:
        status, sentence = (
            "warn",
            f"{head}: meets the contract floor of {floor} but is below the SLA of {sla}",
        )
    else:
        status, sentence = "pass", f"{head}: meets the SLA of {sla}"
    return Check(
        id="shm.size",
        status=status,
        subject=subject,
        sentence=sentence,
        fix=None if status == "pass" else fix,
        value=effective,
        threshold=terms.floor_bytes if status == "fail" else terms.sla_bytes,
        related_verdict=SHM,
    )


def no_shm_mount_check(contract: Contract, subject: str, fix: str) -> Check:
    """Nothing mounted at /dev/shm: the runtime's 64 MiB default applies."""
    return Check(
        "shm.medium",
        "fail",
        subject,
        f"nothing is mounted at /dev/shm: the container runtime's default is "
        f"{fmt_bytes(contract.shm.runtime_default_bytes)}, below the contract floor of "
        f"{fmt_bytes(contract.shm.floor_bytes)}",
        fix=fix,
        value=contract.shm.runtime_default_bytes,
        threshold=contract.shm.floor_bytes,
        related_verdict=SHM,
    )


def shm_usage_check(contract: Contract, subject: str, total_bytes: int, used_bytes: int) -> Check:
    """How full /dev/shm is now (pod audit, OOM evidence)."""
    fraction = used_bytes / total_bytes if total_bytes > 0 else 1.0
    limit = contract.shm.usage_warn
    head = f"/dev/shm holds {fmt_bytes(used_bytes)} of {fmt_bytes(total_bytes)} ({fmt_percent(fraction)})"
    if fraction >= limit:
        return Check(
            id="shm.usage",
            status="warn",
            subject=subject,
            sentence=f"{head}, at or above the contract's warning level of {fmt_percent(limit)}",
            fix="find what fills /dev/shm (DataLoader workers × prefetch_factor × batch size, leaked segments) "
            "or enlarge it",
            value=round(fraction, 4),
            threshold=limit,
            related_verdict=SHM,
        )
    return Check(
        id="shm.usage",
        status="pass",
        subject=subject,
        sentence=f"{head}, below the contract's warning level of {fmt_percent(limit)}",
        value=round(fraction, 4),
        threshold=limit,
        related_verdict=SHM,
    )


def cpu_per_gpu_check(
    contract: Contract, subject: str, cpu_millicores: int, gpus: int, *, verb: str
) -> Check:
    """CPU cores per GPU vs the contract minimum. `verb`: "requested" (manifest) or "available" (pod)."""
    per_gpu = contract.cpu.min_per_gpu
    have = millicores_to_cores(cpu_millicores)
    if gpus == 0:
        return Check(
            id="cpu.per_gpu",
            status="pass",
            subject=subject,
            sentence=f"{_cpus(cpu_millicores)} {verb}, no GPU: the CPU-per-GPU rule does not apply",
            value=have,
            threshold=0,
        )
    need_milli = round(gpus * per_gpu * 1000)
    need = millicores_to_cores(need_milli)
    ratio = fmt_number(round(cpu_millicores / 1000 / gpus, 2))
    head = f"{_cpus(cpu_millicores)} {verb} for {_gpus(gpus)} ({ratio} per GPU)"
    rule = f"the contract's {fmt_number(per_gpu)} per GPU"
    if cpu_millicores >= need_milli:
        return Check(
            id="cpu.per_gpu",
            status="pass",
            subject=subject,
            sentence=f"{head}: meets {rule}",
            value=have,
            threshold=need,
        )
    return Check(
        id="cpu.per_gpu",
        status="fail",
        subject=subject,
        sentence=f"{head}, below {rule} ({_cpus(need_milli)})",
        fix=f"request at least {fmt_number(need)} CPUs ({fmt_number(per_gpu)} per GPU)",
        value=have,
        threshold=need,
    )


def dataloader_check(
    contract: Contract,
    subject: str,
    workers: int,
    cpu_millicores: int | None,
    gpus: int | None,
    *,
    source: str,
) -> Check:
    """DataLoader `num_workers` vs the contract minimum and the CPUs each GPU's trainer gets."""
    head = f"num_workers={workers}{f' ({source})' if source else ''}"
    minimum = contract.dataloader.min_workers
    if workers < minimum:
        return Check(
            id="dataloader.workers",
            status="warn",
            subject=subject,
            sentence=f"{head}, below the contract's {minimum}: batches are loaded in the training process, "
            "which stalls the GPU",
            fix=f"set num_workers to at least {minimum}",
            value=workers,
            threshold=minimum,
        )
    if cpu_millicores is None or gpus is None:
        return Check(
            id="dataloader.workers",
            status="pass",
            subject=subject,
            sentence=f"{head}: at least the contract's {minimum} (CPUs per GPU unknown)",
            value=workers,
            threshold=minimum,
        )
    ranks = max(gpus, 1)
    per_rank_milli = cpu_millicores // ranks
    max_workers = max(per_rank_milli // 1000 - 1, 0)
    processes = workers + 1
    unit = "GPU" if gpus else "trainer"
    head = (
        f"{head}: {processes} processes per {unit} ({workers} workers + the trainer) "
        f"on {fmt_number(round(cpu_millicores / 1000 / ranks, 2))} CPUs per {unit}"
    )
    if processes * 1000 > per_rank_milli:
        return Check(
            id="dataloader.workers",
            status="warn",
            subject=subject,
            sentence=f"{head}: the workers compete for CPUs",
            fix=f"lower num_workers to {max_workers} or request {processes * ranks} CPUs",
            value=workers,
            threshold=max_workers,
        )
    return Check(
        id="dataloader.workers",
        status="pass",
        subject=subject,
        sentence=f"{head}: every process has a CPU",
        value=workers,
        threshold=max_workers,
    )


@dataclass(frozen=True)
class GpuNuma:
    """One visible GPU and its NUMA node as read from sysfs (None: could not be read)."""

    index: int | None
    pci_bus_id: str
    numa_node: int | None
    node_cpus: list[int] | None
    note: str | None = None  # why numa_node/node_cpus is missing

    def label(self) -> str:
        return f"GPU {self.index} ({self.pci_bus_id})" if self.index is not None else f"GPU {self.pci_bus_id}"


_NUMA_FIX = (
    "pin the CPUs to the GPU's NUMA node: Guaranteed QoS with whole CPUs under the kubelet's static CPU "
    "manager and topology manager (single-numa-node), or bind the DataLoader workers with numactl/taskset"
)


def numa_check(subject: str, gpu: GpuNuma, allowed: list[int] | None) -> Check:
    """Whether the CPUs this process may run on are on the NUMA node of `gpu`."""
    label = gpu.label()
    if gpu.numa_node is None or (gpu.numa_node >= 0 and gpu.node_cpus is None) or allowed is None:
        why = gpu.note or ("CPU affinity unknown" if allowed is None else "sysfs has no NUMA data")
        return Check(
            id="numa.gpu_node",
            status="warn",
            subject=label,
            sentence=f"cannot read the NUMA node of {label}: {why}",
            fix=None,
            value=None,
            threshold=None,
        )
    allowed_text = fmt_cpulist(allowed)
    if gpu.numa_node < 0:
        return Check(
            id="numa.gpu_node",
            status="pass",
            subject=label,
            sentence=f"{label} reports no NUMA node (numa_node -1: a single-node host); CPUs {allowed_text}",
            value=allowed_text,
            threshold=None,
        )
    assert gpu.node_cpus is not None
    node = set(gpu.node_cpus)
    node_text = fmt_cpulist(gpu.node_cpus)
    mine = set(allowed)
    local = mine & node
    where = f"{label} is on NUMA node {gpu.numa_node} (CPUs {node_text})"
    if mine <= node:
        status: Status = "pass"
        sentence = f"{where}; the process may run only on CPUs {allowed_text}, all on that node"
    elif not local:
        status = "fail"
        sentence = (
            f"{where}, but the process may run only on CPUs {allowed_text}, all on other nodes: every "
            "host-to-device copy crosses the socket interconnect"
        )
    else:
        status = "warn"
        sentence = (
            f"{where}; the process may run on CPUs {allowed_text}, of which {len(local)} are on that node: "
            "DataLoader workers are not pinned and can land on a remote node"
        )
    return Check(
        id="numa.gpu_node",
        status=status,
        subject=label,
        sentence=sentence,
        fix=None if status == "pass" else _NUMA_FIX,
        value=allowed_text,
        threshold=node_text,
    )


def numa_unavailable_check(reason: str) -> Check:
    return Check(
        id="numa.gpu_node",
        status="warn",
        subject="pod",
        sentence=f"cannot read GPU NUMA node ({reason})",
        fix="run the audit where NVML (pynvml) is importable, or name the GPUs with --gpu-pci-bus-id",
    )


@dataclass
class PodFacts:
    """What a running pod (pod audit) or an incident bundle (ticket evidence) says about its resources.

    None means "not known" everywhere, except `memory_limit_bytes`, where None with
    `memory_limit_known` means the pod has no memory limit.
    """

    shm_total_bytes: int | None = None
    shm_used_bytes: int | None = None
    shm_medium: str | None = None  # k8s: "Memory", "" (node disk) or "none" (nothing mounted at /dev/shm)
    shm_size_limit_bytes: int | None = None  # k8s emptyDir sizeLimit
    cpu_count: int | None = None
    cpu_affinity: list[int] | None = None
    cpu_quota_millicores: int | None = None
    cpu_request_millicores: int | None = None
    gpu_count: int | None = None
    gpus_numa: list[GpuNuma] | None = None
    numa_unavailable: str | None = None
    memory_limit_known: bool = False
    memory_limit_bytes: int | None = None
    memory_usage_bytes: int | None = None
    oom_kill_count: int | None = None
    dataloader_workers: int | None = None

    def effective_cpu_millicores(self) -> int | None:
        """The CPUs the pod's processes can use: affinity (or CPU count), capped by the CFS quota."""
        if self.cpu_affinity:
            cpus: int | None = len(self.cpu_affinity) * 1000
        elif self.cpu_count:
            cpus = self.cpu_count * 1000
        else:
            cpus = self.cpu_request_millicores
        if cpus is not None and self.cpu_quota_millicores is not None:
            cpus = min(cpus, self.cpu_quota_millicores)
        return cpus


_POD_SHM_FIX = "give the pod a memory-backed /dev/shm: an emptyDir with medium: Memory and sizeLimit {sla}"


def evaluate_pod(facts: PodFacts, contract: Contract, subject: str = "pod") -> list[Check]:
    """Every contract check the facts allow, in a fixed order."""
    checks: list[Check] = []
    shm_fix = _POD_SHM_FIX.format(sla=fmt_quantity(contract.shm.sla_bytes))
    medium = facts.shm_medium
    if medium is not None:
        if medium == "Memory":
            checks.append(
                Check(
                    "shm.medium", "pass", subject, "/dev/shm is a memory-backed emptyDir", related_verdict=SHM
                )
            )
        elif medium == "none":
            checks.append(no_shm_mount_check(contract, subject, shm_fix))
        else:
            checks.append(
                Check(
                    "shm.medium",
                    "fail",
                    subject,
                    "/dev/shm is a disk-backed emptyDir (medium not Memory): shared-memory batches go "
                    "through the node's disk",
                    fix=shm_fix,
                    value=medium,
                    threshold="Memory",
                    related_verdict=SHM,
                )
            )
    size = facts.shm_total_bytes
    if size is None and medium == "Memory":
        size = facts.shm_size_limit_bytes
    if size is None and medium == "none":
        size = contract.shm.runtime_default_bytes
    if size is not None:
        checks.append(
            shm_size_check(
                contract,
                subject,
                size,
                facts.memory_limit_bytes,
                size_label="tmpfs size",
                cap_label="memory limit",
                fix=shm_fix,
            )
        )
    if facts.shm_total_bytes is not None and facts.shm_used_bytes is not None:
        checks.append(shm_usage_check(contract, subject, facts.shm_total_bytes, facts.shm_used_bytes))
    cpus = facts.effective_cpu_millicores()
    if cpus is not None and facts.gpu_count is not None:
        checks.append(cpu_per_gpu_check(contract, subject, cpus, facts.gpu_count, verb="available"))
    if contract.dataloader.numa_pinning:
        if facts.gpus_numa is not None:
            checks.extend(numa_check(subject, gpu, facts.cpu_affinity) for gpu in facts.gpus_numa)
        elif facts.numa_unavailable is not None:
            checks.append(numa_unavailable_check(facts.numa_unavailable))
    if facts.memory_limit_known:
        checks.append(
            memory_limit_check(contract, subject, facts.memory_limit_bytes, facts.memory_usage_bytes)
        )
    if facts.oom_kill_count is not None:
        kills = facts.oom_kill_count
        checks.append(
            Check(
                "memory.oom_kills",
                "warn" if kills else "pass",
                subject,
                f"the memory cgroup has recorded {kills} OOM kill{'' if kills == 1 else 's'}",
                fix="raise the memory limit or lower host memory use (DataLoader workers, pinned buffers)"
                if kills
                else None,
                value=kills,
                threshold=0,
                related_verdict=HOST_MEMORY,
            )
        )
    if facts.dataloader_workers is not None:
        checks.append(
            dataloader_check(
                contract,
                subject,
                facts.dataloader_workers,
                cpus,
                facts.gpu_count,
                source="DataLoader workers",
            )
        )
    return checks


def memory_limit_check(contract: Contract, subject: str, limit: int | None, usage: int | None) -> Check:
    """The cgroup memory limit of a running pod."""
    if limit is None:
        return Check(
            "memory.limit",
            "fail" if contract.memory.require_limit else "pass",
            subject,
            "the container's memory cgroup has no limit: a host-memory blow-up takes the node's memory, "
            "and the kernel OOM killer picks the victim",
            fix="set resources.limits.memory on every container" if contract.memory.require_limit else None,
            value=None,
            threshold=None,
            related_verdict=HOST_MEMORY,
        )
    used = f", {fmt_bytes(usage)} in use ({fmt_percent(usage / limit)})" if usage is not None else ""
    return Check(
        "memory.limit",
        "pass",
        subject,
        f"memory cgroup limit {fmt_bytes(limit)}{used}",
        value=limit,
        threshold=None,
        related_verdict=HOST_MEMORY,
    )
