"""Pod and node facts in the incident bundle's vocabulary (docs/bundle.md), for the evidence and the rules.

Half of an OOM's evidence lives outside the process: the container's limits, the MIG slice it asked for,
what is mounted at /dev/shm, the node's GPU product, the Job that owns the pod, the team to route to.
`pod_facts(pod, node)` reads them from the API's JSON objects (as the API server sends them) and returns
bundle sections:

``workload``   namespace, pod, node, container, job, owner_kind, owner_name, labels, annotations, team,
               rank / local_rank / world_size (from literal RANK/LOCAL_RANK/WORLD_SIZE env, as the training
               operators set them)
``device``     name (`nvidia.com/gpu.product`), declared_total_bytes (`nvidia.com/gpu.memory`, MiB, only when
               the container asked for whole GPUs), mig_mode + mig_profile (a `nvidia.com/mig-<profile>`
               resource, or a single-strategy MIG node whose product names the slice)
``host``       shm_total_bytes (what the kubelet makes /dev/shm: see `shm_facts`), cgroup.memory_limit_bytes
               (the container's memory limit)
``environment`` PYTORCH_CUDA_ALLOC_CONF, CUDA_VISIBLE_DEVICES, RANK, LOCAL_RANK, WORLD_SIZE (literal env only)
``k8s``        the raw facts the resource contract reads (`triage.contract.evidence.pod_violations`):
               shm_medium ("Memory", "" for a disk-backed emptyDir, "none" when nothing is mounted, else the
               volume type), shm_size_limit_bytes, cpu_request, gpu_count, memory_limit_bytes (None: no
               limit), namespace; and pod_uid, node, container, qos_class, owner_chain, gpu_resources,
               mig_profile, mig_memory_bytes, pod_memory_limit_bytes, node_allocatable_memory_bytes,
               node_labels (the GPU feature discovery subset), container_restart_count

`enrich_bundle(bundle, client)` merges those facts into a bundle that names a pod, filling only what is
absent or null: what the collector measured in-process (statvfs of /dev/shm, the cgroup it read, NVML's
device name and MIG profile) always wins. It never raises for an API problem: the bundle comes back with
`k8s.enrich_error` saying what could not be read.

The owner is resolved from the pod alone (ownerReferences plus the labels the operators set), so the
service account needs nothing beyond pods and nodes: a Job owned by a JobSet is found through
`jobset.sigs.k8s.io/jobset-name`, a RayCluster made for a RayJob through `ray.io/originated-from-*`, a
Kubeflow job through `training.kubeflow.org/job-name` and its operator label.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Protocol

from triage.contract.quantity import parse_bytes, parse_quantity

MiB = 1024 * 1024
SHM_PATH = "/dev/shm"
RUNTIME_DEFAULT_SHM_BYTES = 64 * MiB  # containerd / Docker give a container this much /dev/shm
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
MIG_PREFIX = "nvidia.com/mig-"
TEAM_KEYS = ("oom-triage.io/team",)  # annotation, then label; then the plain `team` label
CONTAINER_ANNOTATION = "oom-triage.io/container"  # names the training container of a multi-container pod

_MIG_SINGLE = re.compile(r"-MIG-(\d+g\.\d+gb(?:[.+][\w.+-]*)?)$", re.IGNORECASE)
_ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE")
_NODE_LABEL_PREFIXES = ("nvidia.com/", "amd.com/gpu")
_NODE_LABEL_KEYS = (
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "kubernetes.io/arch",
)
_DROP_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
MAX_MAP_ENTRIES = 128
MAX_VALUE_CHARS = 1024

# Kubeflow training operator: operator-name label → kind
_KUBEFLOW_OPERATORS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
}


class PodSource(Protocol):
    """What enrichment needs from a client (`triage.k8s.client.KubeClient` has it)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_node(self, name: str) -> dict[str, Any] | None: ...


