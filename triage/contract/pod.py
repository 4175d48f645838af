"""The pod audit: the resources a running pod actually has, read from the kernel, checked against the contract.

Readers take a `root` (default `/`) so tests point them at fixture trees:

- `read_shm(path)`              /dev/shm size and use (`os.statvfs`)
- `read_cgroup(root)`           memory limit/usage/OOM kills and CPU quota, cgroup v1 or v2, from
                                `<root>/proc/self/cgroup` and `<root>/sys/fs/cgroup/...`
- `read_cpus()`                 CPU count and the CPUs this process may run on (`os.sched_getaffinity`)
- `read_gpu_numa(bus_id, root)` the NUMA node of a PCI device and that node's CPUs, from sysfs
- `nvml_gpus()`                 the visible GPUs' PCI bus ids from NVML, when `pynvml` is importable

The collector has its own stdlib copy of these readers (it may not import triage); this one is the
reference the tests pin.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from triage.contract.checks import GpuNuma, PodFacts, evaluate_pod, parse_cpulist
from triage.contract.load import ContractFile
from triage.contract.model import AuditReport, Check
from triage.contract.quantity import fmt_quantity
from triage.errors import InputError

UNLIMITED = 2**60  # v1 reports "no limit" as PAGE_COUNTER_MAX × page size (9223372036854771712)
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class ShmFacts:
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class CgroupFacts:
    version: int
    path: str  # the cgroup's directory as read
    memory_limit_bytes: int | None  # None: no limit anywhere up the hierarchy
    memory_usage_bytes: int | None
    oom_kill_count: int | None
    cpu_quota_millicores: int | None  # None: no CFS quota


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str


def read_shm(path: str = "/dev/shm") -> ShmFacts | None:
    """Size and use of the filesystem at `path`; None when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    total = st.f_blocks * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return ShmFacts(total_bytes=total, used_bytes=used)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """`oom_kill 3` out of memory.events / memory.oom_control."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return _int_or_none(parts[1])
    return None


def _membership(root: Path) -> tuple[dict[str, str], str | None]:
    """v1 controller → path, and the v2 path, from <root>/proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        else:
            for controller in controllers.split(","):
                if controller:
                    v1[controller] = path
    return v1, v2


def _cgroup_dir(mount: Path, path: str) -> Path:
    """The process's cgroup under `mount`; inside a container without a cgroup namespace the host path
    is not there and the container's own cgroup is the mount root."""
    candidate = mount / path.lstrip("/")
    return candidate if candidate.is_dir() else mount


def _chain(mount: Path, directory: Path) -> list[Path]:
    """`directory` and its ancestors up to the mount root (limits are hierarchical)."""
    chain = [directory]
    while directory != mount and mount in directory.parents:
        directory = directory.parent
        chain.append(directory)
    return chain


def _min_limit(values: list[int | None]) -> int | None:
    finite = [v for v in values if v is not None and v < UNLIMITED]
    return min(finite) if finite else None


def read_cgroup(root: str | os.PathLike[str] = "/") -> CgroupFacts | None:
    """Memory limit, usage, OOM kills and CPU quota of this process's cgroup (v1 or v2); None if unreadable."""
    base = Path(root)
    v1, v2 = _membership(base)
    fs = base / "sys/fs/cgroup"
    if "memory" in v1:
        mount = fs / "memory"
        if not mount.is_dir():
            return None
        directory = _cgroup_dir(mount, v1["memory"])
        limits = [_int_or_none(_read(d / "memory.limit_in_bytes")) for d in _chain(mount, directory)]
        quota = None
        cpu_path = v1.get("cpu")
        if cpu_path is not None:
            cpu_mount = next((m for m in (fs / "cpu", fs / "cpu,cpuacct") if m.is_dir()), None)
            if cpu_mount is not None:
                cpu_dir = _cgroup_dir(cpu_mount, cpu_path)
                quota = _v1_quota(_chain(cpu_mount, cpu_dir))
        return CgroupFacts(
            version=1,
            path="/" + str(directory.relative_to(base)),
            memory_limit_bytes=_min_limit(limits),
            memory_usage_bytes=_int_or_none(_read(directory / "memory.usage_in_bytes")),
            oom_kill_count=_keyed(_read(directory / "memory.oom_control"), "oom_kill"),
            cpu_quota_millicores=quota,
        )
    if v2 is None:
        return None
    mount = fs if (fs / "cgroup.controllers").exists() else fs / "unified"
    if not (mount / "cgroup.controllers").exists():
        return None
    directory = _cgroup_dir(mount, v2)
    chain = _chain(mount, directory)
    limits = [_v2_max(_read(d / "memory.max")) for d in chain]
    quotas = [_v2_cpu(_read(d / "cpu.max")) for d in chain]
    finite_quotas = [q for q in quotas if q is not None]
    return CgroupFacts(
        version=2,
        path="/" + str(directory.relative_to(base)),
        memory_limit_bytes=_min_limit(limits),
        memory_usage_bytes=_int_or_none(_read(directory / "memory.current")),
        oom_kill_count=_keyed(_read(directory / "memory.events"), "oom_kill"),
        cpu_quota_millicores=min(finite_quotas) if finite_quotas else None,
    )


