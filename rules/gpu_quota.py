"""gpu_quota: the job hit a limit the platform set below the GPU it was promised.

Allocator behaviour relied on: three platform limits look like an ordinary OOM to PyTorch.
- A per-process memory fraction (``torch.cuda.set_per_process_memory_fraction``, often set by a
  platform wrapper): the allocator rejects a new segment when reserved + segment > cap *without asking
  the device*, so the device still has free memory; the message says "{cap} allowed" or "Allocation
  was preemptively rejected because it would exceed per_process_memory_fraction limit".
- A MIG slice: the device total is the slice's memory (e.g. 1g.10gb of an 80 GB A100), the device name
  carries "MIG", and some drivers surface the OOM as an NVML INTERNAL ASSERT in CUDACachingAllocator.
- A virtual-GPU layer (HAMi-core and the like) or a node whose GPU is smaller than the one the job was
  declared for: the limit the job runs into is below the memory it was promised.
The verdict needs the job's demand to fit what it was promised (the device total, the declared size):
a job that would not fit the full GPU either is too large, not limited.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rules.base import CANDIDATE, LEAD, LIKELY, POSSIBLE, STRONG, Finding
from triage.units import GiB, human

if TYPE_CHECKING:
    from triage.evidence import Evidence

ID = "gpu_quota"
VERDICT = "gpu_quota"
OWNER = "platform"


def _profile_bytes(profile: str) -> int | None:
    """The memory a MIG profile's name states ("3g.40gb": 40 GB, GiB in NVIDIA's naming)."""
    m = re.match(r"\d{1,2}g\.(\d{1,3})gb", profile or "")
    return int(m.group(1)) * GiB if m else None


def evaluate(ev: Evidence) -> Finding | None:
    if not ev.is_cuda_oom:
        return None
    f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    needed = ev.needed_bytes
    req = ev.request_bytes or 0
    total = ev.total_bytes
    cap = ev.fraction_cap_bytes
    if ev.fraction_rejected or (cap and total and cap < total * 0.98):
        what = f"{human(cap)} of {human(total)}" if cap and total else "a fraction of the GPU"
        f.facts.append(
            f"A per-process memory cap limits this process to {what} (set_per_process_memory_fraction)."
        )
        f.values["fraction_cap_bytes"] = cap
        free = ev.device_free_bytes
        if ev.fraction_rejected:
            f.facts.append(
                "The allocator rejected the request pre-emptively because of the cap, not for lack of device memory."
            )
            f.score = STRONG
        elif free is not None and free >= req:
            f.facts.append(f"The device still had {human(free)} free, enough for the {human(req)} request.")
            f.score = STRONG
        else:
            f.score = POSSIBLE
        if needed is not None and total and needed > total:
            f.score = CANDIDATE
        declared = ev.declared_total_bytes
        split = ev.own_others_bytes
        if ev.cap_set_by_job:
            f.facts.append(
                f"The job's own code set the cap ({ev.cap_set_by_job}): the limit is the job's, not the platform's."
            )
            f.score = CANDIDATE
        elif cap and declared and declared <= cap * 1.05:
            f.facts.append(f"The job was declared for {human(declared)}: the cap is the share it asked for.")
            f.score = CANDIDATE
        elif cap and total and split >= 0.8 * (total - cap):
            f.facts.append(
                f"The job's own other processes hold {human(split)} of the same GPU: the cap looks like the job "
                "dividing its GPU between its processes, not a platform limit."
            )
            f.missing.append(
                "who set the memory fraction (the platform's injected settings or the job's code)"
            )
            f.score = min(f.score, LEAD)
        f.actions.append(
            "Raise or remove the memory fraction cap for this job (the platform wrapper or "
            "torch.cuda.set_per_process_memory_fraction), or request a whole GPU."
        )
    if ev.mig_profile:
        size = f" with {human(total)} of GPU memory" if total else ""
        f.facts.append(f"The job runs on a MIG slice ({ev.mig_profile}){size}, not a whole GPU.")
        f.values["mig_profile"] = ev.mig_profile
        s = LIKELY if needed is None or total is None or needed >= total * 0.9 else POSSIBLE
        if needed is None and ev.mig_profile == ev.log_mig_profile:
            # only a log line says it is a slice, nothing says how full it was: a lead, not a verdict
            s = LEAD
            f.missing.append("the OOM message's numbers or the collector's device record for the slice")
        # the slice's own size, when nothing measured it, is what its profile names ("1g.10gb")
        size_of = total or _profile_bytes(ev.mig_profile)
        if ev.declared_total_bytes and size_of and ev.declared_total_bytes > size_of * 1.05:
            f.facts.append(
                f"The job was declared for {human(ev.declared_total_bytes)}, more than the slice it runs on."
            )
            s = STRONG
        elif ev.declared_total_bytes and total:
            # the job was promised this slice's size: the slice is what it asked for, not a limit below it
            f.facts.append(
                f"The job was declared for {human(ev.declared_total_bytes)}: the slice is the size it asked for."
            )
            s = CANDIDATE
        f.score = max(f.score, s)
        f.actions.append(
            f"Request a larger MIG profile than {ev.mig_profile} (or a full GPU) in the pod's resources, "
            "or shrink the job to fit the slice."
        )
    if ev.declared_total_bytes and total and ev.declared_total_bytes > total * 1.05 and not ev.mig_profile:
        f.facts.append(
            f"The job was declared for a GPU with {human(ev.declared_total_bytes)} but runs on one with {human(total)}."
        )
        f.values["declared_total_bytes"] = ev.declared_total_bytes
        fits = needed is None or needed <= ev.declared_total_bytes
        f.score = max(f.score, STRONG if fits else POSSIBLE)
        f.actions.append(
            "Fix the scheduling: the node selector / GPU product label must match the GPU the job was sized for."
        )
    physical = ev.physical_bytes or None
    limit = ev.vgpu_limit_bytes
    below = bool(limit and physical and limit < physical)
    if limit and (below or not ev.named_total_bytes):
        if below:
            f.facts.append(
                f"A virtual-GPU layer limits the job to {human(limit)} of the device's {human(physical or 0)}."
            )
            f.score = max(f.score, LIKELY + 0.05)
        else:
            # the layer reports its limit as the device's total: a share of a GPU whose size is not in this
            # input, like a MIG slice with nothing saying what the job asked for
            f.facts.append(
                f"A virtual-GPU layer limits the job to {human(limit)}, a share of a GPU whose size (and the share "
                "the job asked for) is not in this input."
            )
            f.missing.append(
                "the device's product name and the vGPU memory the job requested (nvidia.com/gpumem)"
            )
            f.score = max(f.score, LIKELY if needed is None or needed >= 0.9 * limit else POSSIBLE)
        declared = ev.declared_total_bytes
        if declared and declared <= limit * 1.05:
            f.facts.append(f"The job was declared for {human(declared)}: the share is the size it asked for.")
            f.score = CANDIDATE
        f.values["vgpu_limit_bytes"] = limit
        f.actions.append("Raise the job's vGPU memory quota (e.g. nvidia.com/gpumem) or give it a whole GPU.")
    slice_name = ev.slice_sized
    if f.score <= 0 and slice_name and total:
        f.facts.append(
            f"The device has {human(total)}: the size of a MIG slice ({slice_name}), not of a whole datacenter GPU."
        )
        f.missing.append(
            "the device name, MIG profile and the GPU the job asked for (the collector records them)"
        )
        f.score = POSSIBLE if needed is None or needed >= 0.9 * total else CANDIDATE
        f.actions.append(
            "Check the pod's GPU resource: a nvidia.com/mig-* slice may be smaller than the job was sized for."
        )
    if f.score <= 0 and ev.device_unseen:
        f.facts.append(
            "The device's size is unknown (this input has no OOM message or device record): a MIG slice or a "
            "memory cap below what the job was sized for cannot be ruled out."
        )
        f.missing.append("the device's total memory (the OOM message) and its MIG profile")
        f.score = CANDIDATE
    if f.score <= 0 and ev.device_had_room:
        f.facts.append(
            f"The device had {human(ev.device_free_bytes or 0)} free after the failure, far more than the "
            f"{human(req)} requested: a limit below the device's own (a fraction cap set outside the job's code, "
            "a virtual-GPU layer) would refuse it so, and this input does not show one either way."
        )
        f.missing.append("the job's memory cap settings and nvidia-smi at the time of the OOM")
        f.score = CANDIDATE
    m = ev.message
    if f.score <= 0 and m is not None and m.format == "nvml-assert":
        f.facts.append(
            "The OOM surfaced as an NVML INTERNAL ASSERT in the caching allocator: that is how it shows on MIG "
            "slices (and in containers where NVML cannot see the process)."
        )
        f.missing.append("the device name or MIG profile (the collector records both) to confirm a slice")
        f.score = POSSIBLE
        f.actions.append(
            "Check the pod's GPU resource: a nvidia.com/mig-* slice may be smaller than the job needs."
        )
    if f.score <= 0:
        return None
    return f
