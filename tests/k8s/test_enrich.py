"""Pod/node facts in the bundle's vocabulary, merged without overriding the collector's measurements, and
read by the evidence and the contract code as they are."""

from __future__ import annotations

import copy
from typing import Any

from tests.k8s.fakekube import FakeKubeAPI
from tests.k8s.k8sobjects import MIG_LABELS, container, container_status, node, pod, shm_volume
from triage.k8s.client import KubeClient
from triage.k8s.enrich import enrich_bundle, merge_missing, owner_chain, pod_facts

GiB = 1024**3
MiB = 1024**2


def _bundle(**workload: Any) -> dict[str, Any]:
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "2b4f7f3e-0d8c-4c57-9a53-5f1f6a0d3f11",
        "occurred_at": "2025-05-01T12:34:56Z",
        "kind": "cuda_oom",
        "workload": {"namespace": "ml-research", "pod": "llm-pretrain-abcde", **workload},
    }


def test_whole_gpu_pod_facts() -> None:
    facts = pod_facts(pod("llm-pretrain-abcde"), node())
    wl, dev, host, k8s = facts["workload"], facts["device"], facts["host"], facts["k8s"]
    assert wl["namespace"] == "ml-research" and wl["pod"] == "llm-pretrain-abcde"
    assert wl["node"] == "gpu-a100-07" and wl["container"] == "trainer"
    assert (wl["job"], wl["owner_kind"], wl["owner_name"]) == ("llm-pretrain", "Job", "llm-pretrain")
    assert wl["team"] == "nlp-research"  # the oom-triage.io/team annotation beats the `team` label
    assert wl["labels"] == {"app": "llm-pretrain", "team": "nlp"}
    assert dev == {"name": "NVIDIA-A100-SXM4-80GB", "declared_total_bytes": 81920 * MiB}
    assert host == {"shm_total_bytes": 64 * GiB, "cgroup": {"memory_limit_bytes": 960 * GiB}}
    assert k8s["shm_medium"] == "Memory" and k8s["shm_size_limit_bytes"] == 64 * GiB
    assert k8s["gpu_count"] == 8 and k8s["cpu_request"] == "64" and k8s["memory_limit_bytes"] == 960 * GiB
    assert k8s["gpu_resources"] == {"nvidia.com/gpu": 8}
    assert k8s["node_labels"]["nvidia.com/gpu.memory"] == "81920"
    assert "kubernetes.io/hostname" not in k8s["node_labels"]
    assert k8s["pod_uid"] and k8s["qos_class"] == "Guaranteed"
    assert facts["environment"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_mig_slice_facts() -> None:
    mig_node = node("gpu-mig-01", labels={**MIG_LABELS, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    p = pod("bert-worker-0", containers=[container(gpus=None, mig="1g.10gb", memory="64Gi", cpu="4")])
    facts = pod_facts(p, mig_node)
    assert facts["device"] == {
        "mig_mode": True,
        "mig_profile": "1g.10gb",
        "name": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
    }
    assert facts["k8s"]["mig_profile"] == "1g.10gb" and facts["k8s"]["mig_memory_bytes"] == 9728 * MiB
    assert facts["k8s"]["gpu_count"] == 1  # a slice counts as one GPU for the CPU-per-GPU contract


def test_single_strategy_mig_node() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/mig.strategy": "single",
    }
    facts = pod_facts(pod("x", containers=[container(gpus=1)]), node(labels=labels))
    assert facts["device"]["mig_profile"] == "1g.5gb" and facts["device"]["mig_mode"] is True
    assert "declared_total_bytes" not in facts["device"]  # the label is the slice's memory, not a promise
    assert facts["k8s"]["mig_memory_bytes"] == 4864 * MiB


def test_shm_shapes() -> None:
    # nothing at /dev/shm: the runtime's 64 MiB
    bare = pod("bare", containers=[container(shm_volume=None)], volumes=[])
    facts = pod_facts(bare, node())
    assert facts["host"]["shm_total_bytes"] == 64 * MiB
    assert facts["k8s"]["shm_medium"] == "none" and "shm_size_limit_bytes" not in facts["k8s"]
    # Memory emptyDir without sizeLimit: the tmpfs is sized to the pod's memory limit
    nolimit = pod("m", containers=[container(memory="128Gi")], volumes=[shm_volume(size_limit=None)])
    assert pod_facts(nolimit, node())["host"]["shm_total_bytes"] == 128 * GiB
    # ... and to the node's allocatable memory when the pod has no memory limit either
    unbounded = pod("u", containers=[container(memory=None)], volumes=[shm_volume(size_limit=None)])
    facts = pod_facts(unbounded, node(allocatable_memory="512Gi"))
    assert facts["host"]["shm_total_bytes"] == 512 * GiB
    assert facts["k8s"]["memory_limit_bytes"] is None and "cgroup" not in facts["host"]
    # a sizeLimit above the pod limit is capped by it (the pages count against the pod's memory)
    capped = pod("c", containers=[container(memory="32Gi")], volumes=[shm_volume(size_limit="64Gi")])
    assert pod_facts(capped, node())["host"]["shm_total_bytes"] == 32 * GiB
    # disk-backed emptyDir: medium "", its sizeLimit
    disk = pod("d", volumes=[shm_volume(medium=None, size_limit="8Gi")])
    facts = pod_facts(disk, node())
    assert facts["k8s"]["shm_medium"] == "" and facts["host"]["shm_total_bytes"] == 8 * GiB
    # the node's /dev/shm through a hostPath
    host_path = pod("h", volumes=[{"name": "dshm", "hostPath": {"path": "/dev/shm", "type": "Directory"}}])
    facts = pod_facts(host_path, node())
    assert facts["k8s"]["shm_medium"] == "Memory" and facts["k8s"]["shm_source"] == "hostPath:/dev/shm"
    assert "shm_total_bytes" not in facts["host"]


def test_owner_resolution_from_pod_alone() -> None:
    jobset = pod(
        "js",
        owner=("batch/v1", "Job", "pretrain-workers-0"),
        labels={
            "jobset.sigs.k8s.io/jobset-name": "pretrain",
            "batch.kubernetes.io/job-name": "pretrain-workers-0",
        },
    )
    assert [(o["kind"], o["name"]) for o in owner_chain(jobset)] == [
        ("Job", "pretrain-workers-0"),
        ("JobSet", "pretrain"),
    ]
    assert pod_facts(jobset)["workload"]["job"] == "pretrain"
    ptj = pod(
        "bert-worker-1",
        owner=("kubeflow.org/v1", "PyTorchJob", "bert"),
        labels={
            "training.kubeflow.org/job-name": "bert",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
        },
    )
    assert [(o["kind"], o["name"]) for o in owner_chain(ptj)] == [("PyTorchJob", "bert")]
    ray = pod(
        "raycluster-gpu-worker-x",
        owner=("ray.io/v1", "RayCluster", "rayjob-sample-raycluster-k8k7q"),
        labels={
            "ray.io/cluster": "rayjob-sample-raycluster-k8k7q",
            "ray.io/originated-from-crd": "RayJob",
            "ray.io/originated-from-cr-name": "rayjob-sample",
        },
    )
    wl = pod_facts(ray)["workload"]
    assert (wl["owner_kind"], wl["job"]) == ("RayJob", "rayjob-sample")
    loose = pod("loose", owner=None, labels={"job-name": "legacy"})
    assert pod_facts(loose)["workload"]["owner_kind"] == "Job"
    assert "job" not in pod_facts(pod("alone", owner=None, labels={}))["workload"]


def test_rank_env_and_training_container_choice() -> None:
    env = [{"name": "RANK", "value": "3"}, {"name": "WORLD_SIZE", "value": "16"}]
    p = pod(
        "ptj-worker-3",
        containers=[container("sidecar", gpus=None, shm_volume=None), container("pytorch", env=env)],
    )
    facts = pod_facts(p)
    assert facts["workload"]["container"] == "pytorch"
    assert facts["workload"]["rank"] == 3 and facts["workload"]["world_size"] == 16


def test_merge_never_overrides_measurements() -> None:
    bundle = {
        "workload": {"namespace": "ml-research", "pod": "p", "team": "from-env", "labels": None},
        "device": {"name": "NVIDIA A100-SXM4-80GB", "total_bytes": 85_000_000_000},
        "host": {
            "shm_total_bytes": 67_108_864,
            "cgroup": {"version": 2, "memory_limit_bytes": None, "memory_usage_bytes": 1},
        },
    }
    facts = pod_facts(pod("p"), node())
    out = merge_missing(copy.deepcopy(bundle), facts)
    assert out["workload"]["team"] == "from-env" and out["workload"]["labels"] == {
        "app": "llm-pretrain",
        "team": "nlp",
    }
    assert out["device"]["name"] == "NVIDIA A100-SXM4-80GB" and out["device"]["total_bytes"] == 85_000_000_000
    assert out["device"]["declared_total_bytes"] == 81920 * MiB
    assert out["host"]["shm_total_bytes"] == 67_108_864
    assert out["host"]["cgroup"] == bundle["host"]["cgroup"]  # read by the collector: kept whole
    assert out["k8s"]["shm_medium"] == "Memory"


def test_enrich_bundle_through_the_client(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    fake_api.add_pod(pod("llm-pretrain-abcde"))
    fake_api.add_node(node())
    out = enrich_bundle(_bundle(), kube)
    assert out["workload"]["job"] == "llm-pretrain" and out["device"]["declared_total_bytes"] == 81920 * MiB
    assert out["host"]["shm_total_bytes"] == 64 * GiB and "enrich_error" not in out["k8s"]
    assert [p for p, _ in fake_api.requests] == [
        "/api/v1/namespaces/ml-research/pods/llm-pretrain-abcde",
        "/api/v1/nodes/gpu-a100-07",
    ]
    # the collector's node wins (the pod may have been recreated elsewhere since)
    fake_api.add_node(node("gpu-a100-09", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
    out = enrich_bundle(_bundle(node="gpu-a100-09"), kube)
    assert out["workload"]["node"] == "gpu-a100-09" and out["device"]["name"] == "NVIDIA-A100-SXM4-40GB"


def test_enrich_bundle_degrades_without_raising(fake_api: FakeKubeAPI, kube: KubeClient) -> None:
    original = _bundle(pod="gone")
    out = enrich_bundle(original, kube)
    assert out["k8s"]["enrich_error"] == "pod ml-research/gone not found"
    assert out["workload"] == original["workload"] and "k8s" not in original
    fake_api.add_pod(pod("llm-pretrain-abcde"))
    fake_api.forbidden_nodes.add("gpu-a100-07")
    out = enrich_bundle(_bundle(), kube)
    assert "403" in out["k8s"]["enrich_error"] and out["host"]["shm_total_bytes"] == 64 * GiB
    assert "name" not in out.get("device", {})
    fake_api.fail["/api/v1/namespaces/ml-research/pods/llm-pretrain-abcde"] = 500
    out = enrich_bundle(_bundle(), kube)
    assert "500" in out["k8s"]["enrich_error"] and "job" not in out["workload"]
    assert enrich_bundle({"kind": "cuda_oom"}, kube) == {"kind": "cuda_oom"}  # names no pod: untouched


def test_facts_feed_the_contract_and_the_evidence() -> None:
    from triage.contract.evidence import pod_violations
    from triage.contract.load import load_contract
    from triage.pipeline import diagnose_bundle

    bare = pod("bare", containers=[container(shm_volume=None, memory=None)], volumes=[])
    bundle = _bundle(pod="bare")
    bundle["kind"] = "shm_exhausted"
    bundle["error"] = {
        "type": "RuntimeError",
        "message": "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible "
        "that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
    }
    merge_missing(bundle, pod_facts(bare, node()))
    checks = {v.check: v for v in pod_violations(bundle, load_contract())}
    assert checks["shm.medium"].severity == "fail" and checks["shm.medium"].related_verdict == "shm_exhausted"
    assert checks["memory.limit"].severity == "fail"
    diagnosis, ev = diagnose_bundle(bundle)
    assert diagnosis.verdict == "shm_exhausted"
    assert ev.shm_total_bytes == 64 * MiB
    facts = " ".join(str(e) for e in diagnosis.to_dict()["evidence"])
    assert "64 MiB" in facts and "/dev/shm" in facts


def test_mig_facts_make_gpu_quota_evidence() -> None:
    from triage.pipeline import diagnose_bundle

    mig_node = node("gpu-mig-01", labels={**MIG_LABELS, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    p = pod("bert-worker-0", containers=[container(gpus=None, mig="1g.10gb", memory="64Gi", cpu="4")])
    bundle = _bundle(pod="bert-worker-0")
    bundle["error"] = {
        "type": "torch.OutOfMemoryError",
        "message": "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 9.50 GiB of which "
        "512.00 MiB is free. Including non-PyTorch memory, this process has 8.98 GiB memory in use. Of the "
        "allocated memory 8.50 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.",
    }
    merge_missing(bundle, pod_facts(p, mig_node))
    diagnosis, ev = diagnose_bundle(bundle)
    assert ev.mig_profile == "1g.10gb"
    assert "gpu_quota" in {diagnosis.verdict, *diagnosis.to_dict()["candidates"]}


def test_running_pod_statuses_give_restart_facts() -> None:
    p = pod("r", statuses=[container_status(restart_count=4)])
    assert pod_facts(p)["k8s"]["container_restart_count"] == 4
    assert "restart_count" not in pod_facts(p)["workload"]  # only the watcher knows which instance crashed


def test_the_service_analysis_adds_pod_facts_and_contract_violations(
    fake_api: FakeKubeAPI, kube: KubeClient, tmp_path: Any
) -> None:
    """The analysis step (`triage.service.analysis`) enriches a bundle that names a pod: a pod without a
    Memory-backed /dev/shm gets the 64 MiB default as evidence, and the contract's shm floor is cited.
    (No API server runs here: the client talks to the local recorded-shape server.)"""
    import gzip
    import json

    from triage.service import analysis

    fake_api.add_pod(pod("loader-abcde", containers=[container(shm_volume=None)], volumes=[]))
    fake_api.add_node(node())
    bundle = _bundle(pod="loader-abcde")
    bundle.update(
        {
            "kind": "shm_exhausted",
            "error": {
                "type": "RuntimeError",
                "message": "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.",
            },
        }
    )
    blob = tmp_path / "b.json.gz"
    blob.write_bytes(gzip.compress(json.dumps(bundle).encode()))
    analysis._K8S_CLIENT[:] = [kube]
    try:
        d = analysis.analyse_blob(str(blob), "gzip", "auto")
        off = analysis.analyse_blob(str(blob), "gzip", "off")
    finally:
        analysis._K8S_CLIENT.clear()
    assert d["verdict"] == "shm_exhausted"
    facts = " ".join(e["fact"] for e in d["evidence"])
    off_facts = " ".join(e["fact"] for e in off["evidence"])
    assert "/dev/shm is 64.0 MiB" in facts and "/dev/shm is" not in off_facts
    assert "64 MiB default" in facts
    assert "below the contract floor" in facts  # the pod's contract violation, cited as evidence
    assert d["confidence"] > off["confidence"]