# ----------------------------------------------------------------------------------------- helpers


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _bytes(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError:
        return None


def _count(value: Any) -> int | None:
    """A whole-number extended resource quantity (`"8"` → 8); None for anything else."""
    if value is None:
        return None
    try:
        q = parse_quantity(value)
    except ValueError:
        return None
    if q < 0 or q != q.to_integral_value():
        return None
    return int(q)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _capped(mapping: Any, drop: tuple[str, ...] = ()) -> dict[str, str] | None:
    m = _map(mapping)
    out: dict[str, str] = {}
    for key in sorted(m):
        if key in drop or not isinstance(key, str):
            continue
        if len(out) >= MAX_MAP_ENTRIES:
            break
        out[key] = str(m[key])[:MAX_VALUE_CHARS]
    return out or None


def _resources(container: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = _map(container.get("resources"))
    return _map(res.get("requests")), _map(res.get("limits"))


def gpu_resources(container: Mapping[str, Any]) -> dict[str, int]:
    """GPU and MIG resources of a container, by name (limits; requests where limits omit one)."""
    requests, limits = _resources(container)
    out: dict[str, int] = {}
    for name in {*requests, *limits}:
        if not isinstance(name, str):
            continue
        if name in GPU_RESOURCES or name.startswith(MIG_PREFIX):
            n = _count(limits.get(name, requests.get(name)))
            if n:
                out[name] = n
    return dict(sorted(out.items()))


def containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [c for c in _list(_map(pod.get("spec")).get("containers")) if isinstance(c, dict)]


def container_spec(pod: Mapping[str, Any], name: str | None) -> dict[str, Any] | None:
    return next((c for c in containers(pod) if c.get("name") == name), None)


def training_containers(pod: Mapping[str, Any], names: frozenset[str] | set[str] | None = None) -> list[str]:
    """The pod's training containers: the ones named (`--container`, the `oom-triage.io/container`
    annotation), else those asking for a GPU or MIG slice. A pod without either has none."""
    specs = containers(pod)
    wanted = set(names or ())
    annotated = _map(_map(pod.get("metadata")).get("annotations")).get(CONTAINER_ANNOTATION)
    if isinstance(annotated, str) and annotated.strip():
        wanted.update(n.strip() for n in annotated.split(",") if n.strip())
    if wanted:
        return [str(c.get("name")) for c in specs if c.get("name") in wanted]
    return [str(c.get("name")) for c in specs if gpu_resources(c)]


def pick_container(pod: Mapping[str, Any], preferred: str | None = None) -> str | None:
    """The container a bundle is about: `preferred` when the pod has it, else the first training container,
    else the first container."""
    specs = containers(pod)
    if preferred and any(c.get("name") == preferred for c in specs):
        return preferred
    training = training_containers(pod)
    if training:
        return training[0]
    return str(specs[0].get("name")) if specs else None


# ----------------------------------------------------------------------------------------- owner


def owner_chain(pod: Mapping[str, Any]) -> list[dict[str, str]]:
    """The pod's controller and, from the operators' labels, what owns that controller (innermost first)."""
    meta = _map(pod.get("metadata"))
    labels = _map(meta.get("labels"))
    refs = [r for r in _list(meta.get("ownerReferences")) if isinstance(r, dict)]
    ref = next((r for r in refs if r.get("controller") is True), refs[0] if refs else None)
    chain: list[dict[str, str]] = []
    if ref is not None and ref.get("kind") and ref.get("name"):
        chain.append(
            {
                "kind": str(ref["kind"]),
                "name": str(ref["name"]),
                "apiVersion": str(ref.get("apiVersion") or ""),
            }
        )

    def add(kind: str, name: Any, api_version: str) -> None:
        if not isinstance(name, str) or not name:
            return
        if chain and chain[-1]["kind"] == kind and chain[-1]["name"] == name:
            return
        chain.append({"kind": kind, "name": name, "apiVersion": api_version})

    operator = labels.get("training.kubeflow.org/operator-name")
    kubeflow_kind = _KUBEFLOW_OPERATORS.get(str(operator)) if operator else None
    if "jobset.sigs.k8s.io/jobset-name" in labels:
        add("JobSet", labels["jobset.sigs.k8s.io/jobset-name"], "jobset.x-k8s.io/v1alpha2")
    elif kubeflow_kind and "training.kubeflow.org/job-name" in labels:
        add(kubeflow_kind, labels["training.kubeflow.org/job-name"], "kubeflow.org/v1")
    elif "leaderworkerset.sigs.k8s.io/name" in labels:
        add("LeaderWorkerSet", labels["leaderworkerset.sigs.k8s.io/name"], "leaderworkerset.x-k8s.io/v1")
    if "ray.io/cluster" in labels:
        add("RayCluster", labels["ray.io/cluster"], "ray.io/v1")
        crd = labels.get("ray.io/originated-from-crd")
        if crd in ("RayJob", "RayService"):
            add(str(crd), labels.get("ray.io/originated-from-cr-name"), "ray.io/v1")
    if not chain:
        for label in ("batch.kubernetes.io/job-name", "job-name"):
            if label in labels:
                add("Job", labels[label], "batch/v1")
                break
    return chain


def team_of(pod: Mapping[str, Any]) -> str | None:
    meta = _map(pod.get("metadata"))
    annotations, labels = _map(meta.get("annotations")), _map(meta.get("labels"))
    for source in (annotations, labels):
        for key in TEAM_KEYS:
            value = source.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    value = labels.get("team")
    return value.strip() if isinstance(value, str) and value.strip() else None


# ----------------------------------------------------------------------------------------- memory / shm


def pod_memory_limit(pod: Mapping[str, Any]) -> int | None:
    """The pod-level memory limit as the kubelet computes it for Memory-backed emptyDir sizing: the pod's own
    `spec.resources.limits.memory` when set, else Σ app (and sidecar) container limits, at least the largest
    init container limit; None when no container declares one."""
    spec = _map(pod.get("spec"))
    pod_level = _bytes(_map(_map(spec.get("resources")).get("limits")).get("memory"))
    if pod_level:
        return pod_level
    total = 0
    declared = False
    init_max = 0
    for c in containers(pod):
        limit = _bytes(_resources(c)[1].get("memory"))
        if limit:
            total += limit
            declared = True
    for c in _list(spec.get("initContainers")):
        if not isinstance(c, dict):
            continue
        limit = _bytes(_resources(c)[1].get("memory"))
        if not limit:
            continue
        declared = True
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the app containers
            total += limit
        else:
            init_max = max(init_max, limit)
    if not declared:
        return None
    return max(total, init_max)


def node_allocatable_memory(node: Mapping[str, Any] | None) -> int | None:
    if not node:
        return None
    status = _map(node.get("status"))
    return _bytes(_map(status.get("allocatable")).get("memory")) or _bytes(
        _map(status.get("capacity")).get("memory")
    )


def shm_facts(
    pod: Mapping[str, Any], container: Mapping[str, Any], node: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What /dev/shm is in this container: `medium`, `size_limit_bytes`, `total_bytes`, `volume`, `source`.

    Nothing mounted: the runtime's 64 MiB. A Memory-backed emptyDir: a tmpfs of its sizeLimit, capped (as the
    kubelet sizes it) by the pod's memory limit, or by the node's allocatable memory when the pod has none.
    A disk-backed emptyDir: its sizeLimit when set, else unknown. A hostPath of /dev/shm: the node's shm
    (memory-backed, size unknown here).
    """
    mounts = [m for m in _list(container.get("volumeMounts")) if isinstance(m, dict)]
    mount = next((m for m in mounts if str(m.get("mountPath", "")).rstrip("/") == SHM_PATH), None)
    if mount is None:
        return {
            "medium": "none",
            "size_limit_bytes": None,
            "total_bytes": RUNTIME_DEFAULT_SHM_BYTES,
            "volume": None,
            "source": "runtime-default",
        }
    name = mount.get("name")
    volumes = [v for v in _list(_map(pod.get("spec")).get("volumes")) if isinstance(v, dict)]
    volume = next((v for v in volumes if v.get("name") == name), None)
    if volume is None:
        return {"medium": None, "size_limit_bytes": None, "total_bytes": None, "volume": name, "source": None}
    if "emptyDir" in volume:
        empty_dir = _map(volume.get("emptyDir"))
        medium = str(empty_dir.get("medium") or "")
        size_limit = _bytes(empty_dir.get("sizeLimit"))
        total: int | None
        if medium == "Memory":
            cap = pod_memory_limit(pod) or node_allocatable_memory(node)
            total = min(size_limit, cap) if size_limit and cap else (size_limit or cap)
        else:
            total = size_limit
        return {
            "medium": medium,
            "size_limit_bytes": size_limit,
            "total_bytes": total,
            "volume": name,
            "source": "emptyDir",
        }
    host_path = _map(volume.get("hostPath"))
    if host_path:
        path = str(host_path.get("path") or "").rstrip("/")
        return {
            "medium": "Memory" if path == SHM_PATH else "hostPath",
            "size_limit_bytes": None,
            "total_bytes": None,
            "volume": name,
            "source": f"hostPath:{path}",
        }
    kind = next((k for k in volume if k != "name"), "unknown")
    return {"medium": kind, "size_limit_bytes": None, "total_bytes": None, "volume": name, "source": kind}


# ----------------------------------------------------------------------------------------- node / GPU


def node_gpu_labels(node: Mapping[str, Any] | None) -> dict[str, str]:
    """The GPU feature discovery labels (and a few placement labels) of the node."""
    labels = _map(_map((node or {}).get("metadata")).get("labels"))
    out: dict[str, str] = {}
    for key in sorted(labels):
        if not isinstance(key, str):
            continue
        if key.startswith(_NODE_LABEL_PREFIXES) or key in _NODE_LABEL_KEYS:
            out[key] = str(labels[key])[:MAX_VALUE_CHARS]
        if len(out) >= MAX_MAP_ENTRIES:
            break
    return out


def _mib_label(labels: Mapping[str, str], key: str) -> int | None:
    n = _int(labels.get(key))
    return n * MiB if n is not None and n > 0 else None


def device_facts(
    container: Mapping[str, Any], node: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(bundle `device` section, extra `k8s` keys) for the container's GPU request on that node."""
    gpus = gpu_resources(container)
    labels = node_gpu_labels(node)
    device: dict[str, Any] = {}
    extra: dict[str, Any] = {"gpu_resources": gpus or None}
    whole = sum(n for name, n in gpus.items() if name in GPU_RESOURCES)
    mig = {name[len(MIG_PREFIX) :]: n for name, n in gpus.items() if name.startswith(MIG_PREFIX)}
    extra["gpu_count"] = whole + sum(mig.values())
    if not gpus:
        return device, extra
    product = labels.get("nvidia.com/gpu.product")
    if mig:
        profile = sorted(mig)[0]
        device["mig_mode"] = True
        device["mig_profile"] = profile
        extra["mig_profile"] = profile
        extra["mig_memory_bytes"] = _mib_label(labels, f"nvidia.com/mig-{profile}.memory")
        name = labels.get(f"nvidia.com/mig-{profile}.product") or (
            f"{product}-MIG-{profile}" if product else None
        )
        if name:
            device["name"] = name
        return device, extra
    if product:
        device["name"] = product
    single = _MIG_SINGLE.search(product or "")
    if single and "nvidia.com/gpu" in gpus:  # single strategy: nvidia.com/gpu is a slice
        device["mig_mode"] = True
        device["mig_profile"] = single.group(1)
        extra["mig_profile"] = single.group(1)
        extra["mig_memory_bytes"] = _mib_label(labels, "nvidia.com/gpu.memory")
        return device, extra
    declared = _mib_label(labels, "nvidia.com/gpu.memory")
    if declared and "nvidia.com/gpu" in gpus:
        device["declared_total_bytes"] = declared
    return device, extra


# ----------------------------------------------------------------------------------------- the facts


def _env_literals(container: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in _list(container.get("env")):
        if isinstance(e, dict) and e.get("name") in _ENV_KEYS and isinstance(e.get("value"), str):
            out[str(e["name"])] = e["value"]
    return out


def _status_of(pod: Mapping[str, Any], name: str | None) -> dict[str, Any]:
    for s in _list(_map(pod.get("status")).get("containerStatuses")):
        if isinstance(s, dict) and s.get("name") == name:
            return s
    return {}


def _prune(d: dict[str, Any], keep_none: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None or k in keep_none}


def pod_facts(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None = None, *, container: str | None = None
) -> dict[str, Any]:
    """Bundle sections (workload, device, host, environment, k8s) for one container of the pod."""
    meta = _map(pod.get("metadata"))
    spec = _map(pod.get("spec"))
    status = _map(pod.get("status"))
    name = pick_container(pod, container)
    cspec = container_spec(pod, name) or {}
    requests, limits = _resources(cspec)
    chain = owner_chain(pod)
    top = chain[-1] if chain else None
    env = _env_literals(cspec)
    node_name = spec.get("nodeName") or _map(node.get("metadata") if node else None).get("name")

    workload = _prune(
        {
            "namespace": meta.get("namespace"),
            "pod": meta.get("name"),
            "node": node_name,
            "container": name,
            "job": top["name"] if top else None,
            "owner_kind": top["kind"] if top else None,
            "owner_name": top["name"] if top else None,
            "labels": _capped(meta.get("labels")),
            "annotations": _capped(meta.get("annotations"), _DROP_ANNOTATIONS),
            "team": team_of(pod),
            "rank": _int(env.get("RANK")),
            "local_rank": _int(env.get("LOCAL_RANK")),
            "world_size": _int(env.get("WORLD_SIZE")),
        }
    )

    device, gpu_extra = device_facts(cspec, node)
    shm = shm_facts(pod, cspec, node)
    memory_limit = _bytes(limits.get("memory"))
    host: dict[str, Any] = {}
    if shm["total_bytes"] is not None:
        host["shm_total_bytes"] = shm["total_bytes"]
    if memory_limit is not None:
        host["cgroup"] = {"memory_limit_bytes": memory_limit}

    cpu_request = requests.get("cpu", limits.get("cpu"))
    k8s = _prune(
        {
            "namespace": meta.get("namespace"),
            "pod_uid": meta.get("uid"),
            "node": node_name,
            "container": name,
            "qos_class": status.get("qosClass"),
            "owner_chain": chain or None,
            "memory_limit_bytes": memory_limit,
            "memory_request_bytes": _bytes(requests.get("memory", limits.get("memory"))),
            "pod_memory_limit_bytes": pod_memory_limit(pod),
            "cpu_request": str(cpu_request) if cpu_request is not None else None,
            "cpu_limit": str(limits["cpu"]) if limits.get("cpu") is not None else None,
            **gpu_extra,
            "shm_medium": shm["medium"],
            "shm_size_limit_bytes": shm["size_limit_bytes"],
            "shm_volume": shm["volume"],
            "shm_source": shm["source"],
            "node_allocatable_memory_bytes": node_allocatable_memory(node),
            "node_labels": node_gpu_labels(node) or None,
            "container_restart_count": _int(_status_of(pod, name).get("restartCount")),
        },
        keep_none=("memory_limit_bytes",),  # null: the spec sets no limit (a contract violation)
    )
    return {"workload": workload, "device": device, "host": host, "environment": env, "k8s": k8s}


# ----------------------------------------------------------------------------------------- merging


def merge_missing(bundle: dict[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Fill `bundle` (in place) with `facts` wherever the bundle has no value; returns the bundle.

    Mappings are merged key by key; anything else the bundle already has is kept. A cgroup block the
    collector read (it has a `version`) is kept whole: its null limit means "no limit", not "unknown".
    """
    for key, value in facts.items():
        if value is None or value == {} or value == []:
            if key not in bundle and value is None and key == "memory_limit_bytes":
                bundle[key] = None
            continue
        have = bundle.get(key)
        if have is None:
            bundle[key] = copy.deepcopy(value)
        elif isinstance(have, dict) and isinstance(value, Mapping):
            if key == "cgroup" and have.get("version") is not None:
                continue
            merge_missing(have, value)
    return bundle


def enrich_bundle(bundle: dict[str, Any], client: Any) -> dict[str, Any]:
    """A copy of `bundle` with the facts of the pod it names (`workload.namespace` + `workload.pod`) filled in.

    `client`: a `triage.k8s.client.KubeClient`, the official `CoreV1Api` or `ApiClient`, or anything with
    `get_pod(namespace, name)` and `get_node(name)` returning the API's JSON. The node read is
    `workload.node` when the collector reported one (the node the crash happened on), else the pod's
    `spec.nodeName`. API failures never raise: they are recorded in `k8s.enrich_error`.
    """
    from triage.k8s.client import KubeError, as_kube_client

    out = copy.deepcopy(bundle)
    workload = _map(out.get("workload"))
    namespace, name = workload.get("namespace"), workload.get("pod")
    if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
        return out
    source: Any = (
        client if hasattr(client, "get_pod") and hasattr(client, "get_node") else as_kube_client(client)
    )
    errors: list[str] = []
    try:
        pod = source.get_pod(namespace, name)
    except KubeError as exc:
        pod = None
        errors.append(f"pod {namespace}/{name}: {exc}")
    else:
        if pod is None:
            errors.append(f"pod {namespace}/{name} not found")
    node = None
    if pod is not None:
        node_name = workload.get("node") or _map(pod.get("spec")).get("nodeName")
        if isinstance(node_name, str) and node_name:
            try:
                node = source.get_node(node_name)
                if node is None:
                    errors.append(f"node {node_name} not found")
            except KubeError as exc:
                errors.append(f"node {node_name}: {exc}")
        container = workload.get("container")
        facts = pod_facts(pod, node, container=container if isinstance(container, str) else None)
        if isinstance(workload.get("node"), str) and workload["node"]:
            facts["workload"].pop("node", None)
        merge_missing(out, facts)
    if errors:
        k8s = out.get("k8s")
        if not isinstance(k8s, dict):
            k8s = out["k8s"] = {}
        k8s["enrich_error"] = "; ".join(errors)
    return out


__all__ = [
    "RUNTIME_DEFAULT_SHM_BYTES",
    "SHM_PATH",
    "PodSource",
    "container_spec",
    "device_facts",
    "enrich_bundle",
    "gpu_resources",
    "merge_missing",
    "node_gpu_labels",
    "owner_chain",
    "pick_container",
    "pod_facts",
    "pod_memory_limit",
    "shm_facts",
    "team_of",
    "training_containers",
]
