"""The pre-submit gate: a workload manifest checked against the resource contract.

`audit_manifest(path, contract_file)` reads a YAML file of one or more documents (Pod, Job, CronJob,
Deployment, StatefulSet, ReplicaSet, DaemonSet, PyTorchJob, JobSet, or a `List` of them), finds every
pod template, and checks each one:

- `gpu.request`        GPU/MIG resources well-formed: known names, whole numbers, in limits, requests = limits
- `cpu.per_gpu`        CPU requests ≥ the contract's cores per GPU
- `memory.limit`       every container sets limits.memory
- `shm.medium`         a memory-backed emptyDir is mounted at /dev/shm in every GPU container
- `shm.size`           its size (sizeLimit, capped by the pod memory limit its pages count against) ≥ floor/SLA
- `dataloader.workers` DataLoader num_workers, where env or args declare it, vs the CPUs per GPU
- `numa.alignment`     Guaranteed QoS with whole CPUs, so the kubelet can pin CPUs to the GPUs' NUMA node

Bad YAML, an unknown kind or a malformed workload raise `ManifestError` (exit 2 in the CLI).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage.contract.checks import (
    HOST_MEMORY,
    SHM,
    cpu_per_gpu_check,
    dataloader_check,
    no_shm_mount_check,
    shm_size_check,
)
from triage.contract.errors import ManifestError
from triage.contract.load import ContractFile
from triage.contract.model import AuditReport, Check, Contract, worst
from triage.contract.quantity import (
    fmt_bytes,
    fmt_number,
    fmt_quantity,
    millicores_to_cores,
    parse_bytes,
    parse_millicores,
    parse_quantity,
)

MAX_BYTES = 4 * 1024 * 1024
SUPPORTED_KINDS = (
    "CronJob",
    "DaemonSet",
    "Deployment",
    "Job",
    "JobSet",
    "Pod",
    "PyTorchJob",
    "ReplicaSet",
    "StatefulSet",
)
_TEMPLATE_KINDS = {"Job", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"}
SHM_PATH = "/dev/shm"

# Where training code commonly declares DataLoader workers.
WORKER_ENV = (
    "DATALOADER_NUM_WORKERS",
    "DATALOADER_WORKERS",
    "NUM_DATALOADER_WORKERS",
    "NUM_DATA_WORKERS",
    "DATA_WORKERS",
    "NUM_WORKERS",
)
WORKER_FLAGS = (
    "--num-workers",
    "--num_workers",
    "--dataloader-num-workers",
    "--dataloader_num_workers",
    "--data-workers",
    "--workers",
)
_HYDRA_WORKERS = re.compile(r"^\+*(?:[\w.]+\.)?(?:dataloader_)?num_workers=(\S+)$")
_MIG = re.compile(r"^([1-7])g\.([0-9]+)gb(?:\.[a-z0-9]+)*$")


@dataclass
class PodTemplate:
    """One pod template of a workload: where it is, and its spec."""

    workload: str  # "Job/train-llm", "PyTorchJob/bert/Worker"
    namespace: str | None
    spec: dict[str, Any]
    where: str  # "document 1 (Job/train-llm): spec.template.spec"


@dataclass
class _Container:
    name: str
    init: bool
    where: str
    requests: dict[str, Any]
    limits: dict[str, Any]
    full: dict[str, int] = field(default_factory=dict)  # whole GPUs by resource name
    mig: dict[str, int] = field(default_factory=dict)  # MIG slices by resource name
    gpu_names: list[str] = field(default_factory=list)
    gpu_problems: list[str] = field(default_factory=list)
    cpu_request: int | None = None  # millicores; requests default to limits, as in Kubernetes
    cpu_limit: int | None = None
    mem_request: int | None = None
    mem_limit: int | None = None

    @property
    def gpus(self) -> int:
        return sum(self.full.values())

    @property
    def devices(self) -> int:
        return self.gpus + sum(self.mig.values())


# --- reading -------------------------------------------------------------------------------------


def read_documents(path: str) -> list[Any]:
    """The YAML documents of `path` (empty ones dropped); ManifestError for unreadable or bad YAML."""

    file = Path(path)
    try:
        if file.stat().st_size > MAX_BYTES:
            raise ManifestError(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a manifest")
        text = file.read_bytes().decode("utf-8")
    except ManifestError:
        raise
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not UTF-8 text")
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}")
    return parse_documents(text, path)


def parse_documents(text: str, name: str) -> list[Any]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:
        raise ManifestError(f"{name}: YAML nested too deeply to be a manifest")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ManifestError(f"{name}: not valid YAML: {problem}{at}")
    if not docs:
        raise ManifestError(f"{name}: no YAML documents")
    return docs


def pod_templates(docs: list[Any], name: str) -> list[PodTemplate]:
    """Every pod template of every document; ManifestError for anything that is not a workload."""
    templates: list[PodTemplate] = []
    for number, doc in enumerate(docs, start=1):
        label = f"{name}: document {number}"
        if not isinstance(doc, dict):
            raise ManifestError(f"{label} is a {_type(doc)}, not a Kubernetes object")
        kind = doc.get("kind")
        if kind == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise ManifestError(f"{label} (List): items must be a list")
            for index, item in enumerate(items):
                templates.extend(_templates_of(item, f"{label} items[{index}]"))
        else:
            templates.extend(_templates_of(doc, label))
    return templates


def _templates_of(doc: Any, label: str) -> list[PodTemplate]:
    if not isinstance(doc, dict):
        raise ManifestError(f"{label} is a {_type(doc)}, not a Kubernetes object")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ManifestError(f"{label} has no kind (expected one of {', '.join(SUPPORTED_KINDS)})")
    if kind not in SUPPORTED_KINDS:
        raise ManifestError(
            f"{label}: kind {kind!r} is not a workload the audit reads (supported: {', '.join(SUPPORTED_KINDS)})"
        )
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        raise ManifestError(f"{label} ({kind}): metadata must be a mapping")
    name = meta.get("name") or meta.get("generateName") or "unnamed"
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ManifestError(f"{label} ({kind}): metadata.namespace must be a string")
    workload = f"{kind}/{name}"
    where = f"{label} ({workload})"
    if kind == "Pod":
        return [PodTemplate(workload, namespace, _dig(doc, ["spec"], where), f"{where}: spec")]
    if kind in _TEMPLATE_KINDS:
        path = ["spec", "template", "spec"]
        return [PodTemplate(workload, namespace, _dig(doc, path, where), f"{where}: {'.'.join(path)}")]
    if kind == "CronJob":
        path = ["spec", "jobTemplate", "spec", "template", "spec"]
        return [PodTemplate(workload, namespace, _dig(doc, path, where), f"{where}: {'.'.join(path)}")]
    if kind == "PyTorchJob":
        replicas = _dig(doc, ["spec", "pytorchReplicaSpecs"], where)
        if not replicas:
            raise ManifestError(f"{where}: spec.pytorchReplicaSpecs has no replica types")
        out = []
        for role in replicas:
            path = ["spec", "pytorchReplicaSpecs", str(role), "template", "spec"]
            out.append(
                PodTemplate(
                    f"{workload}/{role}", namespace, _dig(doc, path, where), f"{where}: {'.'.join(path)}"
                )
            )
        return out
    # JobSet
    jobs = _dig_list(doc, ["spec", "replicatedJobs"], where)
    out = []
    for index, job in enumerate(jobs):
        rj_where = f"{where}: spec.replicatedJobs[{index}]"
        if not isinstance(job, dict):
            raise ManifestError(f"{rj_where} must be a mapping")
        role = job.get("name") or str(index)
        path = ["template", "spec", "template", "spec"]
        out.append(PodTemplate(f"{workload}/{role}", namespace, _dig(job, path, rj_where), f"{rj_where}"))
    return out


def _dig(obj: dict[str, Any], path: list[str], where: str) -> dict[str, Any]:
    node: Any = obj
    for depth, key in enumerate(path):
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            dotted = ".".join(path[: depth + 1])
            what = "is missing" if node is None else f"is a {_type(node)}, not a mapping"
            raise ManifestError(f"{where}: {dotted} {what}")
    return node


def _dig_list(obj: dict[str, Any], path: list[str], where: str) -> list[Any]:
    parent = _dig(obj, path[:-1], where) if len(path) > 1 else obj
    node = parent.get(path[-1])
    if not isinstance(node, list) or not node:
        raise ManifestError(f"{where}: {'.'.join(path)} must be a non-empty list")
    return node


def _type(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


# --- container facts ---------------------------------------------------------------------------


def _containers(template: PodTemplate, contract: Contract) -> tuple[list[_Container], list[_Container]]:
    spec = template.spec
    app = spec.get("containers")
    if not isinstance(app, list) or not app:
        raise ManifestError(f"{template.where}: containers must be a non-empty list")
    init = spec.get("initContainers") or []
    if not isinstance(init, list):
        raise ManifestError(f"{template.where}: initContainers must be a list")
    parsed_app = [_container(c, i, False, template, contract) for i, c in enumerate(app)]
    parsed_init = [_container(c, i, True, template, contract) for i, c in enumerate(init)]
    return parsed_app, parsed_init


def _container(raw: Any, index: int, init: bool, template: PodTemplate, contract: Contract) -> _Container:
    field_name = "initContainers" if init else "containers"
    where = f"{template.where}.{field_name}[{index}]"
    if not isinstance(raw, dict):
        raise ManifestError(f"{where} must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where} has no name")
    resources = raw.get("resources") or {}
    if not isinstance(resources, dict):
        raise ManifestError(f"{where}.resources must be a mapping")
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    for key, value in (("requests", requests), ("limits", limits)):
        if not isinstance(value, dict):
            raise ManifestError(f"{where}.resources.{key} must be a mapping")
    c = _Container(name=name, init=init, where=where, requests=requests, limits=limits)

    def quantity(kind: str, key: str, parse: Any) -> int | None:
        value = (requests if kind == "requests" else limits).get(key)
        if value is None:
            return None
        try:
            return int(parse(value))
        except ValueError as exc:
            raise ManifestError(f"{where}.resources.{kind}.{key}: {exc}")

    c.cpu_limit = quantity("limits", "cpu", parse_millicores)
    c.cpu_request = quantity("requests", "cpu", parse_millicores)
    if c.cpu_request is None:
        c.cpu_request = c.cpu_limit
    c.mem_limit = quantity("limits", "memory", parse_bytes)
    c.mem_request = quantity("requests", "memory", parse_bytes)
    if c.mem_request is None:
        c.mem_request = c.mem_limit
    _gpu_resources(c, contract)
    return c


def _is_gpu_name(name: str, contract: Contract) -> bool:
    lower = name.lower()
    return (
        name in contract.gpu.resources
        or lower.startswith(contract.gpu.mig_prefix.lower())
        or lower.startswith("nvidia.com/")
        or "gpu" in lower
    )


def _gpu_resources(c: _Container, contract: Contract) -> None:
    names = sorted({k for k in (*c.requests, *c.limits) if isinstance(k, str) and _is_gpu_name(k, contract)})
    prefix = contract.gpu.mig_prefix
    for name in names:
        c.gpu_names.append(name)
        is_mig = name.startswith(prefix)
        if is_mig and not _MIG.match(name[len(prefix) :]):
            c.gpu_problems.append(
                f"malformed MIG resource {name!r}: expected {prefix}<slices>g.<memory>gb, e.g. {prefix}1g.10gb"
            )
            continue
        if not is_mig and name not in contract.gpu.resources:
            known = ", ".join([*contract.gpu.resources, f"{prefix}<profile>"])
            c.gpu_problems.append(f"unknown GPU resource {name!r} (the device plugins advertise {known})")
            continue
        counts: dict[str, int | None] = {}
        bad: list[str] = []
        for kind, table in (("requests", c.requests), ("limits", c.limits)):
            if name in table:
                counts[kind] = _whole(table[name])
                if counts[kind] is None:
                    bad.append(f"{table[name]!r} in {kind}")
        if bad:
            c.gpu_problems.append(f"{name} is {' and '.join(bad)}: GPUs are whole devices (1, 2, …, 8)")
        if "limits" not in counts:
            c.gpu_problems.append(
                f"{name} is set in requests but not in limits: Kubernetes requires extended resources in limits"
            )
            continue
        limit = counts["limits"]
        if (
            "requests" in counts
            and counts["requests"] is not None
            and limit is not None
            and counts["requests"] != limit
        ):
            c.gpu_problems.append(f"{name}: requests ({counts['requests']}) differ from limits ({limit})")
            continue
        if limit is None or limit == 0:
            continue
        if is_mig:
            c.mig[name] = limit
        else:
            c.full[name] = limit


def _whole(value: Any) -> int | None:
    """A whole non-negative device count, or None."""
    try:
        q = parse_quantity(value)
    except ValueError:
        return None
    if q < 0 or q != q.to_integral_value():
        return None
    return int(q)


# --- checks --------------------------------------------------------------------------------------


def audit_template(template: PodTemplate, contract: Contract) -> tuple[list[Check], dict[str, Any]]:
    """The checks of one pod template, and the facts they were computed from."""
    app, init = _containers(template, contract)
    pod = template.workload
    checks: list[Check] = []
    # gpu.request
    gpu_containers = [c for c in app if c.gpu_names]
    if not gpu_containers:
        checks.append(Check("gpu.request", "pass", pod, "no GPU requested"))
    for c in gpu_containers:
        checks.append(_gpu_check(c, pod, contract))
    for c in init:
        if c.gpu_names:
            checks.append(_gpu_check(c, pod, contract))
    gpus = sum(c.devices for c in app)
    # cpu.per_gpu
    cpu = sum(c.cpu_request or 0 for c in app)
    if gpus and not any(c.cpu_request for c in app):
        checks.append(
            Check(
                "cpu.per_gpu",
                "fail",
                pod,
                f"no CPU requested for {gpus} GPU{'s' if gpus != 1 else ''}: the pod may get a sliver of a core "
                "per GPU",
                fix=f"request at least {fmt_number(gpus * contract.cpu.min_per_gpu)} CPUs "
                f"({fmt_number(contract.cpu.min_per_gpu)} per GPU)",
                value=0,
                threshold=millicores_to_cores(round(gpus * contract.cpu.min_per_gpu * 1000)),
            )
        )
    else:
        checks.append(cpu_per_gpu_check(contract, pod, cpu, gpus, verb="requested"))
    # memory.limit
    checks.append(_memory_check(app + init, pod, contract))
    pod_mem_limit = _pod_memory_limit(app, init)
    # shm
    shm_checks, shm_facts = _shm_checks(template, app, gpus, pod_mem_limit, contract)
    checks.extend(shm_checks)
    # dataloader.workers
    for c, raw in zip(app, template.spec["containers"], strict=True):
        declared = declared_workers(raw)
        if declared is not None:
            workers, source = declared
            checks.append(
                dataloader_check(
                    contract, f"{pod}/{c.name}", workers, c.cpu_request or 0, c.devices, source=source
                )
            )
    # numa.alignment
    if gpus and contract.dataloader.numa_pinning:
        checks.append(_numa_alignment(app, init, pod))
    facts = {
        "workload": template.workload,
        "namespace": template.namespace,
        "contract_namespace": contract.overrides,
        "gpus": gpus,
        "cpu_request": millicores_to_cores(cpu),
        "memory_limit_bytes": pod_mem_limit,
        "shm": shm_facts,
        "containers": [c.name for c in app],
    }
    return checks, facts


def _gpu_check(c: _Container, pod: str, contract: Contract) -> Check:
    subject = f"{pod}/{c.name}"
    parts = [f"{count} × {name}" for name, count in (*c.full.items(), *c.mig.items())]
    warnings: list[str] = []
    if c.init:
        warnings.append("an init container holds GPUs while the app containers wait for it")
    if c.gpus and c.mig:
        warnings.append("full GPUs and MIG slices in one container")
    if sum(c.mig.values()) > 1:
        warnings.append(
            f"{sum(c.mig.values())} MIG slices in one container: a CUDA process uses one MIG device"
        )
    if c.gpu_problems:
        return Check(
            "gpu.request",
            "fail",
            subject,
            "; ".join(c.gpu_problems + warnings),
            fix="request GPUs as a whole number in resources.limits (requests, if set, equal to limits) "
            f"under {' or '.join(contract.gpu.resources)} or {contract.gpu.mig_prefix}<profile>",
            value=", ".join(c.gpu_names),
        )
    requested = ", ".join(parts) or "0 GPUs"
    if warnings:
        return Check(
            "gpu.request",
            "warn",
            subject,
            f"{requested} in limits: " + "; ".join(warnings),
            fix="give each training container either one MIG slice or whole GPUs",
            value=c.devices,
        )
    return Check("gpu.request", "pass", subject, f"{requested} in limits", value=c.devices)


def _memory_check(containers: list[_Container], pod: str, contract: Contract) -> Check:
    missing = [c.name for c in containers if c.mem_limit is None]
    if missing and contract.memory.require_limit:
        names = ", ".join(missing)
        return Check(
            "memory.limit",
            "fail",
            pod,
            f"container{'s' if len(missing) > 1 else ''} {names} set{'' if len(missing) > 1 else 's'} no memory "
            "limit: a host-memory blow-up takes the node's memory and the kernel OOM killer picks the victim",
            fix="set resources.limits.memory on every container",
            value=None,
            related_verdict=HOST_MEMORY,
        )
    limits = ", ".join(f"{c.name} {fmt_bytes(c.mem_limit)}" for c in containers if c.mem_limit is not None)
    if missing:
        sentence = f"memory limits: {limits or 'none'} (the contract does not require them)"
    else:
        sentence = f"every container sets a memory limit ({limits})"
    return Check(
        "memory.limit",
        "pass",
        pod,
        sentence,
        value=_sum_or_none([c.mem_limit for c in containers]),
        related_verdict=HOST_MEMORY,
    )


def _sum_or_none(values: list[int | None]) -> int | None:
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _pod_memory_limit(app: list[_Container], init: list[_Container]) -> int | None:
    """The pod-level memory limit the kubelet sets: Σ app limits, at least each init limit; None if any lacks one."""
    total = _sum_or_none([c.mem_limit for c in app])
    if total is None or any(c.mem_limit is None for c in init):
        return None
    return max([total, *(c.mem_limit or 0 for c in init)])


def _shm_checks(
    template: PodTemplate, app: list[_Container], gpus: int, pod_mem_limit: int | None, contract: Contract
) -> tuple[list[Check], list[dict[str, Any]]]:
    spec = template.spec
    pod = template.workload
    raw_volumes = spec.get("volumes") or []
    if not isinstance(raw_volumes, list):
        raise ManifestError(f"{template.where}.volumes must be a list")
    volumes = {v.get("name"): v for v in raw_volumes if isinstance(v, dict)}
    targets = [c for c in app if c.devices] if gpus else app
    raw_by_name = {c.get("name"): c for c in spec["containers"] if isinstance(c, dict)}
    shm_fix = (
        f"mount an emptyDir with medium: Memory and sizeLimit: {fmt_quantity(contract.shm.sla_bytes)} at /dev/shm "
        f"(floor {fmt_quantity(contract.shm.floor_bytes)}), and a memory limit that covers it"
    )
    checks: list[Check] = []
    sized: list[str] = []
    facts: list[dict[str, Any]] = []
    for c in targets:
        subject = f"{pod}/{c.name}"
        mounts = raw_by_name[c.name].get("volumeMounts") or []
        if not isinstance(mounts, list):
            raise ManifestError(f"{c.where}.volumeMounts must be a list")
        mount = next(
            (
                m
                for m in mounts
                if isinstance(m, dict) and str(m.get("mountPath", "")).rstrip("/") == SHM_PATH
            ),
            None,
        )
        if mount is None:
            checks.append(no_shm_mount_check(contract, subject, shm_fix))
            facts.append({"container": c.name, "volume": None, "medium": None, "size_limit_bytes": None})
            continue
        vol_name = mount.get("name")
        volume = volumes.get(vol_name)
        if volume is None:
            raise ManifestError(
                f"{c.where}: the /dev/shm volumeMount names volume {vol_name!r}, which spec volumes does not define"
            )
        empty_dir = volume.get("emptyDir")
        if "emptyDir" not in volume or (empty_dir is not None and not isinstance(empty_dir, dict)):
            other = next((k for k in volume if k != "name"), "unknown")
            checks.append(
                Check(
                    "shm.medium",
                    "fail",
                    subject,
                    f"/dev/shm is a {other} volume ({vol_name}), not a memory-backed emptyDir",
                    fix=shm_fix,
                    value=other,
                    threshold="emptyDir/Memory",
                    related_verdict=SHM,
                )
            )
            facts.append({"container": c.name, "volume": vol_name, "medium": other, "size_limit_bytes": None})
            continue
        empty_dir = empty_dir or {}
        medium = empty_dir.get("medium") or ""
        size_limit = None
        if empty_dir.get("sizeLimit") is not None:
            try:
                size_limit = parse_bytes(empty_dir["sizeLimit"])
            except ValueError as exc:
                raise ManifestError(f"{template.where}.volumes[{vol_name}].emptyDir.sizeLimit: {exc}")
        facts.append(
            {"container": c.name, "volume": vol_name, "medium": medium, "size_limit_bytes": size_limit}
        )
        if medium != "Memory":
            checks.append(
                Check(
                    "shm.medium",
                    "fail",
                    subject,
                    f"/dev/shm is a disk-backed emptyDir ({vol_name}, medium {medium or 'unset'}): shared-memory "
                    "batches go through the node's disk",
                    fix=shm_fix,
                    value=medium,
                    threshold="Memory",
                    related_verdict=SHM,
                )
            )
            continue
        checks.append(
            Check(
                "shm.medium",
                "pass",
                subject,
                f"/dev/shm is a memory-backed emptyDir ({vol_name})",
                value=medium,
                threshold="Memory",
                related_verdict=SHM,
            )
        )
        if vol_name in sized:
            continue
        sized.append(str(vol_name))
        checks.append(
            shm_size_check(
                contract,
                f"{pod}/{vol_name}",
                size_limit,
                pod_mem_limit,
                size_label="sizeLimit",
                cap_label="pod memory limit",
                fix=shm_fix,
            )
        )
    return checks, facts


def _numa_alignment(app: list[_Container], init: list[_Container], pod: str) -> Check:
    problems: list[str] = []
    for c in app + init:
        for res, req, lim in (("cpu", c.cpu_request, c.cpu_limit), ("memory", c.mem_request, c.mem_limit)):
            if lim is None:
                problems.append(f"{c.name} has no {res} limit")
            elif req != lim:
                shown = (
                    (fmt_number(millicores_to_cores(req or 0)), fmt_number(millicores_to_cores(lim)))
                    if res == "cpu"
                    else (fmt_bytes(req or 0), fmt_bytes(lim))
                )
                problems.append(f"{c.name} requests {res} {shown[0]} but is limited to {shown[1]}")
    for c in app:
        if c.devices and c.cpu_request is not None and c.cpu_request % 1000:
            problems.append(
                f"{c.name} requests {fmt_number(millicores_to_cores(c.cpu_request))} CPUs, not whole CPUs"
            )
    if problems:
        return Check(
            "numa.alignment",
            "warn",
            pod,
            "the kubelet cannot pin this pod's CPUs to the GPUs' NUMA node (needs Guaranteed QoS with whole "
            "CPUs): " + "; ".join(problems),
            fix="set requests equal to limits for cpu and memory in every container, with whole CPUs, so the "
            "static CPU manager and topology manager can keep DataLoader workers on the GPUs' NUMA node",
            value="; ".join(problems),
            threshold="Guaranteed QoS, whole CPUs",
        )
    return Check(
        "numa.alignment",
        "pass",
        pod,
        "Guaranteed QoS with whole CPUs: the kubelet's static CPU manager and topology manager can pin the "
        "pod's CPUs to the GPUs' NUMA node",
        value="Guaranteed",
        threshold="Guaranteed QoS, whole CPUs",
    )


def declared_workers(container: dict[str, Any]) -> tuple[int, str] | None:
    """DataLoader num_workers as declared in env or args/command, with where it was found; None if not."""
    env = container.get("env") or []
    if isinstance(env, list):
        by_name = {e.get("name"): e.get("value") for e in env if isinstance(e, dict)}
        for name in WORKER_ENV:
            value = by_name.get(name)
            count = _int(value)
            if count is not None:
                return count, f"env {name}"
    tokens: list[str] = []
    for key in ("command", "args"):
        items = container.get(key) or []
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, str | int) or isinstance(item, bool):
                continue
            text = str(item)
            if any(ch.isspace() for ch in text):
                try:
                    tokens.extend(shlex.split(text))
                except ValueError:
                    tokens.extend(text.split())
            else:
                tokens.append(text)
    for i, token in enumerate(tokens):
        for flag in WORKER_FLAGS:
            if token == flag and i + 1 < len(tokens):
                count = _int(tokens[i + 1])
                if count is not None:
                    return count, f"arg {flag} {tokens[i + 1]}"
            elif token.startswith(flag + "="):
                count = _int(token[len(flag) + 1 :])
                if count is not None:
                    return count, f"arg {token}"
        match = _HYDRA_WORKERS.match(token)
        if match:
            count = _int(match.group(1))
            if count is not None:
                return count, f"arg {token}"
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


# --- the audit -----------------------------------------------------------------------------------


def audit_documents(
    docs: list[Any], contract_file: ContractFile, *, target: str, namespace: str | None = None
) -> AuditReport:
    """Audit already-parsed YAML documents. `namespace` overrides each workload's metadata.namespace."""
    templates = pod_templates(docs, target)
    checks: list[Check] = []
    workloads: list[dict[str, Any]] = []
    contracts: list[Contract] = []
    for template in templates:
        contract = contract_file.for_namespace(namespace if namespace is not None else template.namespace)
        contracts.append(contract)
        template_checks, facts = audit_template(template, contract)
        facts["status"] = worst([c.status for c in template_checks])
        checks.extend(template_checks)
        workloads.append(facts)
    overrides = {c.overrides for c in contracts}
    report_contract = contracts[0] if len(overrides) == 1 else contract_file.default
    return AuditReport(
        audit="manifest",
        target=target,
        contract=report_contract,
        checks=checks,
        facts={"workloads": workloads},
    )


def audit_manifest(path: str, contract_file: ContractFile, *, namespace: str | None = None) -> AuditReport:
    """Read and audit a manifest file (see the module docstring)."""
    return audit_documents(read_documents(path), contract_file, target=path, namespace=namespace)
