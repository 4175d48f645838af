"""Facts about the pod and the host: /dev/shm, cgroup memory, processes, Kubernetes identity, env.

Every reader returns ``None`` (or leaves a key out) when it cannot tell; none raises.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import Any

SHM = "/dev/shm"
CGROUP_ROOT = "/sys/fs/cgroup"
PODINFO_DIR = "/etc/podinfo"  # a downwardAPI volume with `labels` and `annotations` files
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_V1_UNLIMITED = 1 << 62  # v1 reports "no limit" as a huge page-aligned number

ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "NVIDIA_VISIBLE_DEVICES",
)


def _read(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def shm(path: str = SHM) -> dict[str, int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return {}
    total = st.f_blocks * st.f_frsize
    return {"shm_total_bytes": total, "shm_used_bytes": total - st.f_bfree * st.f_frsize}


def _cgroup_paths(proc_cgroup: str | None) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of this process, from /proc/self/cgroup."""
    v2 = v1 = None
    for line in (proc_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def cgroup(root: str = CGROUP_ROOT, proc_cgroup: str | None = None) -> dict[str, Any] | None:
    """Memory limit, usage and OOM-kill count of this process's cgroup (v2, else v1)."""
    v2_path, v1_path = _cgroup_paths(proc_cgroup if proc_cgroup is not None else _read("/proc/self/cgroup"))
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        dirs = [os.path.join(root, v2_path.lstrip("/"))] if v2_path and v2_path != "/" else []
        dirs.append(root)  # inside a cgroup namespace the pod's cgroup is the root
        for d in dirs:
            limit = _read(os.path.join(d, "memory.max"))
            if limit is None:
                continue
            out: dict[str, Any] = {"version": 2}
            out["memory_limit_bytes"] = None if limit.strip() == "max" else _int(limit)
            out["memory_usage_bytes"] = _int(_read(os.path.join(d, "memory.current")))
            m = re.search(r"^oom_kill (\d+)", _read(os.path.join(d, "memory.events")) or "", re.M)
            out["oom_kill_count"] = int(m.group(1)) if m else None
            return out
        return None
    base = os.path.join(root, "memory")
    dirs = [os.path.join(base, v1_path.lstrip("/"))] if v1_path and v1_path != "/" else []
    dirs.append(base)
    for d in dirs:
        v1_limit = _int(_read(os.path.join(d, "memory.limit_in_bytes")))
        if v1_limit is None:
            continue
        out = {"version": 1, "memory_limit_bytes": None if v1_limit >= _V1_UNLIMITED else v1_limit}
        out["memory_usage_bytes"] = _int(_read(os.path.join(d, "memory.usage_in_bytes")))
        m = re.search(r"^oom_kill (\d+)", _read(os.path.join(d, "memory.oom_control")) or "", re.M)
        out["oom_kill_count"] = int(m.group(1)) if m else None
        return out
    return None


def rss_bytes() -> int | None:
    statm = _read("/proc/self/statm")
    if not statm:
        return None
    try:
        return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (IndexError, ValueError, OSError):
        return None


def child_pids(pid: int, limit: int = 4096) -> list[int]:
    """Direct children of ``pid`` (DataLoader workers, helpers), from /proc; bounded."""
    kids: list[int] = []
    try:  # the kernel's own list (CONFIG_PROC_CHILDREN): no scan of every process on the host
        for tid in os.listdir(f"/proc/{pid}/task")[:limit]:
            text = _read(f"/proc/{pid}/task/{tid}/children")
            if text is None:
                raise OSError("no children file")
            kids.extend(int(x) for x in text.split())
        return sorted(set(kids))[:limit]
    except (OSError, ValueError):
        kids = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return kids
    for name in names[: limit * 4]:
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat", 1024)
        if not stat:
            continue
        # the comm field may hold spaces and parentheses: the ppid is the 2nd field after the last ')'
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 1 and rest[1] == str(pid):
            kids.append(int(name))
            if len(kids) >= limit:
                break
    return sorted(kids)


def process_name(pid: int) -> str | None:
    comm = _read(f"/proc/{pid}/comm", 256)
    return comm.strip() if comm else None


def host(dataloader_workers: int | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(shm())
    out["cgroup"] = cgroup()
    out["rss_bytes"] = rss_bytes()
    out["cpu_count"] = os.cpu_count()
    try:
        out["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["cpu_affinity"] = None
    out["dataloader_workers"] = dataloader_workers
    return out


def _podinfo(path: str) -> dict[str, str]:
    """A downwardAPI file: one ``key="value"`` per line, values Go-quoted."""
    out: dict[str, str] = {}
    for line in (_read(path, 1 << 20) or "").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")
        out[key.strip()] = value
    return out


def _first(env: dict[str, str], *names: str) -> str | None:
    for n in names:
        v = env.get(n, "").strip()
        if v:
            return v
    return None


def _as_int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


# label → owner kind, in the order they are tried
_OWNER_LABELS = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "PyTorchJob"),
    ("ray.io/cluster", "RayCluster"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)


def workload(env: dict[str, str] | None = None, podinfo_dir: str | None = None) -> dict[str, Any]:
    """Kubernetes identity (downward API env and volume, the pod's hostname) and distributed ranks."""
    e = dict(os.environ) if env is None else env
    pdir = podinfo_dir or e.get("TRIAGE_PODINFO_DIR") or PODINFO_DIR
    labels = _podinfo(os.path.join(pdir, "labels"))
    annotations = _podinfo(os.path.join(pdir, "annotations"))
    hostname = socket.gethostname()
    in_k8s = bool(e.get("KUBERNETES_SERVICE_HOST"))
    ns = _first(e, "TRIAGE_NAMESPACE", "POD_NAMESPACE", "MY_POD_NAMESPACE", "K8S_NAMESPACE")
    if ns is None and in_k8s:
        ns = (_read(SA_NAMESPACE) or "").strip() or None
    out: dict[str, Any] = {
        "namespace": ns,
        "pod": _first(e, "TRIAGE_POD_NAME", "POD_NAME", "MY_POD_NAME", "K8S_POD_NAME")
        or (hostname if in_k8s else None),
        "node": _first(e, "TRIAGE_NODE_NAME", "NODE_NAME", "MY_NODE_NAME", "K8S_NODE_NAME"),
        "container": _first(e, "TRIAGE_CONTAINER_NAME", "CONTAINER_NAME", "K8S_CONTAINER_NAME"),
        "hostname": hostname,
        "labels": labels or None,
        "annotations": annotations or None,
        "rank": _as_int(e.get("RANK")),
        "local_rank": _as_int(e.get("LOCAL_RANK")),
        "world_size": _as_int(e.get("WORLD_SIZE")),
        "restart_count": _as_int(_first(e, "TRIAGE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")),
    }
    job = _first(e, "TRIAGE_JOB")
    kind = _first(e, "TRIAGE_OWNER_KIND")
    for label, k in _OWNER_LABELS:
        if label in labels:
            job = job or labels[label]
            kind = kind or k
            break
    out["job"] = job
    out["owner_kind"] = kind
    out["owner_name"] = _first(e, "TRIAGE_OWNER_NAME") or job
    out["team"] = (
        _first(e, "TRIAGE_TEAM")
        or annotations.get("oom-triage.io/team")
        or labels.get("oom-triage.io/team")
        or labels.get("team")
    )
    return out


def environment(env: dict[str, str] | None = None) -> dict[str, Any]:
    e = dict(os.environ) if env is None else env
    out: dict[str, Any] = {k: e[k] for k in ENV_KEYS if k in e}
    out["python_version"] = sys.version.split()[0]
    return out


def alloc_conf_settings(conf: str | None) -> dict[str, Any]:
    """``PYTORCH_CUDA_ALLOC_CONF`` parsed the way the allocator reads it (``key:value,key:value``)."""
    out: dict[str, Any] = {"PYTORCH_CUDA_ALLOC_CONF": conf or ""}
    for item in (conf or "").split(","):
        key, sep, value = item.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out
