"""What a log or a bundle says about the platform beside the OOM, each pinned on both sides:

- the node's GPU feature discovery label (``nvidia.com/gpu.memory=81920``, MiB) printed by a platform's
  start-up script is the size the job was scheduled for, as the pod enrichment reads it: a smaller device
  under it is the platform's; the label of the device it runs on decides nothing; so is the GKE accelerator
  the job asked for by a name that states its memory (``nvidia-a100-80gb``);
- a memory fraction printed as set from a file in the job's own source folder (its launcher beside its
  worker) is the job's own cap, not the platform's; one printed from elsewhere (a site hook) is not;
- host memory the job's log printed rising at nearly every step up to a kill at the pod's limit is the
  job's own growth, which a higher limit only puts off: the kill stays a lead; printed level, the limit decides.

The lines follow what NVIDIA's GPU feature discovery labels, torch's OOM message and common training loggers
print (no cluster runs here); the bundles follow docs/bundle.md.
"""

from __future__ import annotations

from typing import Any

from triage.pipeline import diagnose_bundle, diagnose_text

OOM_40 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.17 GiB. GPU 0 has a total capacity "
    "of 39.39 GiB of which 497.40 MiB is free. Including non-PyTorch memory, this process has 38.91 GiB memory "
    "in use. Of the allocated memory 37.82 GiB is allocated by PyTorch, and 596.12 MiB is reserved by PyTorch "
    "but unallocated.\n"
)
OOM_80 = OOM_40.replace("39.39 GiB of which", "79.15 GiB of which").replace(
    "38.91 GiB memory", "78.67 GiB memory"
)
TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/opt/asr/train.py", line 214, in main\n'
    "    loss = model(feats, tokens)\n"
    '  File "/opt/asr/conformer.py", line 188, in forward\n'
    "    x = self.ffn1(x) * 0.5 + x\n"
)


def _labelled(memory_mib: int, extra: str = "") -> str:
    return (
        "[platform-init] job=asr queue=a100-80g\n"
        f"[platform-init] node labels: nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB "
        f"nvidia.com/gpu.memory={memory_mib} nvidia.com/gpu.count=8\n{extra}"
        "[train] step   0%|          | 0/50000 [00:00<?, ?it/s]\n"
    )


def test_a_node_label_larger_than_the_device_is_the_size_the_job_was_scheduled_for() -> None:
    d, ev = diagnose_text(_labelled(81920) + TRACE + OOM_40)
    assert ev.declared_total_bytes == 81920 << 20
    assert d.verdict == "gpu_quota" and d.owner == "platform"
    assert any("declared for a GPU with 80.0 GiB" in e.fact for e in d.evidence)


def test_the_label_of_the_device_it_runs_on_decides_nothing() -> None:
    d, _ = diagnose_text(_labelled(81920) + TRACE + OOM_80)
    assert d.verdict != "gpu_quota"
    # two nodes' labels listed (a scheduler's dump): no one size was declared
    d, ev = diagnose_text(
        _labelled(81920, "[platform-init] other node: nvidia.com/gpu.memory=40960\n") + TRACE + OOM_40
    )
    assert ev.declared_total_bytes is None


HPO_OOM = (
    "[w0] Traceback (most recent call last):\n"
    '[w0]   File "/src/hpo_worker.py", line 131, in run_trial\n'
    "[w0]     loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())\n"
    '[w0]   File "/src/gpt.py", line 72, in forward\n'
    "[w0]     att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
    "[w0] torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 35.02 GiB is free. Including non-PyTorch memory, this process has 38.92 GiB "
    "memory in use. 39.58 GiB allowed; Of the allocated memory 37.71 GiB is allocated by PyTorch, and 702.00 MiB "
    "is reserved by PyTorch but unallocated.\n"
)


def _packed(where: str) -> str:
    return (
        "[packer] 2 workers per GPU requested (--workers-per-gpu 2)\n"
        f"[packer] worker 0: torch.cuda.set_per_process_memory_fraction(0.5, device=0)  # {where}:41\n"
        "[w0] trial 17   0%|          | 0/2000 [00:00<?, ?it/s]\n" + HPO_OOM
    )