def _v2_max(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    return _int_or_none(text)


def _v2_cpu(text: str | None) -> int | None:
    """`400000 100000` → 4000 millicores; `max 100000` → None."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = _int_or_none(parts[0]), _int_or_none(parts[1])
    if quota is None or not period:
        return None
    return quota * 1000 // period


def _v1_quota(chain: list[Path]) -> int | None:
    quotas = []
    for d in chain:
        quota = _int_or_none(_read(d / "cpu.cfs_quota_us"))
        period = _int_or_none(_read(d / "cpu.cfs_period_us"))
        if quota is not None and quota > 0 and period:
            quotas.append(quota * 1000 // period)
    return min(quotas) if quotas else None


def read_cpus() -> tuple[int | None, list[int] | None]:
    """(os.cpu_count(), sorted CPUs this process may run on)."""
    try:
        affinity: list[int] | None = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = None
    return os.cpu_count(), affinity


def normalize_bus_id(bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` (or `3b:00.0`) → sysfs's `0000:3b:00.0`; ValueError if not a PCI address."""
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        raise ValueError(f"{bus_id!r} is not a PCI bus id (expected e.g. 0000:3b:00.0)")
    domain, bus, device, function = match.groups()
    domain_value = int(domain or "0", 16)
    if domain_value > 0xFFFF:
        raise ValueError(f"{bus_id!r}: PCI domain out of range")
    return f"{domain_value:04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def read_gpu_numa(bus_id: str, root: str | os.PathLike[str] = "/", index: int | None = None) -> GpuNuma:
    """The NUMA node of the PCI device `bus_id` and that node's CPUs, from `<root>/sys`."""
    base = Path(root)
    sys_id = normalize_bus_id(bus_id)
    numa_file = base / "sys/bus/pci/devices" / sys_id / "numa_node"
    node = _int_or_none(_read(numa_file))
    if node is None:
        return GpuNuma(
            index, sys_id, None, None, note=f"/sys/bus/pci/devices/{sys_id}/numa_node is not readable"
        )
    if node < 0:
        return GpuNuma(index, sys_id, node, None)
    cpulist = _read(base / f"sys/devices/system/node/node{node}/cpulist")
    try:
        cpus = parse_cpulist(cpulist) if cpulist is not None else None
    except ValueError:
        cpus = None
    note = None if cpus is not None else f"/sys/devices/system/node/node{node}/cpulist is not readable"
    return GpuNuma(index, sys_id, node, cpus, note=note)


def nvml_gpus() -> tuple[list[NvmlGpu] | None, str | None]:
    """All GPUs NVML sees, or (None, why not)."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None, "NVML unavailable"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses; any failure means "no NVML"
        return None, f"NVML unavailable: {exc}"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                NvmlGpu(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                )
            )
        return gpus, None
    except Exception as exc:
        return None, f"NVML query failed: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def visible(gpus: list[NvmlGpu], cuda_visible_devices: str | None) -> list[NvmlGpu]:
    """The NVML GPUs that CUDA_VISIBLE_DEVICES leaves visible (indices or GPU-UUID prefixes; CUDA stops at the
    first entry it cannot resolve)."""
    if cuda_visible_devices is None:
        return list(gpus)
    out: list[NvmlGpu] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        match: NvmlGpu | None = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in out:
            break
        out.append(match)
    return out


def _count_cvd(value: str) -> int:
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _dev_gpus(root: Path) -> int:
    try:
        return sum(1 for p in (root / "dev").iterdir() if re.fullmatch(r"nvidia[0-9]+", p.name))
    except OSError:
        return 0


def pod_namespace(root: str | os.PathLike[str] = "/") -> str | None:
    """The pod's namespace: $POD_NAMESPACE, else the service-account file."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    return _read(Path(root) / NAMESPACE_FILE) or None


def collect(
    *,
    root: str | os.PathLike[str] = "/",
    shm_path: str = "/dev/shm",
    gpu_pci_bus_ids: list[str] | None = None,
    cuda_visible_devices: str | None = None,
    dataloader_workers: int | None = None,
    use_nvml: bool = True,
) -> tuple[PodFacts, dict[str, Any]]:
    """Read this pod's facts. Returns the facts the checks use and a JSON-able record of what was read."""
    base = Path(root)
    shm = read_shm(shm_path)
    cgroup = read_cgroup(base)
    cpu_count, affinity = read_cpus()
    facts = PodFacts(
        shm_total_bytes=shm.total_bytes if shm else None,
        shm_used_bytes=shm.used_bytes if shm else None,
        cpu_count=cpu_count,
        cpu_affinity=affinity,
        cpu_quota_millicores=cgroup.cpu_quota_millicores if cgroup else None,
        memory_limit_known=cgroup is not None,
        memory_limit_bytes=cgroup.memory_limit_bytes if cgroup else None,
        memory_usage_bytes=cgroup.memory_usage_bytes if cgroup else None,
        oom_kill_count=cgroup.oom_kill_count if cgroup else None,
        dataloader_workers=dataloader_workers,
    )
    gpu_source: str
    gpu_records: list[dict[str, Any]] = []
    if gpu_pci_bus_ids:
        try:
            facts.gpus_numa = [read_gpu_numa(b, base, index=i) for i, b in enumerate(gpu_pci_bus_ids)]
        except ValueError as exc:
            raise InputError(f"--gpu-pci-bus-id: {exc}")
        facts.gpu_count = len(gpu_pci_bus_ids)
        gpu_source = "--gpu-pci-bus-id"
    else:
        nvml, why = nvml_gpus() if use_nvml else (None, "NVML unavailable")
        if nvml is not None:
            shown = visible(nvml, cuda_visible_devices)
            facts.gpus_numa = [read_gpu_numa(g.pci_bus_id, base, index=g.index) for g in shown]
            facts.gpu_count = len(shown)
            gpu_source = "nvml"
            gpu_records = [asdict(g) for g in shown]
        else:
            facts.numa_unavailable = why
            if cuda_visible_devices is not None:
                facts.gpu_count = _count_cvd(cuda_visible_devices)
                gpu_source = "CUDA_VISIBLE_DEVICES"
            else:
                facts.gpu_count = _dev_gpus(base)
                gpu_source = "/dev/nvidia*"
    record: dict[str, Any] = {
        "shm": {"path": shm_path, "total_bytes": facts.shm_total_bytes, "used_bytes": facts.shm_used_bytes},
        "cpu": {
            "cpu_count": cpu_count,
            "affinity": affinity,
            "affinity_count": len(affinity) if affinity is not None else None,
            "quota_millicores": facts.cpu_quota_millicores,
            "effective_millicores": facts.effective_cpu_millicores(),
        },
        "cgroup": asdict(cgroup) if cgroup else None,
        "gpus": {
            "count": facts.gpu_count,
            "source": gpu_source,
            "cuda_visible_devices": cuda_visible_devices,
            "nvml": gpu_records,
            "numa": [asdict(g) for g in facts.gpus_numa] if facts.gpus_numa is not None else None,
            "numa_unavailable": facts.numa_unavailable,
        },
        "dataloader_workers": dataloader_workers,
    }
    return facts, record


def audit_pod(
    contract_file: ContractFile,
    *,
    namespace: str | None = None,
    root: str | os.PathLike[str] = "/",
    shm_path: str = "/dev/shm",
    gpu_pci_bus_ids: list[str] | None = None,
    cuda_visible_devices: str | None = None,
    dataloader_workers: int | None = None,
    use_nvml: bool = True,
) -> AuditReport:
    """Audit the pod this process runs in (or the fixture tree at `root`)."""
    ns = namespace if namespace is not None else pod_namespace(root)
    contract = contract_file.for_namespace(ns)
    facts, record = collect(
        root=root,
        shm_path=shm_path,
        gpu_pci_bus_ids=gpu_pci_bus_ids,
        cuda_visible_devices=cuda_visible_devices,
        dataloader_workers=dataloader_workers,
        use_nvml=use_nvml,
    )
    checks = evaluate_pod(facts, contract)
    if facts.shm_total_bytes is None:
        checks.insert(
            0,
            Check(
                "shm.size",
                "warn",
                "pod",
                f"cannot read {shm_path}: no shared-memory filesystem is mounted there",
                fix=f"mount a memory-backed emptyDir at /dev/shm (sizeLimit {fmt_quantity(contract.shm.sla_bytes)})",
                related_verdict="shm_exhausted",
            ),
        )
    return AuditReport(
        audit="pod",
        target=os.environ.get("HOSTNAME") or "this pod",
        contract=contract,
        checks=checks,
        facts=record,
        extra={"namespace": ns},
    )
