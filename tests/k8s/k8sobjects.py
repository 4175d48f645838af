"""Pod and Node objects in the shapes the API server sends (recorded from `kubectl get -o json` of real GPU
training pods and GFD-labelled nodes, names and ids replaced). Every object these builders make passes
`kubernetes-validate --strict` (tests/k8s/test_fakeapi.py checks it), so the client code is tested against
what a real API server returns: camelCase keys, quantities as strings, the service-account volume, the
tolerations, conditions and container statuses the control plane adds.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from typing import Any

NS = "ml-research"
NODE = "gpu-a100-07"
T_CREATED = "2025-05-01T10:00:00Z"
T_STARTED = "2025-05-01T10:00:05Z"
T_FINISHED = "2025-05-01T12:34:56Z"
GFD_A100_80 = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/gfd.timestamp": "1714557600",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.machine": "DGXA100-920-23687-2530-000",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
}
MIG_LABELS = {
    "nvidia.com/mig-1g.10gb.count": "56",
    "nvidia.com/mig-1g.10gb.engines.copy": "1",
    "nvidia.com/mig-1g.10gb.memory": "9728",
    "nvidia.com/mig-1g.10gb.multiprocessors": "14",
    "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
    "nvidia.com/mig-1g.10gb.replicas": "1",
    "nvidia.com/mig.config": "all-1g.10gb",
    "nvidia.com/mig.config.state": "success",
}


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.pods.test"))


def node(
    name: str = NODE,
    *,
    labels: dict[str, str] | None = None,
    allocatable_memory: str = "1056375952Ki",
    gpus: int = 8,
    extra_resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    base_labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p4de.24xlarge",
        "topology.kubernetes.io/zone": "us-east-1a",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    base_labels.update(GFD_A100_80 if labels is None else labels)
    resources = {
        "cpu": "96",
        "ephemeral-storage": "3750000000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": "110",
    }
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    resources.update(extra_resources or {})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.nodes.test")),
            "resourceVersion": "88123",
            "creationTimestamp": "2025-04-01T08:00:00Z",
            "labels": base_labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {**resources, "memory": "1081599368Ki"},
            "allocatable": {**resources, "memory": allocatable_memory},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2025-05-01T12:30:00Z",
                    "lastTransitionTime": "2025-04-01T08:01:00Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.12.7"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2d6a1c8c3e4f0f9a1b2c3d4e5f6a7b",
                "systemUUID": "ec2d6a1c-8c3e-4f0f-9a1b-2c3d4e5f6a7b",
                "bootID": "3f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                "kernelVersion": "5.15.0-1061-aws",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.12",
                "kubeletVersion": "v1.29.4",
                "kubeProxyVersion": "v1.29.4",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def container(
    name: str = "trainer",
    *,
    gpus: int | None = 8,
    mig: str | None = None,
    memory: str | None = "960Gi",
    cpu: str = "64",
    shm_volume: str | None = "dshm",
    env: list[dict[str, Any]] | None = None,
    policy: str = "File",
) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": cpu}
    if memory:
        limits["memory"] = memory
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = "1"
    mounts: list[dict[str, Any]] = []
    if shm_volume:
        mounts.append({"name": shm_volume, "mountPath": "/dev/shm"})
    mounts.append(
        {
            "name": "kube-api-access-x7k2p",
            "readOnly": True,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        }
    )
    return {
        "name": name,
        "image": "registry.example.com/ml/llm-train:2025.05",
        "command": ["torchrun", "--nproc-per-node=8", "train.py"],
        "env": env
        if env is not None
        else [
            {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ],
        "resources": {"limits": dict(limits), "requests": dict(limits)},
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": policy,
        "imagePullPolicy": "IfNotPresent",
    }


def shm_volume(
    name: str = "dshm", *, medium: str | None = "Memory", size_limit: str | None = "64Gi"
) -> dict[str, Any]:
    empty_dir: dict[str, Any] = {}
    if medium is not None:
        empty_dir["medium"] = medium
    if size_limit is not None:
        empty_dir["sizeLimit"] = size_limit
    return {"name": name, "emptyDir": empty_dir}


def _api_access_volume() -> dict[str, Any]:
    return {
        "name": "kube-api-access-x7k2p",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
            "defaultMode": 420,
        },
    }


def running(started: str = T_STARTED) -> dict[str, Any]:
    return {"running": {"startedAt": started}}


_ids = itertools.count(1)


def terminated(
    reason: str, exit_code: int, *, container_id: str | None = None, message: str | None = None
) -> dict[str, Any]:
    """A terminated state; every instance gets its own containerID unless one is given."""
    container_id = container_id or f"containerd://{next(_ids):064x}"
    t: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": T_STARTED,
        "finishedAt": T_FINISHED,
        "containerID": container_id,
    }
    if message is not None:
        t["message"] = message
    return {"terminated": t}


def waiting(reason: str = "CrashLoopBackOff") -> dict[str, Any]:
    return {
        "waiting": {
            "reason": reason,
            "message": "back-off 10s restarting failed container=trainer pod=x_ml-research(0)",
        }
    }


def container_status(
    name: str = "trainer",
    *,
    state: dict[str, Any] | None = None,
    last_state: dict[str, Any] | None = None,
    restart_count: int = 0,
    container_id: str = "containerd://" + "b2" * 32,
) -> dict[str, Any]:
    state = state or running()
    ready = "running" in state
    return {
        "name": name,
        "state": state,
        "lastState": last_state or {},
        "ready": ready,
        "restartCount": restart_count,
        "image": "registry.example.com/ml/llm-train:2025.05",
        "imageID": "registry.example.com/ml/llm-train@sha256:" + "c3" * 32,
        "containerID": container_id,
        "started": ready,
    }


def pod(
    name: str,
    *,
    namespace: str = NS,
    containers: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    owner: tuple[str, str, str] | None = ("batch/v1", "Job", "llm-pretrain"),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    node_name: str = NODE,
    resource_version: str = "1000",
    restart_policy: str = "Never",
    deleting: bool = False,
) -> dict[str, Any]:
    containers = containers if containers is not None else [container()]
    volumes = volumes if volumes is not None else [shm_volume()]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid(f"{namespace}/{name}"),
        "resourceVersion": resource_version,
        "creationTimestamp": T_CREATED,
        "labels": labels if labels is not None else {"app": "llm-pretrain", "team": "nlp"},
        "annotations": annotations if annotations is not None else {"oom-triage.io/team": "nlp-research"},
    }
    if owner is not None:
        api_version, kind, owner_name = owner
        meta["generateName"] = f"{owner_name}-"
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{kind}/{owner_name}.test")),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if deleting:
        meta["deletionTimestamp"] = "2025-05-01T12:34:50Z"
        meta["deletionGracePeriodSeconds"] = 30
    statuses = statuses if statuses is not None else [container_status(c["name"]) for c in containers]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "volumes": [*volumes, _api_access_volume()],
            "containers": containers,
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node_name,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": phase,
            "conditions": [
                {
                    "type": "PodReadyToStartContainers",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": T_STARTED,
                },
                {
                    "type": "Initialized",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": T_CREATED,
                },
                {
                    "type": "Ready",
                    "status": "True" if phase == "Running" else "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": T_STARTED,
                },
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": T_CREATED,
                },
            ],
            "hostIP": "10.0.12.7",
            "hostIPs": [{"ip": "10.0.12.7"}],
            "podIP": "10.244.3.17",
            "podIPs": [{"ip": "10.244.3.17"}],
            "startTime": T_CREATED,
            "containerStatuses": statuses,
            "qosClass": "Guaranteed",
        },
    }


def with_status(p: dict[str, Any], *, phase: str, statuses: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    """The same pod later: new phase, container statuses and resourceVersion."""
    out = copy.deepcopy(p)
    out["status"]["phase"] = phase
    out["status"]["containerStatuses"] = statuses
    out["metadata"]["resourceVersion"] = rv
    for c in out["status"]["conditions"]:
        if c["type"] == "Ready":
            c["status"] = "True" if phase == "Running" else "False"
    return out


CUDA_OOM_LOG = """\
2025-05-01T12:34:50.000000000Z stderr F [rank0]: Traceback (most recent call last):
2025-05-01T12:34:50.000000000Z stderr F [rank0]:   File "/workspace/train.py", line 212, in <module>
2025-05-01T12:34:50.000000000Z stderr F [rank0]:     loss.backward()
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 74.12 GiB is allocated by PyTorch, and 2.95 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
E0501 12:34:55.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 77) of binary: /usr/bin/python3
"""

SHM_LOG = """\
Epoch 3: 41%|####      | 1203/2934
ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.
"""

PLAIN_ERROR_LOG = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 12, in <module>
    import flash_attn
ModuleNotFoundError: No module named 'flash_attn'
"""
