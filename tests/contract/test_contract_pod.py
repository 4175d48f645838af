"""The pod audit: real facts of this machine, and cgroup v1/v2 + sysfs NUMA layouts from fixture trees."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import ROOTS, GiB, Result, run_process
from triage.contract.checks import GpuNuma, numa_check
from triage.contract.load import ContractFile
from triage.contract.pod import (
    CgroupFacts,
    NvmlGpu,
    audit_pod,
    collect,
    normalize_bus_id,
    read_cgroup,
    read_gpu_numa,
    read_shm,
    visible,
)

NODE0 = [*range(0, 16), *range(32, 48)]
NODE1 = [*range(16, 32), *range(48, 64)]


# --- cgroup layouts ------------------------------------------------------------------------------


def test_cgroup_v1_kubernetes_layout() -> None:
    # container limit 32Gi under a pod limit of 30Gi: the effective limit is the smaller, up the hierarchy
    assert read_cgroup(ROOTS / "v1") == CgroupFacts(
        version=1,
        path="/sys/fs/cgroup/memory/kubepods/burstable/pod5f1c/0c2e9d",
        memory_limit_bytes=30 * GiB,
        memory_usage_bytes=12 * GiB,
        oom_kill_count=2,
        cpu_quota_millicores=8000,
    )


def test_cgroup_v1_container_view_unlimited() -> None:
    # /proc/self/cgroup names a host path that is not mounted here: the mount root is the container's cgroup
    assert read_cgroup(ROOTS / "v1_unlimited") == CgroupFacts(
        version=1,
        path="/sys/fs/cgroup/memory",
        memory_limit_bytes=None,
        memory_usage_bytes=36069376,
        oom_kill_count=0,
        cpu_quota_millicores=None,
    )


def test_cgroup_v2_systemd_layout() -> None:
    # the container's memory.max is "max"; the pod slice above it caps at 64Gi; cpu.max 400000/100000 = 4 CPUs
    assert read_cgroup(ROOTS / "v2") == CgroupFacts(
        version=2,
        path="/sys/fs/cgroup/kubepods.slice/kubepods-pod7a2b.slice/cri-containerd-91ef.scope",
        memory_limit_bytes=64 * GiB,
        memory_usage_bytes=20 * GiB,
        oom_kill_count=1,
        cpu_quota_millicores=4000,
    )


def test_cgroup_v2_namespace_root_unlimited() -> None:
    assert read_cgroup(ROOTS / "v2_unlimited") == CgroupFacts(
        version=2,
        path="/sys/fs/cgroup",
        memory_limit_bytes=None,
        memory_usage_bytes=1048576,
        oom_kill_count=0,
        cpu_quota_millicores=None,
    )


def test_cgroup_hybrid_prefers_the_v1_memory_controller(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/\n0::/\n")
    (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text("8589934592\n")
    (tmp_path / "sys/fs/cgroup/unified").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/unified/cgroup.controllers").write_text("\n")
    facts = read_cgroup(tmp_path)
    assert facts is not None and (facts.version, facts.memory_limit_bytes) == (1, 8 * GiB)


def test_no_cgroup_is_none(tmp_path: Path) -> None:
    assert read_cgroup(tmp_path) is None


def test_pod_audit_on_v1_fixture(contract_file: ContractFile) -> None:
    report = audit_pod(contract_file, root=ROOTS / "v1", use_nvml=False, cuda_visible_devices="0,1")
    checks = {c.id: c for c in report.checks}
    assert checks["memory.limit"].status == "pass"
    assert checks["memory.limit"].sentence == "memory cgroup limit 30 GiB, 12 GiB in use (40%)"
    assert checks["memory.oom_kills"].status == "warn"
    assert checks["memory.oom_kills"].sentence == "the memory cgroup has recorded 2 OOM kills"
    assert checks["memory.oom_kills"].related_verdict == "host_memory_limit"
    cpus = min(len(os.sched_getaffinity(0)), 8)  # the CFS quota of 8 CPUs caps the affinity
    assert report.facts["cpu"]["effective_millicores"] == cpus * 1000
    assert report.facts["gpus"]["count"] == 2 and report.facts["gpus"]["source"] == "CUDA_VISIBLE_DEVICES"
    assert checks["cpu.per_gpu"].status == ("pass" if cpus >= 8 else "fail")
    assert checks["numa.gpu_node"].sentence == "cannot read GPU NUMA node (NVML unavailable)"
    assert report.facts["cgroup"]["version"] == 1


def test_pod_audit_on_v2_fixture_without_limit_fails(contract_file: ContractFile) -> None:
    report = audit_pod(contract_file, root=ROOTS / "v2_unlimited", use_nvml=False)
    (limit,) = [c for c in report.checks if c.id == "memory.limit"]
    assert limit.status == "fail" and limit.related_verdict == "host_memory_limit"
    assert report.exit_code == 1


def test_pod_namespace_from_service_account(tmp_path: Path, contract_file: ContractFile) -> None:
    ns_file = tmp_path / "var/run/secrets/kubernetes.io/serviceaccount/namespace"
    ns_file.parent.mkdir(parents=True)
    ns_file.write_text("dev-sandbox\n")
    report = audit_pod(contract_file, root=tmp_path, use_nvml=False)
    assert report.to_dict()["namespace"] == "dev-sandbox"
    assert report.to_dict()["contract_namespace"] == "dev-sandbox"


# --- NUMA ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "sysfs"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("00000001:AF:1F.7", "0001:af:1f.7"),
    ],
)
def test_normalize_bus_id(given: str, sysfs: str) -> None:
    assert normalize_bus_id(given) == sysfs


@pytest.mark.parametrize("bad", ["", "3b:00", "0000:3b:00.8", "gpu0", "100000000:3b:00.0"])
def test_bad_bus_id(bad: str) -> None:
    with pytest.raises(ValueError):
        normalize_bus_id(bad)


def test_sysfs_numa_lookup() -> None:
    root = ROOTS / "numa"
    assert read_gpu_numa("00000000:3B:00.0", root, index=0) == GpuNuma(0, "0000:3b:00.0", 0, NODE0)
    assert read_gpu_numa("0000:86:00.0", root) == GpuNuma(None, "0000:86:00.0", 1, NODE1)
    assert read_gpu_numa("0000:af:00.0", root) == GpuNuma(None, "0000:af:00.0", -1, None)
    missing = read_gpu_numa("0000:01:00.0", root)
    assert (missing.numa_node, missing.note) == (
        None,
        "/sys/bus/pci/devices/0000:01:00.0/numa_node is not readable",
    )


def test_numa_check_both_sides() -> None:
    gpu0 = read_gpu_numa("0000:3b:00.0", ROOTS / "numa", index=0)
    pinned = numa_check("pod", gpu0, [0, 1, 2, 3])
    assert (pinned.status, pinned.sentence) == (
        "pass",
        "GPU 0 (0000:3b:00.0) is on NUMA node 0 (CPUs 0-15,32-47); the process may run only on CPUs 0-3, all on that node",
    )
    remote = numa_check("pod", gpu0, [16, 17])
    assert remote.status == "fail"
    assert remote.sentence == (
        "GPU 0 (0000:3b:00.0) is on NUMA node 0 (CPUs 0-15,32-47), but the process may run only on CPUs 16-17, "
        "all on other nodes: every host-to-device copy crosses the socket interconnect"
    )
    spread = numa_check("pod", gpu0, list(range(64)))
    assert spread.status == "warn"
    assert spread.sentence == (
        "GPU 0 (0000:3b:00.0) is on NUMA node 0 (CPUs 0-15,32-47); the process may run on CPUs 0-63, of which 32 "
        "are on that node: DataLoader workers are not pinned and can land on a remote node"
    )
    assert (spread.value, spread.threshold) == ("0-63", "0-15,32-47")
    single = numa_check("pod", read_gpu_numa("0000:af:00.0", ROOTS / "numa"), [0, 1])
    assert single.status == "pass" and "numa_node -1" in single.sentence
    unknown = numa_check("pod", read_gpu_numa("0000:01:00.0", ROOTS / "numa"), [0, 1])
    assert unknown.status == "warn" and unknown.sentence.startswith(
        "cannot read the NUMA node of GPU 0000:01:00.0"
    )


def test_cli_numa_from_bus_ids_on_fixture(triage: Callable[..., Result]) -> None:
    rc, out, err = triage(
        "audit", "pod", "--json", "--no-nvml", "--root", str(ROOTS / "numa"),
        "--gpu-pci-bus-id", "00000000:3B:00.0", "--gpu-pci-bus-id", "0000:86:00.0",
    )  # fmt: skip
    assert err == ""
    report = json.loads(out)
    affinity = set(os.sched_getaffinity(0))
    numa = [c for c in report["checks"] if c["id"] == "numa.gpu_node"]
    assert [c["subject"] for c in numa] == ["GPU 0 (0000:3b:00.0)", "GPU 1 (0000:86:00.0)"]
    for check, node in zip(numa, (set(NODE0), set(NODE1)), strict=True):
        expected = "pass" if affinity <= node else "fail" if not affinity & node else "warn"
        assert check["status"] == expected
    assert report["facts"]["gpus"]["count"] == 2 and report["facts"]["gpus"]["source"] == "--gpu-pci-bus-id"
    rc, out, err = triage("audit", "pod", "--gpu-pci-bus-id", "gpu0")
    assert (rc, out) == (2, "")
    assert (
        err
        == "triage audit: error: --gpu-pci-bus-id: 'gpu0' is not a PCI bus id (expected e.g. 0000:3b:00.0)\n"
    )


def test_visible_follows_cuda_visible_devices() -> None:
    gpus = [
        NvmlGpu(i, "NVIDIA H100 80GB HBM3", f"GPU-{c * 8}", f"0000000{i}:00:00.0")
        for i, c in enumerate("abcd")
    ]
    assert visible(gpus, None) == gpus
    assert visible(gpus, "2,0") == [gpus[2], gpus[0]]
    assert visible(gpus, "GPU-cc,1") == [gpus[2], gpus[1]]
    assert visible(gpus, "1,7,2") == [gpus[1]]  # CUDA stops at the first invalid entry
    assert visible(gpus, "") == [] and visible(gpus, "-1") == []


class _FakeNvml(types.ModuleType):
    """A faithful stand-in for the few pynvml calls we make (pynvml is not installed here)."""

    def __init__(self, bus_ids: list[str], fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.bus_ids = bus_ids
        self.fail_init = fail_init
        self.shutdown = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdown += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.bus_ids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}-aaaa"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return types.SimpleNamespace(busId=self.bus_ids[h].encode())


def test_nvml_path_reads_sysfs_numa(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml(["00000000:3B:00.0", "00000000:86:00.0"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    facts, record = collect(root=ROOTS / "numa", cuda_visible_devices="1")
    assert facts.gpu_count == 1 and record["gpus"]["source"] == "nvml"
    assert facts.gpus_numa == [GpuNuma(1, "0000:86:00.0", 1, NODE1)]
    assert record["gpus"]["nvml"] == [
        {
            "index": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-00000001-aaaa",
            "pci_bus_id": "00000000:86:00.0",
        }
    ]
    assert fake.shutdown == 1
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml([], fail_init=True))
    facts, _ = collect(root=ROOTS / "numa")
    assert facts.gpus_numa is None and facts.numa_unavailable == "NVML unavailable: Driver Not Loaded"


# --- this machine, for real ----------------------------------------------------------------------


def test_read_shm_matches_statvfs() -> None:
    st = os.statvfs("/dev/shm")
    shm = read_shm("/dev/shm")
    assert shm is not None and shm.total_bytes == st.f_blocks * st.f_frsize
    assert read_shm("/nonexistent/shm") is None


def test_pod_audit_runs_for_real() -> None:
    proc = run_process("audit", "pod", "--json")
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    affinity = sorted(os.sched_getaffinity(0))
    facts = report["facts"]
    assert facts["shm"]["total_bytes"] == total
    assert facts["cpu"]["cpu_count"] == os.cpu_count()
    assert facts["cpu"]["affinity"] == affinity
    assert report["contract_version"] == "2025.1" and report["audit"] == "pod"
    checks = {c["id"]: c for c in report["checks"]}
    limit = (facts["cgroup"] or {}).get("memory_limit_bytes")
    assert checks["shm.size"]["value"] == (min(total, limit) if limit else total)
    floor, sla = 16 * GiB, 64 * GiB
    value = checks["shm.size"]["value"]
    assert checks["shm.size"]["status"] == ("fail" if value < floor else "warn" if value < sla else "pass")
    if facts["gpus"]["source"] != "nvml":
        assert checks["numa.gpu_node"]["status"] == "warn"
        assert checks["numa.gpu_node"]["sentence"].startswith("cannot read GPU NUMA node (NVML unavailable")
    if facts["cgroup"] is not None:
        assert checks["memory.limit"]["status"] == ("pass" if limit else "fail")
    assert proc.returncode == (1 if report["status"] == "fail" else 0)
    assert report["counts"]["fail"] == sum(c["status"] == "fail" for c in report["checks"])


def test_dataloader_workers_option(triage: Callable[..., Result]) -> None:
    rc, out, err = triage(
        "audit", "pod", "--json", "--no-nvml", "--root", str(ROOTS / "v2"), "--dataloader-workers", "0"
    )
    (check,) = [c for c in json.loads(out)["checks"] if c["id"] == "dataloader.workers"]
    assert (check["status"], check["value"], check["threshold"]) == ("warn", 0, 1)
    rc, out, err = triage("audit", "pod", "--dataloader-workers", "-1")
    assert (rc, out, err) == (2, "", "triage audit: error: --dataloader-workers must be 0 or more\n")