def _asked(accelerator: str) -> str:
    return (
        f"platform-launcher: job asr spec: nodeSelector cloud.google.com/gke-accelerator: {accelerator} count=1\n"
        "[train] step   0%|          | 0/50000 [00:00<?, ?it/s]\n"
    )


def test_the_gke_accelerator_asked_for_is_the_size_the_job_was_scheduled_for() -> None:
    d, ev = diagnose_text(_asked("nvidia-a100-80gb") + TRACE + OOM_40)
    assert ev.log_asked_gpu == ("nvidia-a100-80gb", 80 << 30)
    assert d.verdict == "gpu_quota"
    # the GPU it asked for is the one it runs on (80 GiB named, 79.15 GiB reported), or the name states no size
    d, _ = diagnose_text(_asked("nvidia-a100-80gb") + TRACE + OOM_80)
    assert d.verdict != "gpu_quota"
    d, ev = diagnose_text(_asked("nvidia-l4") + TRACE + OOM_40)
    assert ev.log_asked_gpu is None and ev.declared_total_bytes is None


def test_a_fraction_set_from_the_jobs_own_source_folder_is_its_own_cap() -> None:
    d, ev = diagnose_text(_packed("src/packer.py"))
    assert ev.cap_set_by_job is not None and "packer.py" in ev.cap_set_by_job
    assert d.verdict != "gpu_quota"


def test_a_fraction_set_from_elsewhere_is_not_the_jobs() -> None:
    d, ev = diagnose_text(_packed("/opt/platform/hooks/sitecustomize.py"))
    assert ev.cap_set_by_job is None
    assert d.verdict == "gpu_quota"


def _killed(rss_gib: list[float]) -> dict[str, Any]:
    lines = "\n".join(
        f"2024-06-17 01:{k:02d}:00,654 [train] INFO step={100 + 250 * k} loss=2.91 host_rss={v:.2f}GiB "
        "gpu_alloc=41.70GiB"
        for k, v in enumerate(rss_gib)
    )
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "5b7f6f3e-2a55-4a4e-9a57-1f0b1c1d2e3f",
        "occurred_at": "2024-06-17T01:58:40Z",
        "kind": "host_oom",
        "error": {"type": "OOMKilled", "message": lines, "exit_code": 137},
        "host": {"cgroup": {"version": 2, "memory_limit_bytes": 64 << 30}},
    }


def test_host_memory_rising_at_every_print_up_to_the_kill_is_the_jobs_growth() -> None:
    """The kill is the limit's (the only verdict host memory has), at a lower confidence, with the job's own
    growth as the fact to act on."""
    d, ev = diagnose_bundle(_killed([9.0 + 2.3 * k for k in range(24)]))
    assert ev.host_growth is not None
    assert d.verdict == "host_memory_limit" and d.confidence < 0.7
    level, _ = diagnose_bundle(_killed([13.3, 13.4, 13.3, 13.4, 13.4, 13.3, 13.5, 13.4]))
    assert level.confidence > d.confidence
    fact = next(e.fact for e in d.evidence if "rose at nearly every print" in e.fact)
    assert "from 9.0 GiB at step 100" in fact
    assert any("Find what grows in host memory" in a for a in d.actions)


def test_host_memory_printed_level_leaves_the_kill_at_the_limit() -> None:
    d, ev = diagnose_bundle(_killed([13.3, 13.4, 13.3, 13.4, 13.4, 13.3, 13.5, 13.4]))
    assert ev.host_growth is None
    assert d.verdict == "host_memory_limit"
    # growth in a few prints only (a worker pool started, then level) is not a climb
    d, ev = diagnose_bundle(_killed([9.0, 9.0, 30.0, 30.1, 30.0, 30.1, 30.0, 30.1]))
    assert ev.host_growth is None and d.verdict == "host_memory_limit"
