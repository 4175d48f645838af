"""other_process: another process on the GPU holds the memory this job needed.

Allocator behaviour relied on: the caching allocator can only reserve what the device has free; memory
held by other processes (another job's CUDA context and tensors, a zombie from a previous run, a
monitoring agent) is invisible to PyTorch's accounting but shows in NVML's process list and in the OOM
message ("Process PID has X memory in use"). The job's own process appears there too — in a container
with its own PID namespace torch cannot tell it is itself and prints ``Process PID`` instead of
"this process" — so it is recognised by its pid (the collector records the job's pids) or, failing
that, by its usage matching the job's reservation plus its CUDA context; an nvidia-smi listing a log printed
before the job started holds only others. The verdict needs the other processes' memory to be what made
the difference: with it released, the request would have fitted.
A neighbour too small to count on its own still decides when the job had run in the margin it took: the
earlier steps at the same batch size peaked at what the failing moment needed and fitted, and the job is
short now by no more than the others hold. vLLM's check of the device's free memory at start-up, before it
loads anything, sees only other processes' memory besides its own CUDA context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rules.base import CANDIDATE, LIKELY, POSSIBLE, STRONG, Finding
from triage.evidence import CUDA_CONTEXT_MAX
from triage.units import GiB, MiB, human

if TYPE_CHECKING:
    from triage.evidence import Evidence

# in use outside the job's allocator, with no process lines to say whose, that only another process holds:
# half the device, or a quarter of it when that is also many GiB (a process's own CUDA context, NCCL buffers
# and library workspaces come to a few GiB at most; another framework preallocating in the same process is rare)
HELD_ELSEWHERE = 0.5
HELD_ELSEWHERE_LARGE = 0.25
HELD_ELSEWHERE_MIN = 8 * GiB


def held_elsewhere(non_pytorch: int, total: int) -> bool:
    """Whether memory outside the job's allocator is too much to be the job's own."""
    return non_pytorch >= HELD_ELSEWHERE * total or non_pytorch >= max(
        HELD_ELSEWHERE_LARGE * total, HELD_ELSEWHERE_MIN
    )


ID = "other_process"
VERDICT = "other_process"
OWNER = "platform"

MIN_OTHER_BYTES = 1 * GiB
OWN_CONTEXT = 512 * MiB  # a typical CUDA context of the job itself


LEAST_SHARE = 0.25  # of the device: what the others hold at least, whichever line is the job's
FIRST_STEP_NEARLY_ALL = 0.85  # of the device: what a first step already needed, unfinished, ...
SMALL_OTHERS = (
    0.1  # ... beside others holding at most this share: the neighbour is not shown to have decided it
)


def _least_other(ev: Evidence) -> int | None:
    """What the other processes hold at least when the job's own line is not known: it is one of the
    lines holding at least what PyTorch allocated, so the others hold all but the largest of those."""
    if ev.allocated_bytes is None:
        return None
    could_be_me = [p.used_bytes for p in ev.processes if p.used_bytes >= ev.allocated_bytes]
    if not could_be_me:
        return None
    return sum(p.used_bytes for p in ev.processes) - max(could_be_me)


def _alone_too_big(ev: Evidence) -> str | None:
    """A sentence when the job alone needed more than the whole device holds beside its own context."""
    needed, total = ev.needed_bytes, ev.total_bytes
    if not total or needed is None or needed <= total - OWN_CONTEXT:
        return None
    return f"The job alone needed {human(needed)} of {human(total)}: it would not fit even on an empty GPU."


def _first_step_nearly_all(ev: Evidence, others: int) -> str | None:
    """A sentence when the job failed in its first step, not finished, already holding nearly all of the
    device, beside others holding a small share of it: whether it would have fitted an empty GPU is not
    known (the rest of the step was still to come)."""
    needed, total = ev.needed_bytes, ev.total_bytes
    first = (ev.step is not None and ev.step <= 0) or bool(ev.first_step_bar)
    if not first or needed is None or not total:
        return None
    if needed < FIRST_STEP_NEARLY_ALL * total or others > SMALL_OTHERS * total:
        return None
    return (
        f"The job failed in its first step, unfinished, already needing {human(needed)} of the {human(total)} GPU "
        f"beside the others' {human(others)}: whether the whole step fits an empty GPU is not known."
    )


def evaluate(ev: Evidence) -> Finding | None:
    if not ev.is_cuda_oom:
        return None
    req = ev.request_bytes or 0
    free = ev.device_free_bytes or 0
    others = [p for p in ev.processes if not p.own]
    other_bytes = ev.other_process_bytes
    f = Finding(rule=ID, verdict=VERDICT, score=0.0)
    if others and other_bytes >= MIN_OTHER_BYTES:
        names = ", ".join(
            f"pid {p.pid} ({human(p.used_bytes)})"
            if p.pid is not None
            else f"no process listed ({human(p.used_bytes)})"
            for p in sorted(others, key=lambda p: -p.used_bytes)[:4]
        )
        if ev.own_process_identified:
            f.facts.append(f"Other processes hold {human(other_bytes)} on the GPU: {names}.")
        elif ev.log_smi_before_start:
            f.facts.append(
                f"nvidia-smi showed other processes holding {human(other_bytes)} on the GPU before the job showed "
                f"any progress: {names}. They were there before it."
            )
        elif ev.log_smi_after_exit:
            f.facts.append(
                f"nvidia-smi, run from the shell after the job had exited, showed other processes holding "
                f"{human(other_bytes)} on the GPU: {names}. The job's own process was gone; they were most likely "
                "there when it failed."
            )
        elif ev.own_absent:
            f.facts.append(
                f"Processes hold {human(other_bytes)} on the GPU: {names}. The job's process had not initialised "
                "CUDA, so none of them is the job."
            )
        else:
            f.facts.append(f"Processes on the GPU, none known to be the job itself: {names}.")
        f.values.update({"other_process_bytes": other_bytes, "processes": [p.pid for p in others]})
        fits_without = other_bytes + free >= req
        if not fits_without:
            f.facts.append("Even without them the request would not have fitted.")
            f.score = CANDIDATE
        elif ev.others_known:
            f.score = (
                STRONG if any(p.source == "nvml" for p in ev.processes) and ev.own_pids else LIKELY + 0.05
            )
            if ev.total_bytes and other_bytes < 0.05 * ev.total_bytes:
                f.score -= 0.2
        elif (
            (least := _least_other(ev)) is not None
            and ev.total_bytes
            and least >= LEAST_SHARE * ev.total_bytes
        ):
            f.facts.append(
                f"Which line is the job itself is not known, but whichever it is, the others hold at least "
                f"{human(least)} ({least / ev.total_bytes:.0%} of the GPU): the job's own process holds at least "
                "the memory PyTorch allocated, so only a line that large can be the job."
            )
            f.values["least_other_bytes"] = least
            f.score = LIKELY if least + free >= req else CANDIDATE
        else:
            f.score = POSSIBLE
            f.missing.append(
                "the job's own pids (the collector records them) to tell the job from its neighbours"
            )
        if ev.hit_own_limit:
            f.facts.append(
                f"The job ran into its own limit ({human(ev.limit_bytes or 0)}, a share of the GPU): what other "
                "processes held beyond that share did not decide."
            )
            f.score = min(f.score, CANDIDATE)
        if (alone := _alone_too_big(ev)) is not None:
            # the job alone needs the whole device: the neighbour is not what decided it
            f.facts.append(alone)
            f.score = min(f.score, CANDIDATE)
    elif others and (top := ev.neighbour_took_margin) is not None:
        names = ", ".join(f"pid {p.pid} ({human(p.used_bytes)})" for p in others[:4])
        f.facts.append(
            f"{len(ev.step_peaks)} earlier steps at this batch size peaked at {human(top)}, as much as this moment "
            f"needed, and fitted; now the job could hold {human(ev.usable_bytes or 0)}, less than that by no more "
            f"than other processes hold on the GPU ({names}): small, but they took the margin the steps ran in."
        )
        f.values["other_process_bytes"] = other_bytes
        f.score = LIKELY
    elif (unlisted := ev.unlisted_bytes or 0) >= MIN_OTHER_BYTES:
        own = sum(p.used_bytes for p in ev.processes)
        f.facts.append(
            f"The OOM message lists only the job's own process ({human(own)}, its non-PyTorch memory included), "
            f"yet {human(unlisted)} more of the {human(ev.total_bytes or 0)} GPU was in use: processes NVML did "
            "not list (another container's, a display's, an MPS client's) held it."
        )
        f.values["unlisted_bytes"] = unlisted
        f.missing.append("the NVML process list of the node (nvidia-smi on the host) to name them")
        if unlisted + free < req:
            f.facts.append("Even without them the request would not have fitted.")
            f.score = CANDIDATE
        elif (alone := _alone_too_big(ev)) is not None:
            f.facts.append(alone)
            f.score = CANDIDATE
        elif (first := _first_step_nearly_all(ev, unlisted)) is not None:
            f.facts.append(first)
            f.score = POSSIBLE
        else:
            f.score = LIKELY if ev.total_bytes and unlisted >= 0.05 * ev.total_bytes else POSSIBLE
    elif ev.non_pytorch_bytes is not None and ev.non_pytorch_bytes > CUDA_CONTEXT_MAX and not ev.processes:
        f.facts.append(
            f"{human(ev.non_pytorch_bytes)} of the GPU is in use outside this process's PyTorch allocator "
            "(total − free − reserved): another process, or non-PyTorch allocations of this one (NCCL, cuDNN, CUDA graphs)."
        )
        f.values["non_pytorch_bytes"] = ev.non_pytorch_bytes
        f.missing.append("the NVML process list with pids (the collector records it)")
        f.score = POSSIBLE if ev.non_pytorch_bytes + free >= req else CANDIDATE
        if f.score == POSSIBLE and ev.total_bytes and held_elsewhere(ev.non_pytorch_bytes, ev.total_bytes):
            # no CUDA context, NCCL buffer or library workspace of this process is that large; only another
            # framework in the same process (JAX, TensorFlow preallocating) would be
            f.facts.append(
                f"That is {ev.non_pytorch_bytes / ev.total_bytes:.0%} of the device: more than this process's own "
                "context, communication buffers and library workspaces come to."
            )
            f.score = LIKELY
        m = ev.message
        if f.score >= POSSIBLE and m is not None and m.format == "vllm-startup":
            # vLLM measures the device before it loads anything: nothing of its own is there but its context
            f.facts.append(
                "vLLM measured the device's free memory at start-up, before it loaded anything: what was in use, "
                "but for its own CUDA context, is other processes' (another server, a zombie of an earlier run)."
            )
            f.score = STRONG if f.score >= LIKELY else LIKELY
    elif ev.outside_allocator and not ev.processes:
        f.facts.append(
            f"The CUDA error came while the allocator held {human(ev.reserved_bytes or 0)} of "
            f"{human(ev.limit_bytes or 0)}, and the device's processes are not known: another process may "
            "have held the rest."
        )
        f.missing.append("the NVML process list with pids (the collector records it)")
        f.score = CANDIDATE
    elif ev.device_unseen and (ev.device_free_bytes is None or ev.device_free_bytes < req):
        f.facts.append(
            "The device's other processes are unknown (this input has no OOM message or NVML list): one "
            "may have held the memory the request needed."
        )
        f.missing.append("the OOM message's process lines or the NVML process list with pids")
        f.score = CANDIDATE
    else:
        return None
    if f.score <= 0:
        return None
    f.actions.append(
        "Schedule the job on a GPU of its own: request the whole device (exclusive mode) instead of a time-shared one."
    )
    f.actions.append(
        "Find the process with `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` on the node; "
        "kill a zombie from an earlier run or move the neighbour."
    )
    return f
