"""Evidence: every fact about one incident, computed once from whatever is available.

Inputs, all optional: a snapshot (``triage.snapshot``), the error text (log or exception message,
parsed by ``triage.messages``), and the incident context (an incident bundle dict, docs/bundle.md:
device, NVML processes, own pids, fraction cap, MIG profile, batch size, step, per-step timeline,
/dev/shm, cgroup). Rules read Evidence and nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from triage.simulate.allocator import allocation_size, round_size
from triage.snapshot.accounting import Accounting, Totals, account
from triage.snapshot.frames import FrameClassifier, Site
from triage.snapshot.model import INACTIVE, Snapshot, TraceEntry, frame_fields
from triage.snapshot.sites import SiteStats, live_sites
from triage.snapshot.timeline import DeviceTimeline, replay
from triage.units import GiB, MiB, human

if TYPE_CHECKING:
    from triage.messages import OomMessage, SmiGpu, SmiProcess

_RE_MIG_PROFILE = re.compile(r"\bMIG[ -]?(\d{1,2}g\.\d{1,3}gb(?:\+me)?)\b", re.IGNORECASE)
# the slice a pod asked for: its Kubernetes resource name (``nvidia.com/mig-3g.40gb: 1``)
_RE_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-(\d{1,2}g\.(\d{1,3})gb(?:\+me)?)\b", re.IGNORECASE)
# the GPU type a job asked for by its GKE accelerator name ("cloud.google.com/gke-accelerator: nvidia-a100-80gb",
# a launcher's "accelerator=nvidia-h100-80gb"): the names that state their memory (NVIDIA's GB, i.e. GiB)
_RE_GKE_ACCELERATOR = re.compile(
    r"(?:accelerator|gpu[-_]?(?:type|class|model|sku))\s{0,2}[=:]\s{0,2}[\"']?"
    r"((?:nvidia-)?(?:tesla-)?[a-z][a-z0-9]{1,7}(?:-[a-z]{2,8})?-(\d{2,3})gb)\b",
    re.IGNORECASE,
)
# the GPU feature discovery label of the node the pod was scheduled to (or selected): its GPUs' memory in
# MiB, what the pod enrichment reads as the size the job was declared for
_RE_GFD_MEMORY = re.compile(r"nvidia\.com/gpu\.memory\s{0,2}[=:]\s{0,2}[\"']?(\d{4,7})\b")
# an NVIDIA product name that states its memory, as torch.cuda.get_device_name() or nvidia-smi print it
# ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB")
_RE_PRODUCT_NAME = re.compile(
    r"\b(?:NVIDIA|Tesla)[ -][A-Z]{1,2}\d{2,3}[\w-]{0,24}?[ -]\d{2,3}GB(?: HBM\d[e]?)?\b"
)
# a Slurm GPU type that states its memory ("--gres=gpu:a100_80gb:4", "gres/gpu:h100-80g=8")
_RE_GRES_TYPE = re.compile(
    r"gres[=/:]\s{0,2}gpu:([a-z][a-z0-9]{1,7}[-_](\d{2,3})g(?:b)?)(?=[:=\s,]|$)", re.IGNORECASE
)
# a desktop or workstation GPU's name ("NVIDIA GeForce RTX 3080 Ti", "NVIDIA RTX A4000", "Quadro RTX 6000")
_RE_DESKTOP_GPU = re.compile(
    r"\b(?:NVIDIA )?(?:GeForce (?:RTX|GTX) ?\d{3,4}(?: Ti| SUPER)?(?: Laptop GPU)?|TITAN (?:RTX|V|Xp?)"
    r"|Quadro (?:RTX )?[A-Z]?\d{3,4}|RTX A\d{3,4}(?: Ada)?|RTX \d{4} Ada)\b"
)
# an NVIDIA vGPU (GRID) profile: "GRID A100D-20C", "NVIDIA L40S-24Q": a share of a physical GPU, sized by the
# profile's number (GB, NVIDIA's GiB); the letter is the profile's series (C compute, Q workstation, B, A)
_RE_GRID_PROFILE = re.compile(r"\b(?:GRID|NVIDIA) ([A-Z]{1,3}\d{1,4}[A-Z]{0,3})-(\d{1,3})([CQAB])\b")
# a profile the VM or pod asked for ("requested_vgpu_profile=A100D-80C", "vgpu profile requested: GRID A10-24Q")
_RE_ASKED_VGPU = re.compile(
    r"request\w{0,4}[ _-]{0,2}(?:vgpu[ _-]{0,2})?profile\s{0,2}[=:]?\s{0,2}['\"]?(?:GRID |NVIDIA )?"
    r"([A-Z]{1,3}\d{1,4}[A-Z]{0,3})-(\d{1,3})[CQAB]\b",
    re.IGNORECASE,
)
# the memory of the physical GPU behind a vGPU profile's board name (NVIDIA's vGPU user guide's boards)
GRID_BOARD_GIB = {
    "A100D": 80, "A100X": 80, "A100": 40, "A800D": 80, "A800": 40, "H100": 80, "H100XM": 80, "H100L": 94,
    "H800": 80, "H200X": 141, "V100DX": 32, "V100D": 32, "V100S": 32, "V100X": 16, "V100": 16, "T4": 16,
    "A10": 24, "A16": 16, "A2": 16, "A30": 24, "A40": 48, "L4": 24, "L40": 48, "L40S": 48, "L20": 48,
    "RTX6000": 24, "RTX8000": 48, "P40": 24, "P100": 16, "P100X": 16, "P4": 8, "P6": 16, "M60": 8, "M10": 8,
}  # fmt: skip
# Senders of SIGKILL (exit code 137) other than the OOM killer: a time limit, a failed liveness probe, a
# preemption, an eviction for disk, a launcher's teardown. Kubernetes reports a memory kill as
# ``OOMKilled``; ``Reason: Error`` beside exit code 137 is another sender.
_RE_OTHER_KILLER = re.compile(
    r"timeout: sending signal KILL|liveness probe failed|failed liveness probe|DUE TO TIME LIMIT"
    r"|\bpreempt(?:ed|ion)\b|^\s*Reason:\s+Error\s*$"
    # the kubelet evicting for disk (the node's or an emptyDir's), torchrun killing a rank that hung
    r"|low on resource: (?:ephemeral-storage|nodefs|imagefs|pids?|inodes)|Usage of EmptyDir volume"
    r"|exceeds (?:its|the) local ephemeral storage limit|forcefully exiting via Signals\.SIGKILL"
    # a graceful stop that outlived its grace period (the kernel's OOM killer sends no SIGTERM first): the
    # kubelet stopping the container, a spot instance reclaimed, torchrun's agent told to shut down
    r"|\bStopping container\b|\bspot (?:instance )?interruption\b|Received Signals\.SIGTERM death signal"
    # a Job past its activeDeadlineSeconds
    r"|\bDeadlineExceeded\b|active longer than specified deadline"
    # vLLM's front end after its engine died of an error it logged: it SIGKILLs its own process tree
    r"|Got fatal signal from worker processes, shutting down"
    # Lightning's launcher after a child process failed: it SIGKILLs the rest, and the shell prints Killed
    r"|Forcefully terminating all other processes",
    re.IGNORECASE | re.MULTILINE,
)
# words one of which every line matched by _RE_OTHER_KILLER, _RE_MIG_PROFILE or _RE_PRODUCT_NAME holds
# (lower case): only those lines of a log are searched
_LOG_LINE_WORDS = (
    "kill",
    "forcefully",
    "deadline",
    "liveness",
    "time limit",
    "preempt",
    "reason:",
    "low on resource",
    "emptydir",
    "ephemeral",
    "stopping container",
    "spot",
    "sigterm",
    "fatal signal",
    "mig",
    "nvidia",
    "tesla",
    "grid ",
    "profile",
    "geforce",
    "quadro",
    "titan",
    "rtx a",
    "gres",
    "gpu-type",
    "gpu_type",
    "gpu-class",
    "gpu_class",
    "gpu-model",
    "gpu_model",
    "gpu-sku",
    "gpu_sku",
    "set_per_process_memory_fraction",
)
# the job's log showing the cap being set: "set_per_process_memory_fraction(0.70, device=0)", a printed source line
_RE_FRACTION_CALL = re.compile(
    r"set_per_process_memory_fraction\(\s{0,4}(?:fraction\s{0,2}=\s{0,2})?(0?\.\d{1,6}|1(?:\.0{1,6})?)\b"
)
_RE_PY_FILE = re.compile(r"[\w./\\-]{1,300}\.py\b")
# a serving launcher's own setting that it applies with set_per_process_memory_fraction: TGI's
# ``--cuda-memory-fraction 0.45`` (echoed in its Args as ``cuda_memory_fraction: 0.45``, or its environment
# variable ``CUDA_MEMORY_FRACTION``)
_RE_FRACTION_FLAG = re.compile(
    r"(?:--cuda-memory-fraction|cuda_memory_fraction|CUDA_MEMORY_FRACTION)(?:\s{1,3}|\s{0,2}[:=]\s{0,2})"
    r"(0?\.\d{1,6}|1(?:\.0{1,6})?)\b"
)
_RE_TRACEBACK_FILE = re.compile(r'File "([^"\n]{1,300}\.py)", line \d')


# The job's own worker processes, as its launcher prints them: torchrun's teardown and failure summary,
# DeepSpeed's launcher, Ray Train's worker list and log prefixes.
_RE_LAUNCHER_PID = re.compile(
    r"Sending process (\d+) closing signal"
    r"|\(pid: (\d+)\)"
    r"|process (\d+) spawned with command"
    r"|Killing subprocess (\d+)"
    r"|\((?:RayTrainWorker|TorchTrainer|_RayTrainWorker\w*) pid=(\d+)"
    r"|pid=(\d+)\) world_rank="
    # a rank reporting its own pid ("[rank3] pid=40114 device=cuda:3", "rank 3 pid=40114")
    r"|^\[rank\d+\]:?\s*pid[=:]\s*(\d+)|\brank[ =:]\s*\d+,?\s+pid[=:]\s*(\d+)"
    # NCCL's own prefix on every line a rank prints: host:pid:tid [device]
    r"|(?<![\w:.-])[\w.-]{1,100}:(\d{1,9}):\d{1,9} \[\d{1,3}\] NCCL ",
    re.MULTILINE,
)
# torchrun's error summary names the first rank that failed: the others may have failed because of it
_RE_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(?:\n[^\n]*){0,4}?\n\s*rank\s*:\s*(\d+)")
# lines of training progress after a log's CUDA OOM that show the job went on after it: other ranks print
# at most a step or two before they block in the next collective
PROGRESS_AFTER_OOM = 10
CAUGHT_LINES = 5  # lines after an OOM searched for the loop's word that it caught it
_RE_CAUGHT = re.compile(
    r"skip(?:ping|ped)?(?: \w{1,12}){0,2} (?:batch|step|sample|iteration)|attempting to recover from OOM"
    r"|recovered from (?:the )?OOM"
    r"|(?:grads|gradients) zeroed, continuing|continuing (?:with the )?next batch",
    re.IGNORECASE,
)
# a step ended between two survivors only if live memory swung by this share of the trace's largest fall
STEP_SWING_SHARE = 0.5
LATE_RISES = 8  # consecutive rising steps up to the OOM that make a leak, however flat the steps before
# live memory after a step is exact to the byte: a change smaller than one rounded block is none
GROWTH_NOISE = 512
HIGH_HELD_STEPS = 5  # changes since live memory's highest, none above it, before it reads as having stopped
PRINT_NOISE = 0.03  # of a printed reading: its rounding and the step-to-step jitter at one input
PRINT_NOISE_BYTES = 32 * MiB  # the same, at least ("0.58G" is printed to 10 MB)
LATE_RISES_LARGE = 5  # fewer consecutive rises up to the OOM make one when they are large: ...
LATE_LARGE_SHARE = 0.25  # ... together this share of what the job could hold at least
SERVING_START_FORMATS = frozenset({"vllm-startup", "serving-config"})  # an inference server sizing itself
FLOOR_MARGIN = 1.02  # a printed floor and a request past the device by this much (units printed loosely)
TRACE_MIN_CYCLES = 4  # cycles of live memory in a trace before they are read as steps
FLAT_FLOOR_SHARE = 0.03  # of what the job could hold: a trace's step floors within this did not climb
RECENT_BATCH_STEPS = 2  # a batch that grew this many completed steps before the OOM still explains it
SMALL_POOL_MAX = 1 * MiB
KEPT_CALL_SHARE = 0.2  # a call's blocks still alive, of all it allocated, that make its graph kept
# the device had room for the request (``Evidence.device_had_room``): free after the failure at least this many
# fresh segments for it and this much to spare, with the job holding at most this share of what it could
ROOM_SEGMENTS = 16
ROOM_SPARE = 2 * GiB
ROOM_HELD_SHARE = 0.4
# a log's prints of the reservation alone are read as peaks only when the OOM's free-in-reserved memory is at
# most this share of the rise they show
RESERVED_FREE_SHARE = 0.25
RESERVED_FLAT = 0.05  # of the highest print: a reservation that rose less stayed flat
SNAPSHOT_MESSAGE_SLACK = 64 * MiB  # allocated bytes a snapshot and its message may differ by (rounding)
# what torch reports as the total of a MIG slice (GiB, by profile); larger slices (3g/4g/7g) match whole GPUs
MIG_SLICE_SIZES = (
    (int(4.75 * GiB), "1g.5gb"),
    (int(9.5 * GiB), "1g.10gb"),
    (int(9.75 * GiB), "1g.10gb / 2g.10gb"),
    (int(19.5 * GiB), "1g.20gb / 2g.20gb"),
    (int(19.625 * GiB), "3g.20gb / 4g.20gb"),
    (int(19.75 * GiB), "2g.20gb"),
)
SLICE_CONTEXT = 1 * GiB  # a process's CUDA context on a MIG slice, at most (a few hundred MiB is usual)
CUDA_CONTEXT_MAX = (
    3 * GiB
)  # a process's own non-PyTorch memory (context, cuBLAS/NCCL workspaces) rarely exceeds this


_RE_NAMED_GB = re.compile(r"(?<![\d.])(\d{1,3})\s?GB\b", re.IGNORECASE)


def _named_bytes(name: str) -> int | None:
    """The memory a GPU's product name states ("A100-SXM4-80GB", "H100 80GB HBM3"): NVIDIA's GB there is
    GiB (the 80GB A100 has 81,920 MiB). Not a Grace superchip's ("GH200 480GB": its CPU memory too)."""
    if re.search(r"\bG[BH]\d{3}\b", name or ""):
        return None
    found = _RE_NAMED_GB.search(name or "")
    return int(found.group(1)) * GiB if found else None


_RE_MEM_LIMIT = re.compile(r"^\s*(\d{1,15})\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def _grid_profile(ev: Evidence, b: dict[str, Any]) -> None:
    """An NVIDIA vGPU (GRID) profile in the device's name or the log ("GRID A100D-20C"): the job has the
    profile's share of the physical GPU behind it, a virtual-GPU limit like a vGPU layer's; a profile the
    VM or pod asked for is the size it was declared for."""
    found = _RE_GRID_PROFILE.search(ev.device_name or "")
    profile = (found.group(0).split(" ", 1)[1], int(found.group(2))) if found else ev.log_vgpu_profile
    if profile is None or ev.mig_profile is not None:
        return
    name, gb = profile
    board = name.rsplit("-", 1)[0]
    physical = GRID_BOARD_GIB.get(board)
    limit = ev.total_bytes or gb * GiB
    if physical is None or physical * GiB <= limit:
        return
    if ev.vgpu_limit_bytes is None:
        ev.vgpu_limit_bytes = limit
    ev.named_total_bytes = physical * GiB
    ev.notes.append(
        f"The device is the vGPU profile {name} (GRID): {gb} GB of a {physical} GB {board.rstrip('DXSML')}."
    )
    asked = ev.log_asked_vgpu
    if (
        asked is not None
        and ev.declared_total_bytes is None
        and _get(b, "device", "declared_total_bytes") is None
    ):
        ev.declared_total_bytes = asked[1] * GiB
        ev.notes.append(f"The log shows the profile asked for: {asked[0]}-{asked[1]}.")


def _vgpu_env_limit(env: Any, device: int | None) -> int | None:
    """A vGPU layer's memory limit from the job's environment (HAMi: ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` or
    ``CUDA_DEVICE_MEMORY_LIMIT``, a number with an optional k/m/g unit; plain numbers are MiB)."""
    if not isinstance(env, dict):
        return None
    raw = env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{device if device is not None else 0}")
    if raw is None:
        raw = env.get("CUDA_DEVICE_MEMORY_LIMIT")
    got = _RE_MEM_LIMIT.match(str(raw)) if raw is not None else None
    if got is None:
        return None
    unit = {"": MiB, "k": 1024, "m": MiB, "g": GiB, "t": 1024 * GiB}[got.group(2).lower()]
    return int(got.group(1)) * unit or None


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _part(d: Any, *path: str) -> dict[str, Any]:
    """The bundle's part at ``path`` when it is a dict (an untrusted bundle may carry anything there)."""
    got = _get(d, *path)
    return got if isinstance(got, dict) else {}


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    return None


@dataclass(slots=True)
class Process:
    pid: int | None
    used_bytes: int
    own: bool
    source: str  # "nvml" | "message" | "nvidia-smi" (a listing printed in the log)
    name: str = ""


@dataclass(slots=True)
class StepSample:
    """Live memory after one optimizer step, the step's peak, and its batch size (from the collector)."""

    step: int
    allocated_bytes: int
    peak_allocated_bytes: int
    batch_size: int | None
    time_us: int | None = None  # when it was taken (epoch µs, the clock of the trace's entries)


def _step_samples(samples: Sequence[Any], *, ordered: bool = True) -> list[StepSample]:
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            continue
        a = _int(s.get("allocated_bytes"))
        if a is None:
            continue
        step = _int(s.get("step"))
        peak = _int(s.get("peak_allocated_bytes")) or a
        out.append(
            StepSample(
                step if step is not None else i, a, peak, _int(s.get("batch_size")), _int(s.get("time_us"))
            )
        )
    if ordered:
        out.sort(key=lambda x: x.step)
    return out


RESTART_MIN_OVERLAP = 2  # steps both attempts sampled before their live memory is compared
RESTART_GROWTH_MIN = 1 * GiB  # live memory an attempt kept from the one before it, at least
RESTART_GROWTH_SHARE = 0.1  # ... and at least this share of what the job may hold


def _attempts(samples: Sequence[StepSample]) -> list[list[StepSample]]:
    """The samples, in the order recorded, cut where the step count went back (an attempt started again
    from a checkpoint in the same process): each attempt's samples."""
    out: list[list[StepSample]] = [[]]
    for s in samples:
        if out[-1] and s.step < out[-1][-1].step:
            out.append([])
        out[-1].append(s)
    return [a for a in out if a]


def _restart_growth(ev: Evidence, attempts: list[list[StepSample]]) -> None:
    """How much higher live memory was after the last restart with steps both attempts sampled, at those
    steps (the median difference): what the earlier attempt held and never let go."""
    for before, after in reversed(list(itertools.pairwise(attempts))):
        old = {s.step: s.allocated_bytes for s in before}
        diffs = sorted(s.allocated_bytes - old[s.step] for s in after if s.step in old)
        if len(diffs) >= RESTART_MIN_OVERLAP:
            ev.restart_growth = (before[-1].step, after[0].step, diffs[len(diffs) // 2])
            return


def large_late_rise(trend: StepTrend, limit: int | None) -> bool:
    """Live memory rose at each of the last LATE_RISES_LARGE or more steps right up to the OOM, by a
    quarter of what the job could hold or more in all: a leak that began late (a validation loop keeping
    its outputs), whatever fell before it (the training steps' memory released as validation began)."""
    if not limit or trend.tail_rises < LATE_RISES_LARGE:
        return False
    return sum(trend.rise_bytes[-trend.tail_rises :]) >= LATE_LARGE_SHARE * limit


@dataclass(slots=True)
class StepTrend:
    """Live memory after each step (the collector samples it at every optimizer step)."""

    steps: int
    first_step: int
    last_step: int
    start_bytes: int
    end_bytes: int
    growth_bytes: int
    rising_fraction: float  # share of step-to-step changes that are increases
    falling_fraction: float  # share that are decreases
    slope_bytes_per_step: float
    late_growth_bytes: int  # growth over the last third of the samples
    early_growth_bytes: int  # growth over the first two thirds
    peak_bytes: int  # highest per-step peak seen
    peak_step: int
    flat_tail: int  # step-to-step changes at the end that stayed flat (within noise)
    tail_slope_ratio: float  # mean change over the last quarter / mean change before it (1.0 = steady)
    rise_at: tuple[int, ...] = ()  # indices of the step-to-step changes that were increases
    rise_bytes: tuple[int, ...] = ()  # what each of those rose by
    tail_rises: int = 0  # step-to-step changes at the end that were all increases (a leak that began late)
    given_back: float = 0.0  # what the falls gave back, a share of all the rises (a cache cleared at times)
    # share of changes that fell by more than a twentieth of the largest rise: a staircase whose flat
    # stretches wobble by a few small blocks (a variable-length batch's last tensors) still never falls
    major_falling_fraction: float = 0.0
    major_given_back: float = 0.0  # what those falls gave back, a share of all the rises
    # grew and then stayed flat for 3+ steps at one batch size, and has grown since the batch grew by no
    # more than that store could at the new size: a bounded store re-filling with larger entries
    refilled: bool = False
    # changes since live memory's highest point, when none went above it (0: the run ended at its highest)
    since_high: int = 0

    @property
    def never_falls(self) -> bool:
        """Rises in most steps, or in some and never falls (a tensor kept every other step, or at every
        evaluation)."""
        return (
            self.rising_fraction >= 0.9
            or (self.falling_fraction <= 0.05 and self.rising_fraction >= 0.25 and self.rises_throughout)
            or self.staircase
        )

    @property
    def rises(self) -> int:
        return len(self.rise_at)

    @property
    def staircase(self) -> bool:
        """Rises now and then, never falls (but by a sliver), and rises in every third of the run: what is kept at every
        evaluation or logging step. Growth, however few of the steps show it. (A cache fills in a burst
        and stops; one more rise later, after the batch grew, is not a staircase.)"""
        if self.regular_pair:
            return True
        if self.rises < 3 or self.plateaued:
            return False
        if self.major_falling_fraction > 0 and (
            self.major_falling_fraction > 0.05 or self.major_given_back > 0.05
        ):
            return False  # a fall now and then that gives back a sliver of the rises (a buffer re-made) is not one
        return self.rises_throughout

    @property
    def regular_pair(self) -> bool:
        """Two rises alone, of the same size (within ``EQUAL_RISES``), far apart, with the run ending before a
        third was due (no later than half a wait again after the second): the same tensors kept at each of
        two evaluations, the OOM coming in the third. A cache filling in bursts fills unevenly."""
        if self.rises != 2:
            return False
        a, b = self.rise_bytes
        wait = self.rise_at[1] - self.rise_at[0]
        since = (self.steps - 1) - self.rise_at[1]
        return wait >= 3 and abs(a - b) <= EQUAL_RISES * max(a, b) and since <= 1.5 * wait

    @property
    def rises_throughout(self) -> bool:
        """Some step in every third of the run rose (too few steps to tell: True)."""
        changes = self.steps - 1
        if changes < 6:
            return True
        return {min(2, 3 * i // changes) for i in self.rise_at} == {0, 1, 2}

    @property
    def plateaued(self) -> bool:
        """Grew, then stopped: the last third adds under a tenth of the first two thirds' growth, or the
        last changes (at least 3, and a quarter of all) stayed flat."""
        if self.early_growth_bytes <= 0:
            return False
        if self.refilled:
            return True
        if self.regular_pair:
            return False  # the third rise was not due yet
        if self.late_growth_bytes <= 0.1 * self.early_growth_bytes:
            return True
        if self.since_high >= HIGH_HELD_STEPS and self.since_high >= self.steps // 3:
            return (
                True  # the most it held came a third of the run ago or more, and it never went back above it
            )
        if self.late_growth_bytes > 0 and len(self.rise_at) >= 3:
            # rises now and then, apart (an evaluation every N steps; a cache fills in a burst of steps in a
            # row): a flat tail no longer than the longest wait between earlier rises is the next one not due
            waits = sorted(b - a for a, b in itertools.pairwise(self.rise_at))
            if waits[len(waits) // 2] >= 2 and (self.steps - 1) - self.rise_at[-1] <= 1.5 * waits[-1]:
                return False
        return self.tail_slope_ratio <= 0.1

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "start_bytes": self.start_bytes,
            "end_bytes": self.end_bytes,
            "growth_bytes": self.growth_bytes,
            "rising_fraction": round(self.rising_fraction, 3),
            "falling_fraction": round(self.falling_fraction, 3),
            "slope_bytes_per_step": round(self.slope_bytes_per_step, 1),
            "late_growth_bytes": self.late_growth_bytes,
            "early_growth_bytes": self.early_growth_bytes,
            "plateaued": self.plateaued,
            "flat_tail": self.flat_tail,
        }


@dataclass
class Survivors:
    """Blocks from one allocation site that outlived the steps that made them."""

    stats: SiteStats
    cycles: int  # gaps between survivors in which live memory fell back (a step ended)
    gaps: int  # between survivors, the blocks of one call of the model counted as one
    freed_at_site: int  # allocations at this site in the trace that were freed again
    freed_after_first: int = 0  # of those, made after the site's first survivor (interleaved, not evicted)
    evicted_meanwhile: bool = True  # an older one was freed after the first survivor was made (eviction)
    # (line, blocks freed, steps) of blocks older than the trace freed one for one as the site's came in,
    # over the site's last ``steps`` gaps (a window that turns over: ``deque(maxlen=N)``), or None
    replacing: tuple[tuple[Any, Any, Any], int, int] | None = None
    # the user line that ran the model every survivor was made in (``outs.append(model(x))``), when one
    call: Site | None = None

    @property
    def accumulating(self) -> bool:
        """Made before the trace began (blocks older than it) and again in it, after a step ended, none of
        its allocations freed: a site that keeps adding, too few times in the trace to convict."""
        return self.cycles >= 1 and self.freed_at_site == 0 and self.stats.count > self.stats.traced

    @property
    def bounded(self) -> bool:
        """The trace shows the site's bound: it frees its oldest as it adds (a cache, a ``deque(maxlen=N)``),
        or its new blocks replace older ones one for one."""
        return self.evicted_like_a_cache or self.replacing is not None

    @property
    def evicted_like_a_cache(self) -> bool:
        """A bounded cache frees its *oldest* entries: what was freed came before every survivor, and
        it is freed as new entries come in, while the survivors are alive. A leak that keeps every other
        step's tensor interleaves freed and kept allocations instead; a leak that began late freed its
        earlier tensors in their own steps, before it kept the first one."""
        allocs = max(self.stats.allocs_in_trace, self.stats.traced)
        if not allocs or self.freed_at_site <= 0.25 * allocs:
            return False
        return self.freed_after_first <= 0.1 * self.freed_at_site and self.evicted_meanwhile

    @property
    def site(self) -> Site:
        return self.stats.site

    @property
    def cycle_fraction(self) -> float:
        return self.cycles / self.gaps if self.gaps else 0.0


CallId = tuple[tuple[Any, Any, Any], int]  # (the user line that called the model, its n-th call)


@dataclass
class KeptCalls:
    """Blocks alive at the OOM from earlier calls of one line that runs the model (``out = model(x)``),
    each call's a large part of all it allocated: the saved activations of several forward passes,
    kept because their outputs (and so their autograd graphs) are still referenced."""

    call: Site  # the user line that called the model
    calls: int  # completed calls of that line whose blocks are still alive
    blocks: int
    bytes: int
    made: int  # completed calls of that line in the trace
    # the most of the line's calls alive at once when an earlier one began (None: it had not run before)
    before: int | None
    freed_before: int  # calls of any model line made before the first kept call, and since freed
    peak_before: int  # the most live memory before it
    in_call: bool = False  # the failing allocation was made under the same line (a call of it had begun)
    past_step: int = 0  # kept calls made before an optimizer step that ran before the OOM
    older_bytes: int = 0  # live blocks made under the same line before the trace began (earlier kept calls)

    @property
    def kept_bytes(self) -> int:
        """What the line's kept calls hold: those the trace shows, and the older blocks under the line."""
        return self.bytes + self.older_bytes

    @property
    def more_than_before(self) -> bool:
        """More than twice the calls the line ever held at once before (or it had not run before): not
        what its steps do (a step that runs twice as many micro-batches holds twice as many)."""
        return self.before is None or self.calls > 2 * self.before


@dataclass(slots=True)
class AlignedStep:
    """The failing call of the model set beside the same line's call in the step before it: the same code
    (the same stacks, allocation by allocation) up to the failing request, with tensors ``ratio`` times
    the size (a longer input, a larger batch). That earlier step went on to a peak; scaled the same way,
    the failing step would have needed ``predicted`` bytes."""

    call: Site
    position: int  # allocations of the failing call before its failing one
    ratio: float  # its growth so far over the earlier call's at the same allocation
    earlier_peak: int  # the earlier step's peak, bytes
    start: int  # live memory as the failing call began
    predicted: int  # what the failing step would have needed at its peak
    unmatched: int = 0  # allocations of the failing call the earlier one did not make (counted as they are)


EQUAL_RISES = 0.1  # two rises within this share of the larger are the same tensors kept again
# of the largest step-to-step rise: a change smaller than this is a wobble beside it (memory printed at a
# point of the step that moves a little, a variable-length batch's last tensors)
MINOR_CHANGE = 0.05


def _trend(samples: Sequence[Any]) -> StepTrend | None:
    return _trend_of(_step_samples(samples))


def _trend_of(ss: Sequence[StepSample]) -> StepTrend | None:
    pts = [(s.step, s.allocated_bytes, s.peak_allocated_bytes) for s in ss]
    if len(pts) < 3:
        return None
    n = len(pts)
    # a step run at another batch size than the one before it keeps other-sized tensors (the batch, a
    # cache entry per batch): its change says nothing about a leak, so it is left out of the growth
    diffs = [
        0
        if a.batch_size and b.batch_size and a.batch_size != b.batch_size
        else b.allocated_bytes - a.allocated_bytes
        for a, b in itertools.pairwise(ss)
    ]
    vals = list(itertools.accumulate(diffs, initial=pts[0][1]))  # live memory, batch-size jumps removed
    noise = GROWTH_NOISE
    rising = sum(1 for d in diffs if d > noise) / len(diffs)
    falling = sum(1 for d in diffs if d < -noise) / len(diffs)
    floor = max(noise, MINOR_CHANGE * max(diffs))
    major_falling = sum(1 for d in diffs if d < -floor) / len(diffs)
    xs = [s for s, _, _ in pts]
    mx = sum(xs) / n
    my = sum(vals) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, vals, strict=True)) / var if var else 0.0
    cut = max(1, (2 * n) // 3)
    peak_step, _, peak = max(pts, key=lambda p: p[2])
    flat_tail = 0
    for d in reversed(diffs):
        if abs(d) > noise:
            break
        flat_tail += 1
    k = max(3, len(diffs) // 4)
    early, tail = diffs[:-k], diffs[-k:]
    ratio = 1.0
    if len(early) >= 3 and sum(early) > 0:
        ratio = (sum(tail) / len(tail)) / (sum(early) / len(early))
    return StepTrend(
        steps=n,
        first_step=xs[0],
        last_step=xs[-1],
        start_bytes=pts[0][1],
        end_bytes=pts[-1][1],
        growth_bytes=vals[-1] - min(vals[: max(1, n // 4)]),
        rising_fraction=rising,
        falling_fraction=falling,
        major_falling_fraction=major_falling,
        slope_bytes_per_step=slope,
        late_growth_bytes=vals[-1] - vals[cut - 1],
        early_growth_bytes=vals[cut - 1] - vals[0],
        peak_bytes=peak,
        peak_step=peak_step,
        flat_tail=flat_tail,
        tail_slope_ratio=ratio,
        rise_at=tuple(i for i, d in enumerate(diffs) if d > noise),
        rise_bytes=tuple(d for d in diffs if d > noise),
        tail_rises=next((i for i, d in enumerate(reversed(diffs)) if d <= noise), len(diffs)),
        given_back=-sum(d for d in diffs if d < 0) / max(1, sum(d for d in diffs if d > 0)),
        major_given_back=-sum(d for d in diffs if d < -floor) / max(1, sum(d for d in diffs if d > 0)),
        refilled=_refilled(ss, diffs, floor),
        since_high=_since_high(vals),
    )


def _since_high(vals: list[int]) -> int:
    """How many changes came after live memory's highest value, none of them above it (by noise)."""
    top = max(range(len(vals)), key=lambda i: vals[i])
    return len(vals) - 1 - top


def _refilled(ss: Sequence[StepSample], diffs: list[int], floor: float) -> bool:
    """Live memory grew, then held flat (within ``floor``) for 3+ steps at one batch size, and since the
    batch last grew it has grown by no more than that growth times the batch's ratio less one: what a store
    of per-batch tensors bounded in count (the last N features, a window of outputs) does when its entries
    are made larger. A leak at the old size would not have stopped."""
    changes = [
        i
        for i, (a, b) in enumerate(itertools.pairwise(ss))
        if a.batch_size and b.batch_size and a.batch_size != b.batch_size
    ]
    if not changes:
        return False
    c = changes[-1]
    old, new = ss[c].batch_size or 0, ss[c + 1].batch_size or 0
    flat = 0
    for d in reversed(diffs[:c]):
        if abs(d) > floor:
            break
        flat += 1
    grown = sum(diffs[: c - flat])
    since = sum(diffs[c + 1 :])
    return new > old and flat >= 3 and grown > 0 and since <= (new / old - 1) * grown


@dataclass
class Evidence:
    snapshot: Snapshot | None = None
    accounting: Accounting | None = None
    timelines: list[DeviceTimeline] = field(default_factory=list)
    sites: list[SiteStats] = field(default_factory=list)
    classifier: FrameClassifier = field(default_factory=FrameClassifier)
    messages: list[OomMessage] = field(default_factory=list)
    message: OomMessage | None = None
    bundle: dict[str, Any] = field(default_factory=dict)

    kind: str = "unknown"  # cuda_oom | shm_exhausted | host_oom | crash | none | unknown
    device: int | None = None
    device_name: str = ""
    total_bytes: int | None = None
    declared_total_bytes: int | None = None
    mig_profile: str | None = None
    log_mig_profile: str | None = None  # the one MIG profile the log text names (nvidia-smi, a device print)
    log_vgpu_profile: tuple[str, int] | None = None  # the one GRID vGPU profile the log names: (name, GB)
    log_asked_vgpu: tuple[str, int] | None = None  # the one vGPU profile the log shows asked for: (board, GB)
    log_asked_mig: tuple[str, int] | None = None  # (profile, GB) of the MIG resource the log shows asked for
    log_gpu_label_bytes: int | None = None  # the one nvidia.com/gpu.memory label the log prints (bytes)
    log_asked_gpu: tuple[str, int] | None = None  # the one GKE accelerator the log names: (name, bytes)
    # (first step, its bytes, last step, its bytes) of host memory the log printed at its steps, when it rose
    # at nearly every print (``host_growth``)
    host_growth: tuple[int, int, int, int, bool] | None = None  # ..., and whether it grew while training
    log_device_name: str = ""  # the one GPU product (by memory size) the log text names
    fraction_cap_bytes: int | None = None
    fraction_rejected: bool = False
    vgpu_limit_bytes: int | None = None
    vgpu_used_bytes: int | None = None
    named_total_bytes: int | None = None  # the memory the device's product name states
    request_bytes: int | None = None  # the allocator's request at the OOM (segment size when known)
    request_rounded_bytes: int | None = None  # the rounded block request (oom trace entry)
    device_free_bytes: int | None = None
    reserved_bytes: int | None = None
    allocated_bytes: int | None = None
    private_pool_bytes: int | None = None
    largest_free_block_bytes: int | None = None  # in the pool (and stream) the request needed
    free_in_pool_bytes: int | None = None  # all free blocks in that pool and stream
    request_pool: str | None = None
    expandable_segments: bool | None = None
    alloc_conf: str = ""
    own_pids: set[int] = field(default_factory=set)
    pid: int | None = None  # the failing process (the collector's)
    cap_set_by_job: str | None = None  # "train.py:12 in main": the job's own code set the fraction cap
    # (fraction, source file, line): the log shows the job's own code setting a fraction cap
    log_fraction_calls: list[tuple[float, str, str]] = field(default_factory=list)
    # the job's own source files its tracebacks run through
    traced_files: list[str] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    own_process_identified: bool = False
    own_absent: bool = False  # the job's own process is known not to be among the listed ones
    other_process_bytes: int = 0
    non_pytorch_bytes: int | None = None
    # in use on the device outside every process listed there, when the listing holds the job's own process
    # and no other (the OOM message's "this process" line alone): memory of processes NVML did not list
    unlisted_bytes: int | None = None
    batch_size: int | None = None
    step: int | None = None
    steps: list[StepSample] = field(default_factory=list)  # completed steps the collector or log sampled
    peaks_sampled: bool = True  # the step samples carry each step's peak (a log may print only the floor)
    log_floor_bytes: int | None = None  # the least live memory the log printed before the failure
    log_peaks_only: bool = False  # the log's step samples are peaks printed alone (max_memory_allocated)
    trend: StepTrend | None = None
    # the step count started again in the timeline (an attempt restarted in the same process): (the step it
    # went back from, the step it went back to, how much higher live memory was at the same steps after)
    restart_growth: tuple[int, int, int] | None = None
    restarted_again: bool = False  # and once more after the last sample, before the OOM
    trend_source: str = "samples"  # samples (the collector's per-step memory) | trace (cycles in the trace)
    survivors: list[Survivors] = field(default_factory=list)
    kept_calls: KeptCalls | None = None
    # calls of one model line in the trace freed since, the most of any line (None: no call seen)
    freed_calls: int | None = None
    calls_by_device: dict[int, dict[int, CallId]] = field(default_factory=dict, repr=False)
    call_restarts_by_device: dict[int, dict[CallId, list[int]]] = field(default_factory=dict, repr=False)
    older_frees_by_device: dict[int, list[int]] = field(default_factory=dict, repr=False)
    under_calls: dict[tuple[Any, Any, Any], tuple[int, int]] | None = field(default=None, repr=False)
    older_blocks: OlderBlocks | None = field(default=None, repr=False)
    site_allocs: dict[tuple[int, Site], list[int]] | None = field(default=None, repr=False)
    aligned: AlignedStep | bool | None = field(default=False, repr=False)  # False: not worked out yet
    # the failing request's run of re-makes (``_request_run``); False: not worked out yet
    request_run: tuple[list[int], list[int], int] | bool | None = field(default=False, repr=False)
    oom_entry: TraceEntry | None = None
    oom_timeline: DeviceTimeline | None = None
    shm_total_bytes: int | None = None
    shm_used_bytes: int | None = None
    dataloader_workers: int | None = None
    dead_workers_sigbus: int = 0
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None
    oom_kill_count: int | None = None
    exit_code: int | None = None
    other_killer: str | None = None  # a line naming another sender of SIGKILL (timeout, liveness probe, …)
    launcher_pids: set[int] = field(default_factory=set)  # the job's workers, from its launcher's lines
    # processes of the same server as the failing one, by their names in nvidia-smi's listing (a Triton
    # server and the Python-backend stubs it starts, one per model instance)
    service_pids: set[int] = field(default_factory=set)
    # where a process faulted with SIGBUS, as faulthandler printed it in the log: (file, line, function)
    bus_error_frame: tuple[str, int, str] | None = None
    log_smi: list[SmiProcess] = field(default_factory=list)  # the last process listing nvidia-smi printed
    log_smi_before_start: bool = False  # ... printed before the job showed any progress or failed
    log_smi_after_exit: bool = False  # ... run from a shell prompt after the job's traceback: it had exited
    # the OOM's GPU's memory in use as nvidia-smi printed it before the job showed any progress, with no
    # process listed (in a container nvidia-smi cannot list the host's processes)
    log_smi_gpu: SmiGpu | None = None
    earlier_attempt_pids: set[int] = field(default_factory=set)  # workers of attempts before a restart
    setup_call: str | None = None  # the model-setup frame a log's OOM came under, before any training step
    first_step_bar: str | None = (
        None  # a log's progress bar that still read 0/N at the OOM, nothing shown before it
    )
    # (what, from, to): the log says the input grew just before the OOM, after steps at the smaller size
    log_size_change: tuple[str, int, int] | None = None
    log_batch_peaks: dict[int, int] = field(
        default_factory=dict
    )  # batch size -> highest peak printed beside it
    # live memory rose only where a size printed beside it grew: (what, first, last) (``_growth_with_input``)
    growth_with_input: tuple[str, int, int] | None = None
    root_rank: int | None = None  # torchrun's "Root Cause (first observed failure)" rank
    eval_gather: str | None = None  # the evaluation loop's gathering of predictions the OOM came in
    survived_oom: str | None = None  # a log's CUDA OOM the job went on after (it did not end the job)
    contract_violations: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ derived facts
    @property
    def has_snapshot(self) -> bool:
        return self.snapshot is not None and bool(self.snapshot.segments)

    @property
    def others_known(self) -> bool:
        """Which listed processes are others' is known: the job's own line is identified, or the job is known
        not to be listed (an nvidia-smi listing printed before it started, CUDA never initialised in it)."""
        return (
            self.own_process_identified
            or self.log_smi_before_start
            or self.own_absent
            or self.log_smi_after_exit
        )

    @property
    def has_trace(self) -> bool:
        return any(t.entries > 1 for t in self.timelines)

    @property
    def has_frames(self) -> bool:
        return any(s.site.kind in ("user", "library") for s in self.sites)

    @property
    def is_cuda_oom(self) -> bool:
        return self.kind == "cuda_oom"

    @property
    def limit_bytes(self) -> int | None:
        """The most this process may hold: the fraction cap when one is set, else the device total."""
        if self.fraction_cap_bytes and (
            self.total_bytes is None or self.fraction_cap_bytes < self.total_bytes
        ):
            return self.fraction_cap_bytes
        if self.vgpu_limit_bytes:
            return self.vgpu_limit_bytes
        return self.total_bytes

    @functools.cached_property
    def _oom_trace_cycles(self) -> list[tuple[int, int]]:
        """Every cycle of live memory (the biggest swing) in the OOM device's trace, absolute bytes."""
        tl = self.oom_timeline
        if tl is None or not tl.levels:
            return []
        base = tl.start_allocated
        return [(low + base, top + base) for low, top in trace_cycles(tl.levels, min_cycles=1)]

    @property
    def earlier_peaks(self) -> list[int]:
        """The peak live memory of each completed step: the collector's samples, else the cycles of the
        trace (the first, and the failing one, left out). Empty for fewer than TRACE_MIN_CYCLES steps: too
        few to say what the job's steps demand."""
        if self.steps:
            peaks = self.step_peaks
        elif self.freed_calls is not None and self.freed_calls < TRACE_MIN_CYCLES:
            # the stacks show the model's calls, and fewer forward passes than that came and went: the
            # cycles are a forward pass's layers (checkpointed blocks, large temporaries), not steps
            peaks = []
        else:
            peaks = [top for _, top in self._oom_trace_cycles[1:-1]]
        return peaks if len(peaks) >= TRACE_MIN_CYCLES else []

    @property
    def restart_kept_bytes(self) -> int | None:
        """Bytes the steps held more after the step count started again than before it, at the same steps,
        when that is much (a GiB, and a tenth of what the job may hold): what the earlier attempt held was
        never freed. None otherwise."""
        if self.restart_growth is None:
            return None
        grown = self.restart_growth[2]
        least = max(RESTART_GROWTH_MIN, RESTART_GROWTH_SHARE * (self.limit_bytes or 0))
        return grown if grown >= least else None

    @property
    def step_series(self) -> str:
        """What the step samples are, as a sentence begins: live memory after each step, or the peak a log
        printed alone at each step."""
        return (
            "The peak the log printed at each step" if self.log_peaks_only else "Live memory after each step"
        )

    @property
    def step_peaks(self) -> list[int]:
        """Each sampled step's peak; empty when the samples have none (a log that printed live memory
        between steps, not the peak: the floor is not the peak)."""
        return [s.peak_allocated_bytes for s in self.steps] if self.peaks_sampled else []

    @property
    def earlier_peak_bytes(self) -> int | None:
        """The highest of ``earlier_peaks``; None when there are too few."""
        peaks = self.earlier_peaks
        return max(peaks) if peaks else None

    @property
    def trace_steps(self) -> int:
        """How many steps (cycles of live memory) the OOM device's trace covers."""
        return len(self._oom_trace_cycles)

    @property
    def trace_floor_flat(self) -> bool:
        """The OOM device's trace covers at least ``TRACE_MIN_CYCLES`` steps and what each kept (its low
        point) did not climb: up in no more than half of them, and up over them all by no more than it fell
        along the way (a server's floor goes up and down with its requests) or than ``FLAT_FLOOR_SHARE`` of
        what the job could hold. A leak's floor climbs step after step and gives nothing back."""
        cycles = self._oom_trace_cycles
        tl = self.oom_timeline
        if len(cycles) < TRACE_MIN_CYCLES or tl is None:
            return False
        lows = [lo for lo, _ in cycles]
        ups = sum(1 for a, b in itertools.pairwise(lows) if b > a)
        fell = sum(a - b for a, b in itertools.pairwise(lows) if b < a)
        room = self.usable_bytes or (max(tl.levels) + tl.start_allocated)
        return ups <= (len(lows) - 1) / 2 and lows[-1] - lows[0] <= max(fell, FLAT_FLOOR_SHARE * room)

    @property
    def host_kills(self) -> list[OomMessage]:
        """Host-memory kills in the text that can have ended this job. After a CUDA OOM traceback the job
        died of its exception: only a kernel/OOMKilled/``Killed`` line *after* the last CUDA OOM counts —
        an earlier one killed something else, and a SIGKILL / exit -9 after it is the launcher (torchrun)
        tearing down the other ranks, a worker's death Python printed as "Exception ignored in" the
        DataLoader shutting down with its parent."""
        host = [m for m in self.messages if m.kind == "host_oom"]
        cuda = [m.line_no for m in self.messages if m.kind == "cuda_oom" and m.line_no is not None]
        if not host or not cuda:
            return host
        last = max(cuda)
        return [
            m
            for m in host
            if m.line_no is not None
            and m.line_no > last
            and m.format not in ("host-sigkill", "host-exit-137")
            and m.extra.get("ignored") != "true"
        ]

    @property
    def device_unseen(self) -> bool:
        """A CUDA OOM whose device is unknown (a snapshot alone carries neither the device's size nor
        its other processes): what else held the memory cannot be told."""
        return self.is_cuda_oom and self.total_bytes is None and not self.processes

    @property
    def slice_sized(self) -> str | None:
        """The device's total is the size of a MIG slice (and nothing says what the device is): the slice
        named, else None. Whole datacenter GPUs of these sizes are rare; MIG slices are common. A snapshot
        alone has no total: there the job's reach (its reservation plus the device's free memory) just under
        a slice's size, by no more than a CUDA context, is that slice."""
        total = self.total_bytes
        if self.mig_profile or self.declared_total_bytes:
            return None
        if self.device_name and "MIG" not in self.device_name:
            return None
        reach = self.usable_bytes if total is None and self.device_unseen else None
        for size, names in MIG_SLICE_SIZES:
            if total is not None and abs(total - size) <= 0.015 * size:
                return names
            if reach is not None and size - SLICE_CONTEXT <= reach <= size * 1.015:
                return names
        return None

    @property
    def block_request_bytes(self) -> int | None:
        """The block the allocator looked for: the request rounded to 512 B (the trace's oom entry), which
        the message's two-decimal figure can understate by a few MiB."""
        if self.request_bytes is None:
            return self.request_rounded_bytes
        return max(self.request_bytes, self.request_rounded_bytes or 0)

    @property
    def device_had_room(self) -> bool:
        """The device's free memory at the OOM, read after the allocator had released every cached segment
        it could, would have held a fresh segment for the request many times over (sixteen, and 2 GiB to
        spare), the job held under 40% of what it could, and no cap this input shows stood in between: the
        job's own memory did not run out. (A free figure a little above the request is not this: drivers
        refuse allocations near the free total.)
        ``cudaMalloc`` refused for a reason outside the job's tensors: a cap this input does not print (a
        fraction set by a wrapper, a virtual-GPU layer), a neighbour that freed its memory just after the
        failure, or the host (the driver needs host memory to map device memory)."""
        req = self.block_request_bytes
        free = self.device_free_bytes
        if not self.is_cuda_oom or not req or free is None:
            return False
        if self.fraction_cap_bytes or self.fraction_rejected or self.vgpu_limit_bytes:
            return False
        if self.message is not None and self.message.format in ("vllm-startup", "serving-config"):
            return False  # a budget a server was told to take, not one cudaMalloc
        seg = allocation_size(round_size(req))
        needed, usable = self.needed_bytes, self.usable_bytes
        if needed is None or not usable or needed > ROOM_HELD_SHARE * usable:
            return False
        return free >= max(ROOM_SEGMENTS * seg, seg + ROOM_SPARE)

    @property
    def reserved_unallocated_bytes(self) -> int | None:
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def usable_bytes(self) -> int | None:
        """What this process could have held at most at the OOM: its reservation plus the device's free
        memory (else its limit less the memory outside PyTorch), capped by a fraction cap."""
        usable = None
        if self.reserved_bytes is not None and self.device_free_bytes is not None:
            usable = self.reserved_bytes + self.device_free_bytes
        elif self.limit_bytes is not None:
            usable = self.limit_bytes - (self.non_pytorch_bytes or 0)
        if usable is not None and self.fraction_cap_bytes:
            usable = min(usable, self.fraction_cap_bytes)
        return usable

    @property
    def needed_bytes(self) -> int | None:
        """What the job held plus what it asked for at the OOM."""
        if self.allocated_bytes is None or self.request_bytes is None:
            return None
        return self.allocated_bytes + self.request_bytes

    @property
    def outside_allocator(self) -> bool:
        """The OOM came from a CUDA call outside the caching allocator (``CUDA error: out of memory``: a
        library's workspace, NCCL, a kernel launch) while the allocator held well under the device: what
        filled the device is not in the allocator's figures."""
        m = self.message
        limit = self.limit_bytes
        return bool(
            m is not None
            and m.format == "cuda-error"
            and self.reserved_bytes is not None
            and limit
            and self.reserved_bytes < 0.9 * limit
        )

    @property
    def physical_bytes(self) -> int:
        """The device's own size: its total, or what its product name states when a layer between (a vGPU's
        hooked total) reports less; 0 when neither is known."""
        return max(self.total_bytes or 0, self.named_total_bytes or 0)

    @property
    def request_beyond_device(self) -> bool:
        """The one allocation that failed is larger than the whole device (its physical size): nothing a
        leak, a neighbour or the cache's layout held could have made room for it."""
        physical = self.physical_bytes
        return bool(
            self.is_cuda_oom and physical and self.request_bytes is not None and self.request_bytes > physical
        )

    @property
    def request_beyond_floor(self) -> bool:
        """The failing allocation does not fit beside the least the log ever showed the job holding (its
        lowest printed live memory: the weights, before anything else): whatever else was released, a
        leak's blocks or a neighbour's, the device could not have held it."""
        physical = self.physical_bytes
        floor = self.log_floor_bytes
        return bool(
            self.is_cuda_oom
            and physical
            and floor
            and self.request_bytes is not None
            and floor + self.request_bytes > FLOOR_MARGIN * physical
        )

    @property
    def own_others_bytes(self) -> int:
        """GPU memory the job's other processes hold on this device (its own pids, not the one that failed:
        an evaluation server, a second rank, DataLoader workers that touched CUDA)."""
        if self.pid is None:
            return 0
        return sum(
            p.used_bytes
            for p in self.processes
            if p.pid is not None and p.pid in self.own_pids and p.pid != self.pid
        )

    @property
    def neighbour_took_margin(self) -> int | None:
        """The highest peak of the earlier steps, when those steps (at least ``TRACE_MIN_CYCLES``, flat,
        at the batch size that failed) reached what this moment needed (within 2%), and the other processes
        on the device hold at least what the job was short of: the steps fitted before, and a neighbour,
        however small, took the margin they ran in. None otherwise."""
        peaks = self.step_peaks
        needed, usable = self.needed_bytes, self.usable_bytes
        if len(peaks) < TRACE_MIN_CYCLES or needed is None or usable is None or self.batch_grew_from:
            return None
        t = self.trend
        if t is None or t.rising_fraction >= 0.5 or t.growth_bytes > 0.05 * usable:
            return None
        top = max(peaks)
        # the earlier peak within 2% of this moment's need: the same point of the same step
        if top < 0.98 * needed or max(top, needed) > usable + self.other_process_bytes:
            return None
        return top

    @property
    def hit_own_limit(self) -> bool:
        """The job hit a limit of its own below the device (a fraction cap, a vGPU share): what it held plus
        the request was over that limit, so what other processes held beyond it did not decide."""
        limit = self.limit_bytes
        physical = self.physical_bytes
        if self.vgpu_limit_bytes:
            return True  # the layer accounts each container's share apart
        if not limit or not physical or limit >= physical * 0.98:
            return False
        if self.fraction_rejected:
            return True
        if self.reserved_bytes is None or self.request_bytes is None:
            return False
        return self.reserved_bytes + (self.request_rounded_bytes or self.request_bytes) > limit

    @property
    def promised_bytes(self) -> int | None:
        """Memory the job was promised when a platform limit sits below it (declared GPU, MIG, cap, vGPU)."""
        limited = self.limit_bytes
        if self.cap_set_by_job and limited == self.fraction_cap_bytes:
            return None  # the job capped itself, whatever it was declared for
        if self.declared_total_bytes and limited and self.declared_total_bytes > limited * 1.05:
            return self.declared_total_bytes
        if self.declared_total_bytes and limited:
            return None  # it runs in what it was declared for
        physical = self.physical_bytes
        if physical and limited and limited < physical * 0.98:
            return physical  # a fraction cap or a vGPU limit below the device (a hooked total: its name's)
        return None

    @property
    def batch_grew_from(self) -> int:
        """The earlier steps' largest batch when the batch grew (a ramp) in the failing step or in one of
        the last RECENT_BATCH_STEPS completed steps, else 0."""
        sizes = [s.batch_size for s in self.steps]
        if self.batch_size is not None:
            sizes.append(self.batch_size)
        known = [b for b in sizes if b is not None]
        if len(known) < 2:
            return 0
        recent, before = known[-(RECENT_BATCH_STEPS + 1) :], known[: -(RECENT_BATCH_STEPS + 1)]
        base = max(before) if before else recent[0]
        if max(recent) > base and known[-1] > base:
            return base
        return 0


# ---------------------------------------------------------------------------- building


def _traced_files(ev: Evidence, texts: Sequence[str]) -> None:
    """The job's own source files its tracebacks in ``texts`` run through (user code), into ``ev.traced_files``."""
    for t in texts:
        for f in _RE_TRACEBACK_FILE.findall(t):
            path = f.replace("\\", "/")
            if (
                path not in ev.traced_files
                and ev.classifier.classify({"filename": f, "line": 1, "name": ""})[1]
            ):
                ev.traced_files.append(path)


def _smi_rows_of_device(ev: Evidence, m: Any) -> list[Any]:
    """The rows of the log's nvidia-smi listing that are the failing GPU's: all of them when it lists one GPU;
    of several, those of the GPU the OOM message names."""
    gpus = {r.gpu for r in ev.log_smi}
    if len(gpus) == 1:
        return list(ev.log_smi)
    dev = m.device_index if m is not None else None
    if dev is None or dev not in gpus:
        return []
    return [r for r in ev.log_smi if r.gpu == dev]


def _interpreter_of_job(ev: Evidence, name: str) -> bool:
    """Whether a process nvidia-smi listed is the job's Python: its interpreter lives in the folder (or that
    folder's virtual environment) the job's own traced source files are in (``/home/u/ComfyUI/venv/bin/python``
    beside ``/home/u/ComfyUI/execution.py``)."""
    path = name.replace("\\", "/")
    if "/bin/python" not in path or not path.startswith("/"):
        return False
    root = path.split("/bin/python", 1)[0]
    for env in ("/venv", "/.venv", "/env", "/.env"):
        if root.endswith(env):
            root = root[: -len(env)]
            break
    return root.count("/") >= 2 and any(f.startswith(root + "/") for f in ev.traced_files)


def _jobs_own_file(ev: Evidence, path: str) -> bool:
    """Whether ``path`` is one of the job's own source files: one its tracebacks ran through as user code, or
    one in the same folder as those or below it (its launcher beside its worker, its utilities), or one named
    without a folder (relative to the job's own working directory). A platform's hook or a site's launcher
    (``/opt/gpushare/…/launch.py``, a ``sitecustomize.py``) is elsewhere."""
    path = path.replace("\\", "/")
    name = path.rsplit("/", 1)[-1]
    if "/" not in path and name not in ("sitecustomize.py", "usercustomize.py"):
        return True  # a name without a folder, as the job's logger prints its own files (``train.py:88``)
    for f in ev.traced_files:
        home = f.rsplit("/", 1)[0] if "/" in f else ""
        if (
            name == f.rsplit("/", 1)[-1]
            or _folder(path) == _folder(f) != ""
            # under the folder a traced file is in (``/app/utils/mem.py`` beside ``/app/train.py``)
            or (home.strip("/") != "" and path.startswith(home + "/"))
        ):
            return True
    return False


def _fraction_calls(ev: Evidence, text: str) -> None:
    """Lines of ``text`` that show a memory fraction being set from one of the job's own source files: the
    line names a file (the job's logger printing where it set it, a traceback's printed source line) that is
    the job's own (``_jobs_own_file``)."""
    if not ev.traced_files:
        return
    for ln in text.split("\n"):
        fc = _RE_FRACTION_CALL.search(ln) if "set_per_process_memory_fraction" in ln else None
        if fc is None:
            continue
        named = [f.replace("\\", "/") for f in _RE_PY_FILE.findall(ln)]
        mine = sorted(f.rsplit("/", 1)[-1] for f in named if _jobs_own_file(ev, f))
        if mine:
            ev.log_fraction_calls.append((float(fc.group(1)), mine[0], ln.strip()[:160]))


def _folder(path: str) -> str:
    """The name of the folder a source path is in ("src" for ``/src/train.py`` and ``src/packer.py``)."""
    parts = path.split("/")
    return parts[-2] if len(parts) > 1 else ""


def _cap_in_log(ev: Evidence, cap: int, total: int) -> None:
    """The log shows the job's own code setting this cap (the same fraction of the device, within 1%): the
    limit is the job's choice, not the platform's."""
    for fraction, name, line in ev.log_fraction_calls:
        if abs(fraction * total - cap) <= 0.01 * total:
            ev.cap_set_by_job = f"{name}, as the log shows: {line[:120]}"
            return


def build_evidence(
    snapshot: Snapshot | None = None,
    text: str | None = None,
    bundle: dict[str, Any] | None = None,
    *,
    batch_size: int | None = None,
    classifier: FrameClassifier | None = None,
    survivors: bool = True,
) -> Evidence:
    ev = Evidence(classifier=classifier or FrameClassifier(), bundle=dict(bundle or {}))
    b = ev.bundle
    from_log: set[int] = set()  # messages found in the log text (ids)
    if snapshot is not None:
        ev.snapshot = snapshot
        ev.accounting = account(snapshot)
        ev.timelines = replay(snapshot)
        ev.sites = live_sites(snapshot, ev.timelines, ev.classifier)
    reason = _get(b, "k8s", "termination", "reason")
    if reason == "Error" and _int(_get(b, "k8s", "termination", "exit_code")) == 137:
        # the kubelet reports a kill in the container's memory cgroup as OOMKilled: SIGKILL with reason Error
        # came from elsewhere (a preemption, a deadline, a runtime's stop past its grace period)
        ev.other_killer = (
            "Kubernetes: the container terminated with reason Error (not OOMKilled), exit code 137"
        )
    if text:
        from triage.logsource import plain_text

        text = plain_text(text)  # a log pipeline's export (JSON lines, Loki, Elasticsearch, CSV): its lines
    texts = [
        t
        for t in (text, _get(b, "error", "message"), _get(b, "error", "traceback"))
        if isinstance(t, str) and t
    ]
    if texts:
        ev.launcher_pids = set().union(*(_launcher_pids(t) for t in texts))
        roots = [int(m.group(1)) for t in texts for m in _RE_ROOT_CAUSE.finditer(t)]
        if roots:
            ev.root_rank = roots[-1]
        from triage.messages import lines_holding

        candidates: list[str] = []
        for t in texts:
            lines = t.split("\n")
            candidates.extend(lines[i] for i in lines_holding(lines, _LOG_LINE_WORDS))
        killers = [ln for ln in candidates if _RE_OTHER_KILLER.search(ln)]
        if killers:
            ev.other_killer = killers[-1].strip()[:200]
        asked = {(p.lower(), int(gb)) for ln in candidates for p, gb in _RE_MIG_RESOURCE.findall(ln)}
        if len(asked) == 1:
            ev.log_asked_mig = asked.pop()
        labelled = {int(v) for ln in candidates for v in _RE_GFD_MEMORY.findall(ln)}
        if len(labelled) == 1:  # several nodes' labels listed: not decided
            ev.log_gpu_label_bytes = labelled.pop() * MiB
        accelerators = {
            (a.lower(), int(gb))
            for ln in candidates
            for a, gb in (*_RE_GKE_ACCELERATOR.findall(ln), *_RE_GRES_TYPE.findall(ln))
        }
        if len(accelerators) == 1:
            name, gb = accelerators.pop()
            ev.log_asked_gpu = (name, gb * GiB)
        profiles = {
            p.lower()
            for ln in candidates
            for p in _RE_MIG_PROFILE.findall(_RE_MIG_RESOURCE.sub("", ln) if "nvidia.com" in ln else ln)
        }
        if len(profiles) == 1:  # several different slices listed (nvidia-smi -L of the node): not decided
            ev.log_mig_profile = profiles.pop()
        _traced_files(ev, texts)
        for t in texts:
            if "set_per_process_memory_fraction" in t:
                _fraction_calls(ev, t)
            if "emory_fraction" in t or "EMORY_FRACTION" in t or "memory-fraction" in t:
                ev.log_fraction_calls.extend(
                    (float(m.group(1)), "the server's own memory fraction setting", m.group(0))
                    for m in _RE_FRACTION_FLAG.finditer(t)
                )
        ev.host_growth = host_growth("\n".join(texts))
        grid = {(f"{b}-{gb}{k}", int(gb)) for ln in candidates for b, gb, k in _RE_GRID_PROFILE.findall(ln)}
        if len(grid) == 1:
            ev.log_vgpu_profile = grid.pop()
        asked_vgpu = {(b.upper(), int(gb)) for ln in candidates for b, gb in _RE_ASKED_VGPU.findall(ln)}
        if len(asked_vgpu) == 1:
            ev.log_asked_vgpu = asked_vgpu.pop()
        names = {n for ln in candidates for n in _RE_PRODUCT_NAME.findall(ln)}
        if len({_named_bytes(n) for n in names}) == 1:  # products of several sizes named: not decided
            ev.log_device_name = sorted(names)[0]
        elif not names:
            # a desktop or workstation GPU, whose name does not state its memory; it has no MIG
            desk = {n for ln in candidates for n in _RE_DESKTOP_GPU.findall(ln)}
            if len(desk) == 1:
                ev.log_device_name = desk.pop()
        from triage.messages import parse_messages

        seen: dict[str, int] = {}  # a message's text -> its place in ev.messages
        for t in texts:
            for m in parse_messages(t):
                at = seen.get(m.text)
                if at is None:
                    seen[m.text] = len(ev.messages)
                    ev.messages.append(m)
                    if t is text:
                        from_log.add(id(m))
                elif m.format == "host-pinned" and ev.messages[at].format == "cuda-error":
                    # the exception's text alone, and its traceback showing it came from pinning host memory:
                    # one error, read as the traceback shows it
                    ev.messages[at] = m
                    if t is text:
                        from_log.add(id(m))
    _pick_message(ev)
    if text and ev.message is not None and id(ev.message) in from_log:
        ev.earlier_attempt_pids = _earlier_attempt_pids(text, ev.message.line_no)
        if _get(b, "workload", "step") is None:
            from triage.messages import setup_frame

            ev.setup_call = setup_frame(text, ev.message.line_no, ev.message.rank)
            if ev.setup_call is None:
                from triage.messages import first_step_bar

                ev.first_step_bar = first_step_bar(text, ev.message.line_no)
            rerun = _notebook_rerun(text)
            if rerun is not None and (ev.setup_call or ev.first_step_bar):
                # a kernel that ran the same cell again keeps what the earlier runs made while anything still
                # references it: its first step is not a fresh process's
                ev.setup_call = ev.first_step_bar = None
                ev.notes.append(
                    f"The notebook ran `{rerun[0][:80]}` again (cells {', '.join(map(str, rerun[1]))}) in one "
                    "kernel: what the earlier runs made stays alive while anything still references it (a "
                    "variable, a trainer, an exception's traceback), so failing early says nothing."
                )
            from triage.messages import size_change_before

            ev.log_size_change = size_change_before(text, ev.message.line_no, ev.message.rank)
            if (
                ev.log_size_change is not None
                and batch_size is None
                and _get(b, "workload", "batch_size") is None
            ):
                what, _, new_size = ev.log_size_change
                if what.lower().replace("_", " ") in {k.replace("_", " ") for k in _BATCH_KEYS}:
                    batch_size = new_size  # the failing step ran at the batch size the log changed it to
        from triage.messages import bus_error_frame, progress_before, smi_gpu_usage, smi_listing

        ev.bus_error_frame = bus_error_frame(text)
        ev.log_smi = smi_listing(text)
        if _RE_TRITON_LOG.search(text):
            ev.service_pids = {
                r.pid
                for r in ev.log_smi
                if r.name.rsplit("/", 1)[-1] == "tritonserver"
                or r.name.endswith("triton_python_backend_stub")
            }
        if ev.log_smi:
            first = ev.log_smi[0].line_no
            ev.log_smi_before_start = first < (ev.message.line_no or 0) and not progress_before(text, first)
            at = ev.message.line_no or 0
            if first > at:
                # run from a shell prompt after the traceback: the job's process had exited
                between = text.split("\n", first)[at : first - 1]
                ev.log_smi_after_exit = any(_RE_PROMPT_SMI.match(ln) for ln in between)
        else:
            gpus = smi_gpu_usage(text)
            dev = ev.message.device_index
            pick = [g for g in gpus if len(gpus) == 1 or (dev is not None and g.gpu == dev)]
            if (
                pick
                and pick[0].line_no < (ev.message.line_no or 0)
                and not progress_before(text, pick[0].line_no)
            ):
                ev.log_smi_gpu = pick[0]
    _kind(ev)
    if text and snapshot is None and not _get(b, "kind"):
        _went_on(ev, text, from_log)
    _device(ev)
    _snapshot_facts(ev)
    _processes(ev)
    _workload(ev, batch_size)
    if ev.setup_call is not None and ev.step is None:
        ev.step = 0  # nothing had run yet: what the first step would have been
        ev.notes.append(
            f"The OOM came while the model was being set up ({ev.setup_call}), before the log shows any "
            "training step."
        )
    if ev.step is None and ev.message is not None and ev.message.format in SERVING_START_FORMATS:
        ev.step = 0
        ev.notes.append(
            f"The message is {ev.message.extra.get('engine', 'an inference server')}'s own check at start-up, "
            "before it served any request."
        )
    if ev.first_step_bar is not None and ev.step is None:
        ev.step = 0
        ev.notes.append(
            "The OOM came before the first step finished: "
            + (
                "the loop's own lines name step 0 as the one it was in"
                if ev.first_step_bar == "step 0"
                else f"the progress bar still read {ev.first_step_bar}"
            )
            + ", and nothing before it showed any progress."
        )
    if text and ev.trend is None and not ev.steps:
        _log_samples(ev, text, from_log)
    if ev.trend is None and not ev.has_frames:
        # without stacks the trace cannot name surviving sites; its cycles still show what each step kept
        _trace_trend(ev)
    _host(ev)
    if survivors:
        _survivors(ev)
        _kept_calls(ev)
    ev.eval_gather = _eval_gather(ev, text)
    if ev.device_had_room:
        ev.notes.append(
            f"The device still had {human(ev.device_free_bytes or 0)} free after the failure, many times the "
            f"{human(ev.request_bytes or 0)} requested: the job's own memory did not run out. Something outside "
            "its tensors refused the allocation: a memory cap this input does not show (a fraction set by a "
            "wrapper, a virtual-GPU layer), a neighbour that freed its memory just after, or the host (the driver "
            "needs host memory to map device memory; a full host RAM fails it). nvidia-smi and the host's memory "
            "at the time would decide."
        )
    _contract(ev)
    return ev


# IPython's and Jupyter's input prompt: "In [12]: model = load()"
_RE_IN_PROMPT = re.compile(r"^In \[(\d{1,5})\]: (\S.{8,300})$", re.MULTILINE)


def _notebook_rerun(text: str) -> tuple[str, list[int]] | None:
    """(statement, cells) when a notebook's log shows one statement run in two or more cells of one kernel
    (a model loaded again, a training cell run again)."""
    if "In [" not in text:
        return None
    cells: dict[str, list[int]] = {}
    for m in _RE_IN_PROMPT.finditer(text):
        cells.setdefault(m.group(2).strip(), []).append(int(m.group(1)))
    again = [(stmt, ns) for stmt, ns in cells.items() if len(set(ns)) >= 2]
    return max(again, key=lambda a: len(a[1])) if again else None


# an evaluation loop gathering every batch's predictions (HF Trainer's nested_concat /
# torch_pad_and_concatenate without eval_accumulation_steps, accelerate's gather_for_metrics)
_RE_GATHER_FN = re.compile(
    r"^(?:torch_pad_and_concatenate|nested_concat|nested_numpify|_nested_gather|gather_for_metrics"
    r"|_pad_across_processes)$"
)
_RE_EVAL_LOOP_FN = re.compile(r"^(?:evaluation_loop|prediction_loop|evaluate|predict|_evaluate)$")
_RE_TB_FN = re.compile(r'File "([^"\n]{1,300})", line (\d{1,7}), in (\w{1,80})')


def _eval_gather(ev: Evidence, text: str | None) -> str | None:
    """The frame of an evaluation loop's gathering of predictions the OOM came in ("trainer_pt_utils.py:127 in
    nested_concat"), from the trace's OOM entry or the traceback: predictions kept on the GPU across the
    evaluation's batches, growing with the evaluation set."""
    frames: list[tuple[str, int, str]] = []
    oom = ev.oom_entry
    if oom is not None and oom.frames:
        frames = [
            (str(f.get("filename") or ""), int(f.get("line") or 0), str(f.get("name") or ""))
            for f in oom.frames
            if isinstance(f, dict)
        ]
    else:
        tb = _get(ev.bundle, "error", "traceback")
        source = tb if isinstance(tb, str) else text
        if source and ev.message is not None and "File " in source:
            upto = (
                source
                if source is tb or ev.message.line_no is None
                else "\n".join(source.split("\n", ev.message.line_no)[: ev.message.line_no])
            )
            # (a traceback lists the outermost call first: innermost first, as a trace's frames are)
            frames = [(f, int(n), fn) for f, n, fn in reversed(_RE_TB_FN.findall(upto[-20000:]))]
    gather = next((fr for fr in frames if _RE_GATHER_FN.match(fr[2])), None)
    if gather is None or not any(_RE_EVAL_LOOP_FN.match(fr[2]) for fr in frames):
        return None
    return f"{gather[0].replace(chr(92), '/').rsplit('/', 1)[-1]}:{gather[1]} in {gather[2]}"


def _earlier_attempt_pids(text: str, line_no: int | None) -> set[int]:
    """Pids the launcher named for the job's workers before its last restart ahead of line ``line_no``
    (1-based) and never after it: the workers of an earlier attempt. One still on the GPU outlived it."""
    from triage.messages import restart_offsets

    head = text if line_no is None else "\n".join(text.split("\n", line_no)[:line_no])
    restarts = restart_offsets(head)
    if not restarts:
        return set()
    cut = restarts[-1]
    after = text[cut:]
    # the launcher tears the old workers down as it restarts ("Sending process N closing signal SIGTERM",
    # "Unable to shutdown process N …"): those pids are the earlier attempt's, named after the restart line
    torn = {int(m.group(1)) for m in _RE_TEARDOWN_PID.finditer(after)}
    kept = "\n".join(ln for ln in after.split("\n") if not _RE_TEARDOWN_PID.search(ln))
    return (_launcher_pids(text[:cut]) | torn) - _launcher_pids(kept)


_RE_TEARDOWN_PID = re.compile(r"(?:Sending process|Unable to shutdown process) (\d{1,10})\b")


def _launcher_pids(text: str) -> set[int]:
    """The job's worker pids its launcher's lines in ``text`` name (only lines that say "pid", "process" or
    "NCCL" are searched: every pattern holds one of them)."""
    from triage.messages import lines_holding

    lines = text.split("\n")
    return {
        int(g)
        for i in lines_holding(lines, ("pid", "process", "nccl"))
        for m in _RE_LAUNCHER_PID.finditer(lines[i])
        for g in m.groups()
        if g is not None
    }


def _pick_message(ev: Evidence) -> None:
    # the collector's own rank; for a log alone, the rank torchrun names as the first failure
    rank = _int(_get(ev.bundle, "workload", "rank"))
    if rank is None:
        rank = ev.root_rank
    cuda = [m for m in ev.messages if m.kind == "cuda_oom"]
    pool = cuda or ev.messages
    if not pool:
        return
    last_cuda = max((m.line_no for m in cuda if m.line_no is not None), default=None)
    if last_cuda is not None:
        # a /dev/shm failure after the last CUDA OOM is what ended the job: that OOM was caught (an
        # evaluation loop that skips a batch, a batch-size finder) and training went on
        # (a worker's own "Unexpected bus error" line alone, or an error Python printed as "Exception ignored
        # in" at shutdown, is the workers dying with their parent)
        later = [
            m
            for m in ev.messages
            if m.kind == "shm_exhausted"
            and m.format != "shm-worker-bus-error"
            and m.extra.get("ignored") != "true"
            and (m.line_no or 0) > last_cuda
        ]
        if later:
            ev.message = later[-1]
            return
    if rank is not None:
        mine = [m for m in pool if m.rank == rank]
        if mine:
            pool = mine
    # prefer the message with the most numbers in it; of equals, the last (the fatal one: an earlier one
    # may have been caught and retried, by a batch-size finder for instance)
    ev.message = max(
        enumerate(pool),
        key=lambda im: (im[1].total_bytes is not None, im[1].requested_bytes is not None, im[0]),
    )[1]


def _went_on(ev: Evidence, text: str, from_log: set[int]) -> None:
    """A log whose CUDA OOM was caught: the process printed training progress after it (an evaluation
    loop that skips the batch, a batch-size finder, a retry with a smaller batch) and died later of
    something else, or finished. The OOM is not what ended the job; a later shm failure or host kill is."""
    from triage.messages import went_on_after

    m = ev.message
    if m is None or m.kind != "cuda_oom" or id(m) not in from_log or m.line_no is None:
        return
    progress, fatal = went_on_after(text, m.line_no, m.rank)
    # the loop's own word, just after the OOM, that it caught it ("skipping batch", fairseq's "attempting to
    # recover from OOM"), and training progress after that
    after = text.split("\n", m.line_no + CAUGHT_LINES)[m.line_no : m.line_no + CAUGHT_LINES]
    said = any(_RE_CAUGHT.search(ln) for ln in after)
    if progress < (1 if said else PROGRESS_AFTER_OOM):
        return
    what = f"{progress} lines of training progress follow it" + (f", then `{fatal}`" if fatal else "")
    ev.survived_oom = f"The CUDA OOM at line {m.line_no} did not end the job: {what}."
    ev.notes.append(ev.survived_oom)
    later = [
        x for x in ev.messages if x.kind != "cuda_oom" and id(x) in from_log and (x.line_no or 0) > m.line_no
    ]
    if later:
        ev.message = later[-1]
        ev.kind = ev.message.kind
    else:
        ev.kind = "crash"


def _kind(ev: Evidence) -> None:
    kind = _get(ev.bundle, "kind")
    if isinstance(kind, str) and kind:
        ev.kind = kind
    elif ev.message is not None:
        ev.kind = ev.message.kind
    elif any(t.oom is not None for t in ev.timelines):
        ev.kind = "cuda_oom"
    elif ev.snapshot is not None:
        ev.kind = "none"
    if ev.kind in ("crash", "unknown") and ev.message is not None:
        ev.kind = ev.message.kind
    if (
        ev.kind == "cuda_oom"
        and ev.message is not None
        and ev.message.format == "host-pinned"
        and not any(t.oom is not None for t in ev.timelines)
    ):
        # CUDA's "out of memory" came from pinning host memory (the error's own traceback says so) and the
        # device's allocator recorded no OOM: the host ran short, not the GPU
        ev.kind = "host_oom"


def _device(ev: Evidence) -> None:
    b, m = ev.bundle, ev.message
    dev = _part(b, "device")
    obs = _part(b, "allocator", "observer")
    ev.device = _int(dev.get("index"))
    if ev.device is None and m is not None:
        ev.device = m.device_index
    if ev.device is None and isinstance(obs, dict):
        ev.device = _int(obs.get("device"))
    oom_tls = [t for t in ev.timelines if t.oom is not None]
    if ev.device is None and oom_tls:
        ev.device = oom_tls[0].device
    tl = next((t for t in ev.timelines if t.device == ev.device), None)
    if tl is None and len(ev.timelines) == 1:
        tl = ev.timelines[0]
    if tl is not None and tl.oom is not None:
        ev.oom_entry = tl.oom
        ev.oom_timeline = tl
    ev.device_name = str(dev.get("name") or "")
    ev.total_bytes = _int(dev.get("total_bytes")) or (m.total_bytes if m else None)
    ev.declared_total_bytes = _int(dev.get("declared_total_bytes"))
    prof = dev.get("mig_profile")
    if isinstance(prof, str) and prof:
        ev.mig_profile = prof
    elif " MIG " in f" {ev.device_name} ":
        ev.mig_profile = ev.device_name.split("MIG", 1)[1].strip() or "unknown"
    if ev.mig_profile is None and ev.log_mig_profile and not ev.device_name:
        ev.mig_profile = ev.log_mig_profile
        ev.notes.append(f"The log names the device as a MIG slice ({ev.log_mig_profile}).")
    asked = ev.log_asked_mig
    if asked and ev.mig_profile and ev.declared_total_bytes is None:
        # the pod asked for one slice and runs on another: what it asked for is what it was sized for; the one
        # it asked for is the size it was declared for
        ev.declared_total_bytes = asked[1] * GiB
        ev.notes.append(
            f"The log shows the pod asked for a MIG {asked[0]} slice and it runs on {ev.mig_profile}."
            if asked[0] != ev.mig_profile.lower()
            else f"The log shows the pod asked for the MIG {asked[0]} slice it runs on."
        )
    if ev.log_asked_gpu and ev.declared_total_bytes is None and ev.mig_profile is None and not asked:
        # what the job asked for (its node selector) before the label of the node it got: a node labelled
        # for another GPU than it has is what sent the job there
        name, size = ev.log_asked_gpu
        ev.declared_total_bytes = size
        ev.notes.append(
            f"The log shows the job asked for {name} GPUs ({human(size)}): the size it was sized for."
        )
    label = ev.log_gpu_label_bytes
    if label and ev.declared_total_bytes is None and ev.mig_profile is None and not asked:
        # as the pod enrichment reads the node's label (on a MIG node it is the slice's size: not read)
        ev.declared_total_bytes = label
        ev.notes.append(
            f"The log shows the node's GPU label nvidia.com/gpu.memory={label // MiB} ({human(label)}): the "
            "size the job was scheduled for."
        )
    if not ev.device_name and ev.log_device_name:
        ev.device_name = ev.log_device_name
        ev.notes.append(f"The log names the device: {ev.log_device_name}.")
    if m is not None and m.extra.get("batch_search") == "exhausted":
        ev.notes.append(
            "accelerate's find_executable_batch_size halved the batch size after each out-of-memory error until "
            "it reached zero: not even batch size 1 fitted. What does not shrink with the batch (the weights, the "
            "optimizer state, another process's memory, memory kept across the attempts) filled the memory."
        )
    if m is not None and m.extra.get("library_init"):
        lib = {"cudnn": "cuDNN", "cublas": "cuBLAS"}.get(m.extra["library_init"], m.extra["library_init"])
        ev.notes.append(
            f"{lib} could not initialise ({m.extra.get('error')}): it allocates its handle and workspace on "
            "first use, and a full GPU is the usual cause; a library or driver mismatch reports the same status."
        )
    if m is not None and m.format == "nvml-assert" and ev.mig_profile is None and "MIG" in m.text:
        ev.mig_profile = "unknown"
    cap = _int(_get(b, "allocator", "fraction_cap_bytes"))
    frac = _get(b, "allocator", "fraction")
    if cap is None and isinstance(frac, int | float) and 0 < frac < 1 and ev.total_bytes:
        cap = int(frac * ev.total_bytes)
    if cap is None and m is not None and m.allowed_bytes:
        cap = m.allowed_bytes
    obs_cap = _int(obs.get("device_total_or_cap")) if isinstance(obs, dict) else None
    if cap is None and obs_cap and ev.total_bytes and obs_cap < ev.total_bytes * 0.99:
        cap = obs_cap
    ev.fraction_cap_bytes = cap
    ev.fraction_rejected = bool(m and m.fraction_rejected)
    by = _get(b, "allocator", "fraction_set_by")
    if (
        cap
        and isinstance(by, dict)
        and isinstance(by.get("filename"), str)
        and isinstance(by.get("line"), int)
    ):
        frame = {"filename": by["filename"], "line": by["line"], "name": str(by.get("function") or "")}
        name = by["filename"].replace("\\", "/").rsplit("/", 1)[-1]
        where = f"{name}:{by['line']}" + (f" in {frame['name']}" if frame["name"] else "")
        user = ev.classifier.classify(frame)[1]
        if user and (not ev.traced_files or _jobs_own_file(ev, by["filename"])):
            ev.cap_set_by_job = where
        elif user:
            # user code by its path, but outside the folders the job's own traceback runs through
            ev.notes.append(
                f"The memory fraction was set at {where}, outside the job's own source (its traceback runs "
                f"through {ev.traced_files[-1]}): a launcher's or the site's, not the job's."
            )
    if cap and ev.cap_set_by_job is None and ev.total_bytes:
        _cap_in_log(ev, cap, ev.total_bytes)
    if m is not None:
        ev.vgpu_limit_bytes = m.vgpu_limit_bytes
        ev.vgpu_used_bytes = m.vgpu_used_bytes
    ev.named_total_bytes = _named_bytes(ev.device_name) if ev.mig_profile is None else None
    if ev.vgpu_limit_bytes is None:
        ev.vgpu_limit_bytes = _vgpu_env_limit(_get(b, "environment"), ev.device)
    _grid_profile(ev, b)
    named = ev.named_total_bytes
    if ev.vgpu_limit_bytes is None and named and ev.total_bytes and ev.total_bytes < 0.9 * named:
        # the device reports far less than its product has: a layer between (HAMi hooks cuMemGetInfo)
        ev.vgpu_limit_bytes = ev.total_bytes
        ev.notes.append(
            f"The device is named {ev.device_name} but reports {human(ev.total_bytes)}: a virtual-GPU layer "
            "limits what the job sees."
        )
    # the request and what the device had free
    req = m.requested_bytes if m else None
    if req is None and isinstance(obs, dict):
        req = _int(obs.get("alloc_size"))
    if ev.oom_entry is not None:
        ev.request_rounded_bytes = ev.oom_entry.size
        if req is None:
            req = ev.oom_entry.size
    ev.request_bytes = req
    free = m.free_bytes if m else None
    if free is None and ev.oom_entry is not None:
        free = ev.oom_entry.device_free
    if free is None and isinstance(obs, dict):
        free = _int(obs.get("device_free"))
    if free is None:
        free = _int(dev.get("free_bytes"))
    ev.device_free_bytes = free
    rounded = ev.request_rounded_bytes
    if rounded is not None:
        ev.request_pool = "small" if rounded <= SMALL_POOL_MAX else "large"
    elif req is not None:
        ev.request_pool = "small" if req <= 2 * MiB else "large"


def _snapshot_facts(ev: Evidence) -> None:
    m = ev.message
    settings = ev.snapshot.allocator_settings if ev.snapshot is not None else {}
    if not settings:
        s2 = _get(ev.bundle, "allocator", "settings")
        settings = s2 if isinstance(s2, dict) else {}
    conf = (
        settings.get("PYTORCH_CUDA_ALLOC_CONF")
        or _get(ev.bundle, "environment", "PYTORCH_CUDA_ALLOC_CONF")
        or ""
    )
    ev.alloc_conf = str(conf)
    exp = settings.get("expandable_segments")
    if isinstance(exp, bool):
        ev.expandable_segments = exp
    elif "expandable_segments:true" in ev.alloc_conf.replace(" ", "").lower():
        ev.expandable_segments = True
    elif ev.snapshot is not None and ev.snapshot.segments:
        ev.expandable_segments = any(s.is_expandable for s in ev.snapshot.segments)
    if ev.accounting is not None and ev.accounting.total.segments:
        acc = ev.accounting
        dev_tot: Totals | None = acc.by_device.get(ev.device) if ev.device is not None else None
        if dev_tot is None:
            if len(acc.by_device) == 1:
                ev.device, dev_tot = next(iter(acc.by_device.items()))
            else:
                dev_tot = acc.total
        ev.reserved_bytes = dev_tot.reserved_bytes
        ev.allocated_bytes = dev_tot.allocated_bytes
        ev.private_pool_bytes = dev_tot.private_pool_bytes
        ev.largest_free_block_bytes, ev.free_in_pool_bytes = _usable_holes(ev)
        _roll_back_to_oom(ev)
        _check_against_message(ev)
    elif m is not None:
        ev.allocated_bytes = m.allocated_bytes
        ev.reserved_bytes = _message_reserved(m)
        ev.private_pool_bytes = m.private_pool_bytes
    if ev.reserved_bytes is None:
        stats = _get(ev.bundle, "allocator", "memory_stats")
        if isinstance(stats, dict):
            ev.reserved_bytes = _int(stats.get("reserved_bytes.all.current"))
            ev.allocated_bytes = _int(stats.get("allocated_bytes.all.current"))


def _usable_holes(ev: Evidence) -> tuple[int, int]:
    """The largest free block the failing request could have used (same device, pool and stream), and
    the sum of all such blocks."""
    assert ev.snapshot is not None
    stream = ev.oom_entry.stream if ev.oom_entry is not None else 0
    best = 0
    total = 0
    for seg in ev.snapshot.segments:
        if ev.device is not None and seg.device != ev.device:
            continue
        if not _serves_request(ev, stream, seg.pool_id, seg.segment_type, seg.stream):
            continue
        for blk in seg.blocks:
            if blk.state == INACTIVE:
                total += blk.size
                if blk.size > best:
                    best = blk.size
    return best, total


def _serves_request(
    ev: Evidence, stream: int, pool_id: tuple[int, int], seg_type: str, seg_stream: int
) -> bool:
    """Whether the failing request could have used a segment's free blocks: the default pool, the
    request's own stream and size class."""
    return pool_id == (0, 0) and seg_stream == stream and ev.request_pool in (None, seg_type)


def _roll_back_to_oom(ev: Evidence) -> None:
    """The allocator at the OOM, from a snapshot taken after it.

    A snapshot dumped in an ``except`` handler, or at the crash, comes after the exception unwound the
    failing step: the tensors that step held are freed, and their blocks show as holes that the allocator
    did not have when it failed (a hole bigger than the request, next to "the cache could not serve it").
    The trace recorded every change since the ``oom`` entry, so undoing those entries, newest first, gives
    back the allocated and reserved bytes and the free blocks the failing request saw: a block freed since
    was allocated; a block allocated since was free; a segment created since did not exist; a segment
    released since existed (whole, and then free, since the allocator releases only free segments).
    Expandable segments (map/unmap) are left as they are.
    """
    tl, oom, snap = ev.oom_timeline, ev.oom_entry, ev.snapshot
    if tl is None or oom is None or snap is None or ev.allocated_bytes is None or ev.reserved_bytes is None:
        return
    after = tl.raw[oom.index + 1 :]
    if not after or any(e.get("action") in ("segment_map", "segment_unmap") for e in after):
        return
    freed = "free_completed" if tl.actions.get("free_completed") else "free_requested"
    if not any(e.get("action") in (freed, "alloc", "segment_alloc", "segment_free") for e in after):
        return
    stream = oom.stream
    # [start, end, usable by the request, free intervals] per segment of the OOM's device
    segs: list[list[Any]] = [
        [
            seg.address,
            seg.address + seg.total_size,
            _serves_request(ev, stream, seg.pool_id, seg.segment_type, seg.stream),
            [[b.address, b.address + b.size] for b in seg.blocks if b.state == INACTIVE],
        ]
        for seg in snap.segments
        if seg.device == tl.device
    ]

    starts: list[int] = []

    def index() -> None:
        segs.sort(key=itemgetter(0))
        starts[:] = [sg[0] for sg in segs]

    def holder(addr: int) -> list[Any] | None:
        i = bisect_right(starts, addr) - 1
        return segs[i] if i >= 0 and addr < segs[i][1] else None

    index()

    allocated, reserved, undone = ev.allocated_bytes, ev.reserved_bytes, 0
    for e in reversed(after):
        action, addr, size = e.get("action"), int(e.get("addr") or 0), int(e.get("size") or 0)
        if action == freed:
            n = round_size(size)
            allocated += n
            undone += n
            sg = holder(addr)
            if sg is not None:
                sg[3] = _carve(sg[3], addr, addr + n)
        elif action == "alloc":
            n = round_size(size)
            allocated -= n
            sg = holder(addr)
            if sg is not None:
                sg[3] = _merge([*sg[3], [addr, addr + n]])
        elif action == "segment_alloc":
            reserved -= size
            segs = [sg for sg in segs if not sg[0] <= addr < sg[1]]
            index()
        elif action == "segment_free":
            reserved += size
            kind = "small" if size <= 2 * MiB else "large"
            serves = _serves_request(ev, stream, (0, 0), kind, int(e.get("stream") or 0))
            segs.append([addr, addr + size, serves, [[addr, addr + size]]])
            index()
    holes = [hi - lo for sg in segs if sg[2] for lo, hi in sg[3]]
    ev.allocated_bytes, ev.reserved_bytes = max(0, allocated), max(0, reserved)
    ev.largest_free_block_bytes, ev.free_in_pool_bytes = max(holes, default=0), sum(holes)
    if undone >= MiB:
        ev.notes.append(
            f"The snapshot was taken {len(after)} trace entries after the OOM, when {human(undone)} of the "
            "failing step's memory had been freed; the accounting here is the allocator's at the OOM (the trace rolled "
            f"back): {human(ev.allocated_bytes)} allocated, {human(ev.reserved_bytes)} reserved."
        )


def _message_reserved(m: OomMessage) -> int | None:
    """What the process had reserved at the OOM, as its message gives it (older formats print the total,
    newer ones allocated and reserved-but-unallocated)."""
    if m.reserved_bytes is not None or m.allocated_bytes is None or m.reserved_unallocated_bytes is None:
        return m.reserved_bytes
    return m.allocated_bytes + m.reserved_unallocated_bytes


def _check_against_message(ev: Evidence) -> None:
    """A snapshot from another moment than the OOM that the trace could not bring back (no trace, or
    the OOM not in it): its allocated bytes disagree with the message's, which torch printed at the OOM.
    Then the message's accounting stands, and the snapshot's free blocks say nothing about the holes the
    request saw."""
    m = ev.message
    if m is None or m.allocated_bytes is None or ev.allocated_bytes is None:
        return
    gap = ev.allocated_bytes - m.allocated_bytes
    if abs(gap) <= max(SNAPSHOT_MESSAGE_SLACK, 0.02 * m.allocated_bytes):
        return
    when = "after" if gap < 0 else "before"
    ev.notes.append(
        f"The snapshot holds {human(ev.allocated_bytes)} allocated where the OOM message says "
        f"{human(m.allocated_bytes)}: it was taken {when} the OOM, and its trace cannot bring it back. The "
        "message's accounting is used; the snapshot's free blocks are not the ones the request saw."
    )
    ev.allocated_bytes = m.allocated_bytes
    reserved = _message_reserved(m)
    if reserved is not None:
        ev.reserved_bytes = reserved
    ev.largest_free_block_bytes = ev.free_in_pool_bytes = None


def _carve(free: list[list[int]], lo: int, hi: int) -> list[list[int]]:
    """Free intervals less [lo, hi)."""
    out: list[list[int]] = []
    for a, b in free:
        if b <= lo or a >= hi:
            out.append([a, b])
            continue
        if a < lo:
            out.append([a, lo])
        if hi < b:
            out.append([hi, b])
    return out


def _merge(free: list[list[int]]) -> list[list[int]]:
    """Free intervals with touching or overlapping ones joined (the allocator merges free neighbours)."""
    out: list[list[int]] = []
    for a, b in sorted(free):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _processes(ev: Evidence) -> None:
    b, m = ev.bundle, ev.message
    wl = _part(b, "workload")
    pids = wl.get("pids") if isinstance(wl, dict) else None
    if isinstance(pids, list):
        ev.own_pids.update(p for p in pids if isinstance(p, int))
    pid = _int(wl.get("pid")) if isinstance(wl, dict) else None
    if pid is not None:
        ev.own_pids.add(pid)
        ev.pid = pid
    nvml = _get(b, "device", "processes")
    unknown: list[Process] = []  # NVML reports N/A (pynvml: None) for some processes' usage
    if isinstance(nvml, list) and nvml:
        for p in nvml:
            if not isinstance(p, dict):
                continue
            ppid = _int(p.get("pid"))
            used = _int(p.get("used_bytes"))
            proc = Process(ppid, used or 0, ppid in ev.own_pids, "nvml", str(p.get("name") or ""))
            ev.processes.append(proc)
            if used is None:
                unknown.append(proc)
    elif m is not None and m.processes:
        for pu in m.processes:
            own = pu.this_process or _worker_of_job(ev, pu.pid, pu.used_bytes)
            ev.processes.append(Process(pu.pid, pu.used_bytes, own, "message"))
    elif rows := _smi_rows_of_device(ev, m):
        # nvidia-smi's listing in the log (one GPU's, or the failing GPU's rows of several): the job's own rows
        # by pid; printed before the job started, the rest were there before it
        for r in rows:
            own = _worker_of_job(ev, r.pid, r.used_bytes) or _interpreter_of_job(ev, r.name)
            ev.processes.append(Process(r.pid, r.used_bytes, own, "nvidia-smi", r.name))
    ev.own_process_identified = any(p.own for p in ev.processes)
    if ev.processes and not ev.own_process_identified and ev.reserved_bytes is not None:
        # In a container torch prints "Process PID has X" for the failing process itself. Its usage is
        # its reservation plus its own context, so the line closest above the reservation is the job.
        fits = [
            p
            for p in ev.processes
            if ev.reserved_bytes * 0.98 <= p.used_bytes <= ev.reserved_bytes + CUDA_CONTEXT_MAX
        ]
        # NVML lists every process on the device, the failing one among them: when only one line holds at
        # least the job's reservation, that line is the job, whatever its own non-PyTorch memory (NCCL's
        # buffers and library workspaces on a large GPU can pass a plain context's size)
        could = [p for p in ev.processes if p.used_bytes >= ev.reserved_bytes * 0.98]
        if fits:
            me = min(fits, key=lambda p: p.used_bytes - ev.reserved_bytes if ev.reserved_bytes else 0)
            why = "match the job's reservation plus its CUDA context"
        elif (
            len(could) == 1
            and (ev.total_bytes is None or could[0].used_bytes <= ev.total_bytes)
            # (a listing printed before the job started need not hold the job at all)
            and could[0].source != "nvidia-smi"
        ):
            me = could[0]
            why = "are the only line that holds at least the job's reservation"
        else:
            me = None
        if me is not None:
            me.own = True
            ev.own_process_identified = True
            ev.notes.append(
                f"Process {me.pid} was taken to be the job itself: its {human(me.used_bytes)} {why} "
                f"({human(ev.reserved_bytes)})."
            )
    if (
        ev.processes
        and not ev.own_process_identified
        and ev.reserved_bytes is None
        and _get(b, "allocator", "memory_stats") == {}
        and all(p.used_bytes > CUDA_CONTEXT_MAX for p in ev.processes)
    ):
        # CUDA was never initialised in the job's process (its memory_stats are empty): it held a context at
        # most, so no process holding more is the job
        ev.own_absent = True
        ev.notes.append(
            "The job's process had not initialised CUDA (its allocator's statistics are empty): none of the "
            "processes on the GPU, each holding more than a CUDA context, is the job."
        )
    smi = [p for p in ev.processes if p.source == "nvidia-smi"]
    if smi and ev.log_smi_before_start and not ev.own_process_identified and ev.reserved_bytes is not None:
        # the job itself may have printed the listing after loading its model, before its first step: a line
        # holding no more than the job held at the OOM (and a context) could be the job's
        bound = ev.reserved_bytes + CUDA_CONTEXT_MAX
        ev.processes = [p for p in ev.processes if p.source != "nvidia-smi" or p.used_bytes > bound]
        smi = [p for p in ev.processes if p.source == "nvidia-smi"]
    if smi and not ev.own_process_identified and not ev.log_smi_before_start and not ev.log_smi_after_exit:
        # printed while the job ran or after it failed, the listing holds the job's own process too: with no
        # line known to be the job's, none is known to be a neighbour's
        ev.processes = [p for p in ev.processes if p.source != "nvidia-smi"]
    elif smi:
        when = (
            "before the job showed any progress"
            if ev.log_smi_before_start
            else "from the shell after the job had exited"
            if ev.log_smi_after_exit and not ev.own_process_identified
            else "in the log"
        )
        ev.notes.append(
            f"nvidia-smi listed {len(smi)} process(es) on the GPU {when} (line {ev.log_smi[0].line_no}): "
            + ", ".join(
                f"{p.pid}{f' ({p.name})' if p.name else ''} {human(p.used_bytes)}{' (the job)' if p.own else ''}"
                for p in smi
            )
            + "."
        )
    g = ev.log_smi_gpu
    if g is not None and not ev.processes and not ev.own_absent:
        # everything on the GPU before the job showed progress; had the job itself printed it after loading
        # its model, its share was at most what it held at the OOM (and a context)
        others = g.used_bytes - (ev.reserved_bytes or 0) - CUDA_CONTEXT_MAX
        if others > 0:
            ev.processes.append(Process(None, others, False, "nvidia-smi", "no process listed"))
            ev.log_smi_before_start = True
            ev.notes.append(
                f"nvidia-smi showed {human(g.used_bytes)} in use on the GPU before the job showed any progress "
                f"(line {g.line_no}), listing no process: at least {human(others)} of it was other processes' "
                "(all but what the job held at the OOM and a CUDA context)."
            )
    _sibling_contexts(ev)
    if ev.total_bytes is not None and ev.device_free_bytes is not None and ev.reserved_bytes is not None:
        ev.non_pytorch_bytes = max(0, ev.total_bytes - ev.device_free_bytes - ev.reserved_bytes)
    _unreported_usage(ev, [p for p in unknown if not p.own])
    if (
        ev.processes
        and all(p.own and p.source == "message" for p in ev.processes)
        and ev.total_bytes is not None
        and ev.device_free_bytes is not None
        and ev.vgpu_limit_bytes is None  # a virtual-GPU layer's total and free are its own accounting
    ):
        ev.unlisted_bytes = max(
            0, ev.total_bytes - ev.device_free_bytes - sum(p.used_bytes for p in ev.processes)
        )
    ev.other_process_bytes = sum(p.used_bytes for p in ev.processes if not p.own)


# nvidia-smi run at a shell prompt ("$ nvidia-smi", "user@host:~$ nvidia-smi", "# nvidia-smi -q")
_RE_PROMPT_SMI = re.compile(
    r"^\s{0,4}(?:\(\S{1,40}\) )?(?:[\w@.:~/-]{1,80})?[$#] {1,3}(?:sudo )?nvidia-smi\b"
)
# Triton's own log lines (its glog prefix names its source files) or its backend API
_RE_TRITON_LOG = re.compile(r"TRITONBACKEND_|(?:tritonserver|pb_stub|python_be|model_lifecycle)\.cc:\d")


def _worker_of_job(ev: Evidence, pid: int | None, used: int) -> bool:
    """Whether a process listed on the GPU is the job's own (its pid, or a worker its launcher started in this
    attempt: two of its ranks share the GPU); a worker of an earlier attempt is not, it outlived it."""
    if pid is None:
        return False
    if pid in ev.own_pids:
        return True
    if pid in ev.earlier_attempt_pids:
        ev.notes.append(
            f"Process {pid} ({human(used)} on this GPU) was one of the job's workers before the launcher "
            "restarted them: it outlived its attempt and still holds the memory."
        )
        return False
    if pid in ev.service_pids:
        ev.notes.append(
            f"Process {pid} ({human(used)} on this GPU) is the failing server's own (Triton's server or one of "
            "the Python-backend stubs it starts per model instance): the server's model instances fill the GPU."
        )
        return True
    if pid in ev.launcher_pids:
        # another rank of this job on the same GPU: not a neighbour, the job's own placement
        ev.notes.append(
            f"Process {pid} ({human(used)} on this GPU) is one of the job's own workers (its launcher started "
            "it): two of its ranks share the GPU. Set each rank's device from LOCAL_RANK "
            "(torch.cuda.set_device), or give each worker a whole GPU."
        )
        return True
    return False


SIBLING_PIDS = 16  # pids this close to the job's own were started with it (its launcher's other ranks)


def _sibling_contexts(ev: Evidence) -> None:
    """Other processes holding no more than a bare CUDA context on this GPU, with pids next to the job's
    own (started by the same launcher, one after another): the job's other ranks, which touched this GPU
    before choosing their own (``torch.cuda.set_device`` after something ran on ``cuda:0``). They are the
    job's own placement, not a neighbour."""
    own = [p.pid for p in ev.processes if p.own and p.pid is not None]
    if not own or ev.bundle.get("device"):
        return  # the collector's NVML list names the job's pids itself
    siblings = [
        p
        for p in ev.processes
        if not p.own
        and p.pid is not None
        and 0 < p.used_bytes <= CUDA_CONTEXT_MAX
        and min(abs(p.pid - q) for q in own) <= SIBLING_PIDS
    ]
    if not siblings:
        return
    for p in siblings:
        p.own = True
    ev.notes.append(
        f"Process{'es' if len(siblings) > 1 else ''} {', '.join(str(p.pid) for p in siblings)} hold{'' if len(siblings) > 1 else 's'} "
        f"no more than a CUDA context ({human(sum(p.used_bytes for p in siblings))} in all) and were started "
        "next to the job: its other ranks, which touched this GPU before choosing their own. Set each rank's "
        "device from LOCAL_RANK (torch.cuda.set_device) before anything runs on the GPU."
    )


def _unreported_usage(ev: Evidence, unknown: list[Process]) -> None:
    """Other processes whose usage NVML could not report: the device memory nobody else accounts for
    (outside this job's reservation and its own CUDA context, beyond what the other listed processes
    hold) is theirs, shared equally."""
    if not unknown or ev.non_pytorch_bytes is None or ev.reserved_bytes is None:
        return
    own = [p for p in ev.processes if p.own and p.used_bytes]
    ctx = min(CUDA_CONTEXT_MAX, max(0, own[0].used_bytes - ev.reserved_bytes)) if own else CUDA_CONTEXT_MAX
    known = sum(p.used_bytes for p in ev.processes if not p.own)
    rest = ev.non_pytorch_bytes - ctx - known
    if rest <= CUDA_CONTEXT_MAX:
        return
    for p in unknown:
        p.used_bytes = rest // len(unknown)
    pids = ", ".join(str(p.pid) for p in unknown)
    ev.notes.append(
        f"NVML could not report the usage of process {pids} (N/A): the {human(rest)} of the device that "
        "nothing else accounts for is taken to be theirs."
    )


def _workload(ev: Evidence, batch_size: int | None) -> None:
    wl = _part(ev.bundle, "workload")
    ev.batch_size = batch_size or (_int(wl.get("batch_size")) if isinstance(wl, dict) else None)
    ev.step = _int(wl.get("step")) if isinstance(wl, dict) else None
    tl = _get(ev.bundle, "timeline")
    if isinstance(tl, list) and ev.device is not None:
        # the collector samples the process's current device: another device's steps say nothing of this one
        # (a process that runs a second model on a second GPU)
        mine = [s for s in tl if not isinstance(s, dict) or _int(s.get("device")) in (None, ev.device)]
        if len(mine) < len(tl):
            ev.notes.append(
                f"{len(tl) - len(mine)} of the per-step samples are of another device than the OOM's (device "
                f"{ev.device}): they are not read as its steps."
            )
            tl = mine
    if isinstance(tl, list):
        # in the order recorded (the collector's is oldest first), cut where the step count went back
        attempts = _attempts(_step_samples(tl, ordered=False))
        ev.steps = attempts[-1] if attempts else []
        if len(attempts) >= 2:
            _restart_growth(ev, attempts)
        if ev.step is not None and ev.steps and ev.step < ev.steps[-1].step:
            ev.restarted_again = True
        ev.trend = _phase_trend(ev.steps)


MIN_LOG_SAMPLES = 4  # memory prints in a log before they are read as the job's steps
MIN_PEAK_SAMPLES = 8  # prints of the peak alone before they are read as the job's steps


def _log_samples(ev: Evidence, text: str, from_log: set[int]) -> None:
    """The live memory the log printed at its steps (DeepSpeed's see_memory_usage, a loop printing
    ``torch.cuda.memory_allocated()``), up to the failure, read as the collector's step samples."""
    from triage.messages import memory_samples

    m = ev.message if ev.message is not None and id(ev.message) in from_log else None
    samples = memory_samples(text, m.rank if m else None, m.line_no if m else None)
    other_ranks = not samples and m is not None and m.rank is not None
    if other_ranks and m is not None:
        # the failing rank printed nothing; the ranks that did (most loops log on rank 0 only) run the same
        # code: whether live memory grew step after step holds for every rank. What each rank holds can
        # differ (a pipeline's stages), so their floors and peaks are not taken for the failing rank's.
        samples = memory_samples(text, None, m.line_no)
    if any(s.get("reserved") for s in samples):
        samples = _reservation_read(ev, samples)
    # a line that printed the peak alone (torch.cuda.max_memory_allocated()) says how high the steps went,
    # not what they left behind: no floor. A peak that is never reset rises whenever a larger input comes;
    # only a long run of prints that rise nearly every time reads as growth
    floors = [s["allocated_bytes"] for s in samples if not s.get("peak_only")]
    if floors and len(floors) < len(samples):
        # two loggers: one printed live memory, another the peak alone (detectron2's max_mem beside the job's
        # own prints). Interleaved they saw-tooth; each series is read on its own
        samples = (
            _fold_peaks(samples)
            if len(floors) >= MIN_LOG_SAMPLES
            else [s for s in samples if s.get("peak_only")]
        )
        floors = [s["allocated_bytes"] for s in samples if not s.get("peak_only")]
    peaks_only = bool(samples) and not floors
    if floors and not other_ranks:
        ev.log_floor_bytes = min(floors)
    if not other_ranks:
        for s in samples:
            sizes = s.get("sizes")
            b = _printed_batch(sizes) if isinstance(sizes, dict) else None
            if b:
                s["batch_size"] = b
                ev.log_batch_peaks[b] = max(ev.log_batch_peaks.get(b, 0), s["peak_allocated_bytes"])
    tops = [s["peak_allocated_bytes"] for s in samples]
    # peaks printed alone that stayed flat say the steps did not grow as well as live memory's prints do; a rise
    # takes a longer run (a peak never reset rises whenever a larger input comes)
    flat_peaks = bool(tops) and max(tops) - min(tops) <= PRINT_NOISE * max(tops)
    needed = MIN_PEAK_SAMPLES if peaks_only and not flat_peaks else MIN_LOG_SAMPLES
    if len(samples) < needed or ev.setup_call is not None:
        # (printed while the model was still being set up: each sample is a loaded shard, not a step)
        return
    ev.log_peaks_only = peaks_only
    ev.growth_with_input = _growth_with_input(samples)
    ev.steps = _step_samples(samples)
    ev.peaks_sampled = not other_ranks and any(
        s["peak_allocated_bytes"] > s["allocated_bytes"] for s in samples
    )
    ev.trend = _phase_trend(ev.steps)
    if ev.trend is not None:
        ev.notes.append(
            f"Live memory per step is read from the log's own prints ({len(samples)} samples, steps "
            f"{ev.steps[0].step}–{ev.steps[-1].step}: {human(ev.steps[0].allocated_bytes)} → "
            f"{human(ev.steps[-1].allocated_bytes)})"
            + (f", printed by other ranks than the failing rank {m.rank}." if other_ranks and m else ".")
        )


_BATCH_KEYS = ("batch_size", "bs", "micro_batch_size", "batch size", "micro batch")


def _printed_batch(sizes: dict[str, Any]) -> int | None:
    """The batch size a loop printed beside a memory reading (``bs=16``, ``batch_size: 32``)."""
    return next((int(sizes[k]) for k in _BATCH_KEYS if sizes.get(k)), None)


def _reservation_read(ev: Evidence, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples without the reservation's prints, unless they stayed flat (the steps' peaks stayed under
    it) or the OOM shows the reservation was nearly all allocated: then it rose with what the steps allocated;
    with much of it free (holes that could not serve the requests, cached memory), its rise may be the
    cache's, not live memory's."""
    held = [s["allocated_bytes"] for s in samples if s.get("reserved")]
    rise = max(held) - min(held)
    free = ev.reserved_unallocated_bytes
    if rise <= RESERVED_FLAT * max(held) or (free is not None and free <= RESERVED_FREE_SHARE * rise):
        return samples
    return [s for s in samples if not s.get("reserved")]


def _growth_with_input(samples: list[dict[str, Any]]) -> tuple[str, int, int] | None:
    """(what, first, last) when live memory rose (by more than noise) only where a size the loop printed
    beside it grew (a curriculum's ``seq_len=1024`` → ``2048``, a larger ``batch_size``), at least twice, and
    never fell: the input grew, and live memory with it (the last batch's outputs, caches sized by it)."""
    rises = 0
    key: str | None = None
    first = last = 0
    run_low = samples[0]["allocated_bytes"] if samples else 0  # the lowest print since the size last grew
    for a, b in itertools.pairwise(samples):
        sa, sb = a.get("sizes"), b.get("sizes")
        if not isinstance(sa, dict) or not isinstance(sb, dict):
            return None
        grew = [k for k in sb if k in sa and sb[k] > sa[k]]
        if any(k in sa and sb[k] < sa[k] for k in sb):
            return None
        # a print's own rounding ("6.72G") moves it by a few percent at the same input
        noise = max(PRINT_NOISE_BYTES, int(PRINT_NOISE * max(a["allocated_bytes"], b["allocated_bytes"])))
        diff = b["allocated_bytes"] - a["allocated_bytes"]
        if grew and diff > noise:
            rises += 1
            if key is None:
                key, first = grew[0], sa[grew[0]]
            if grew[0] == key:
                last = sb[key]
            run_low = b["allocated_bytes"]
            continue
        if grew:
            run_low = b["allocated_bytes"]
        elif diff < -noise and b["allocated_bytes"] < run_low - noise:
            return None  # fell below where this input started: not memory that follows the input
        elif b["allocated_bytes"] - run_low > noise:
            return None  # rose at the same input: something kept
        run_low = min(run_low, b["allocated_bytes"])
    return (key, first, last) if key is not None and rises >= 2 else None


def _fold_peaks(samples: list[dict[str, int]]) -> list[dict[str, int]]:
    """The samples of live memory, each with the highest peak printed alone since the one before it (a
    running peak is never below the step's own)."""
    out: list[dict[str, int]] = []
    pending = 0
    for s in samples:
        if s.get("peak_only"):
            pending = max(pending, s["peak_allocated_bytes"])
            continue
        out.append({**s, "peak_allocated_bytes": max(s["peak_allocated_bytes"], pending)})
        pending = 0
    return out


def _phase_trend(ss: Sequence[StepSample]) -> StepTrend | None:
    """The trend of the samples; when they saw-tooth with a period k (sampled at every micro-step of
    gradient accumulation: the gradients are held until the optimizer step frees them) and every sample
    is at least the one k before it, the trend of the samples in the last one's phase — one per period,
    like the optimizer steps."""
    t = _trend_of(ss)
    if t is None or t.falling_fraction < 0.15 or t.rising_fraction > 0.7:
        return t
    live = [s.allocated_bytes for s in ss]
    for k in range(2, 9):
        if len(ss) < 4 * k:
            break
        if all(live[i + k] >= live[i] - 512 for i in range(len(live) - k)):
            sub = _trend_of(ss[len(ss) - 1 :: -k][::-1])
            if sub is not None:
                return sub
    return t


def trace_cycles(levels: Sequence[int], min_cycles: int = TRACE_MIN_CYCLES) -> list[tuple[int, int]]:
    """(low point, highest level since the previous low point) of each cycle of live memory in a trace.

    A training step raises live memory (forward) and gives most of it back (backward, optimizer): its
    low point is what the step kept. Cycles are found with hysteresis: a fall of at least ``h`` after a
    high, then a rise of ``h``. ``h`` is the largest of a few fractions of the trace's range that still
    finds ``min_cycles`` cycles — the biggest recurring swing is the step; smaller ones (the backward's
    own ups and downs, a gradient-accumulation micro-step) only appear at smaller ``h``.
    """
    if len(levels) < 8:
        return []
    lo, hi = min(levels), max(levels)
    for frac in (0.5, 0.35, 0.25, 0.18, 0.12):
        h = frac * (hi - lo)
        if h <= 0:
            return []
        out: list[tuple[int, int]] = []
        rising = True
        ext = top = levels[0]
        for v in levels:
            if rising:
                if v > ext:
                    ext = v
                top = max(top, v)
                if v < ext - h:
                    rising, ext = False, v
            else:
                ext = min(ext, v)
                top = max(top, v)
                if v > ext + h:
                    out.append((ext, top))
                    rising, top = True, v
                    ext = v
        if not rising:
            out.append((ext, top))  # the trace ends in a low (the OOM came after a step)
        if len(out) >= min_cycles:
            return out
    return []


def _trace_trend(ev: Evidence) -> None:
    """No per-step samples: read the steps from the allocator trace of the OOM's device instead."""
    tl = ev.oom_timeline
    if tl is None or not tl.levels:
        return
    cycles = trace_cycles(tl.levels)
    if not cycles:
        return
    base = tl.start_allocated
    # a step whose rise (its peak above the previous step's low point) differs by more than a quarter from
    # the step before it ran a different workload (a bigger batch, a longer sequence): marked like a batch
    # size change, so the jump in what it kept is not read as growth
    samples = []
    workload, prev_rise, prev_low = 1, None, tl.levels[0]
    for i, (low, top) in enumerate(cycles):
        rise = max(1, top - prev_low)
        if prev_rise is not None and not 0.8 <= rise / prev_rise <= 1.25:
            workload += 1
        samples.append(
            {
                "step": i,
                "allocated_bytes": low + base,
                "peak_allocated_bytes": top + base,
                "batch_size": workload,
            }
        )
        prev_rise, prev_low = rise, low
    # the first cycle is not comparable: the first step allocates the optimizer's state and workspaces,
    # and a trace that starts mid-run starts mid-step
    samples = samples[1:]
    if len(samples) < TRACE_MIN_CYCLES or workload - samples[0]["batch_size"] > len(samples) // 3:
        return  # too few steps, or cycles too unlike each other to be read as the same step repeated
    ev.trend = _trend(samples)
    if ev.trend is not None:
        ev.trend_source = "trace"
        ev.notes.append(
            f"No per-step memory samples: {len(samples)} steps were read from the allocator trace "
            "(the low point of each cycle of live memory)."
        )


HOST_RISING_SHARE = 0.8  # of the changes between host-memory prints: rose at nearly every one
HOST_GROWTH_SHARE = 0.5  # of the first print: grew by half again or more


def host_growth(text: str) -> tuple[int, int, int, int, bool] | None:
    """(first step, bytes, last step, bytes, printed at training steps) when the host memory the log printed at its steps
    (``triage.messages.host_memory_samples``) rose at ``HOST_RISING_SHARE`` of its prints or more and by
    ``HOST_GROWTH_SHARE`` of where it began and 1 GiB or more: the job's own host memory growing step after
    step (a list of CPU tensors or batches kept, Python objects in DataLoader workers touched copy-on-write),
    which a pod's memory limit only ends. A need that stays level, and a limit too low for it, print flat."""
    from triage.messages import MIN_HOST_SAMPLES, host_memory_samples

    samples = host_memory_samples(text) if text else []
    if len(samples) < MIN_HOST_SAMPLES:
        return None
    values = [v for _, v, _ in samples]
    rises = sum(1 for a, b in itertools.pairwise(values) if b > a * 1.002)
    first, last = values[0], values[-1]
    if rises < HOST_RISING_SHARE * (len(values) - 1) or last - first < max(GiB, HOST_GROWTH_SHARE * first):
        return None
    return samples[0][0], first, samples[-1][0], last, any(t for _, _, t in samples)


def _host(ev: Evidence) -> None:
    host = _part(ev.bundle, "host")
    ev.shm_total_bytes = _int(host.get("shm_total_bytes"))
    ev.shm_used_bytes = _int(host.get("shm_used_bytes"))
    ev.dataloader_workers = _int(host.get("dataloader_workers"))
    dead = host.get("dead_dataloader_workers")
    if isinstance(dead, list):
        ev.dead_workers_sigbus = sum(
            1
            for w in dead
            if isinstance(w, dict) and str(w.get("signal", "")).upper() in ("SIGBUS", "BUS", "7")
        )
    cg = host.get("cgroup") or {}
    if isinstance(cg, dict):
        ev.cgroup_limit_bytes = _int(cg.get("memory_limit_bytes"))
        ev.cgroup_usage_bytes = _int(cg.get("memory_usage_bytes"))
        ev.oom_kill_count = _int(cg.get("oom_kill_count"))
    if ev.message is not None and ev.message.exit_code is not None:
        ev.exit_code = ev.message.exit_code
    code = _int(_get(ev.bundle, "error", "exit_code"))
    if code is not None:
        ev.exit_code = code


def _survivors(ev: Evidence) -> None:
    """Sites whose surviving blocks were made in different steps: between two survivors live memory fell
    back below the level it had when the earlier one was made (that step's activations were freed)."""
    by_dev = {t.device: t for t in ev.timelines}
    swings: dict[int, int] = {}
    orders: dict[int, list[int]] = {}  # entry indices of the model's allocations, per device
    olders: dict[int, dict[tuple[Any, Any, Any], list[tuple[int, int]]]] = {}
    for st in ev.sites:
        if st.traced < (2 if st.count > st.traced else 3) or st.site.kind in ("native", "unknown"):
            # blocks without a stack are not one site: their survival proves nothing together; two made
            # in the trace beside older ones from the same line may be a site that keeps adding
            continue
        dev = min(st.devices) if st.devices else 0
        tl = by_dev.get(dev)
        if tl is None or not tl.levels:
            continue
        swing = swings.get(dev)
        if swing is None:
            swing = swings[dev] = _step_swing(tl)
        call_of = _model_calls(ev, tl)
        st = _without_failing_call(ev, tl, call_of, st)
        idx = st.alloc_indices
        order = orders.get(dev)
        if order is None:
            order = orders[dev] = sorted(call_of)
        # two blocks made in one call of the model are layers of one forward pass, not two steps: each call
        # is read at its first survivor, so two calls' are compared at the same point of their forward
        # passes (the last layer's of one against the first layer's of the next would differ by a whole
        # forward's activations); made in two calls, only a backward between them ends a step
        firsts: list[int] = []
        passes: set[int] = set()  # firsts that began a new forward pass inside what reads as one call
        for j, i in enumerate(idx):
            c = call_of.get(i)
            if j == 0 or c is None or c != call_of.get(idx[j - 1]):
                firsts.append(i)
            elif _passed_again(ev, tl, call_of, firsts[-1], i):
                firsts.append(i)
                passes.add(i)
        cycles = sum(
            1
            for a, c in itertools.pairwise(firsts)
            # two calls' first survivors sit at the same point of their forward passes: memory that rose
            # and came back down between them is a forward and a backward that came and went
            if c in passes
            or (
                (call_of.get(a) is None or call_of.get(a) != call_of.get(c))
                and (
                    _is_cycle(tl, a, c, swing)
                    or _call_between(tl, call_of, order, a, c)
                    or _next_call_without_grad(tl, call_of, a, c)
                )
            )
        )
        freed = max(0, st.allocs_in_trace - st.traced)
        after = 0
        if freed and idx:
            by_site = allocs_by_site(ev)
            alive = set(idx)
            after = sum(1 for i in by_site.get((dev, st.site), []) if i > idx[0] and i not in alive)
        # the blocks of one call are one survivor: a call under way at the OOM holds its activations, one
        # gap, however many layers it has run
        sv = Survivors(st, cycles, len(firsts) - 1, freed, after)
        calls = {c[0] if (c := call_of.get(i)) is not None else None for i in idx}
        if len(calls) == 1 and (key := calls.pop()) is not None:
            sv.call = Site(str(key[0]), int(key[1] or 0), str(key[2]))
        if sv.evicted_like_a_cache:
            sv.evicted_meanwhile = _freed_after(tl, allocs_by_site(ev).get((dev, st.site), []), idx[0])
        if freed == 0 and st.count > st.traced and len(firsts) >= 3:
            older = olders.get(dev)
            if older is None:
                older = olders[dev] = _older_frees(ev, tl)
            sv.replacing = _replacing(tl, firsts, older)
        ev.survivors.append(sv)
    ev.survivors.sort(key=lambda s: (-s.cycles, -s.stats.bytes))


def _without_failing_call(
    ev: Evidence, tl: DeviceTimeline, call_of: dict[int, CallId], st: SiteStats
) -> SiteStats:
    """The site's live blocks less those the forward pass under way at the OOM made (the failing call of the
    model: the OOM's own stack runs through it), when the site also kept blocks from earlier calls. Those are
    the failing pass's activations, alive because it had not finished: what the site kept is the rest."""
    oom = ev.oom_entry
    if oom is None or (ev.device is not None and ev.device != tl.device):
        return st
    # under way at the OOM: the last allocation before it was made in that call (not a next batch copied in);
    # an OOM recorded without its stack is taken to be in that call
    last = call_of.get(tl.alloc_indices[-1]) if tl.alloc_indices else None
    failing = last
    if oom.frames:
        key = model_call(ev.classifier, oom.frames)
        if key is None:
            return st
        failing = max((c for c in call_of.values() if c[0] == key), key=lambda c: c[1], default=None)
    if failing is None or last != failing:
        return st
    now = [i for i in st.alloc_indices if call_of.get(i) == failing]
    rest = [i for i in st.alloc_indices if call_of.get(i) != failing]
    if not now or len(rest) < 2:
        return st
    raw = tl.raw
    sizes = dict(st.sizes)
    gone = 0
    for i in now:
        size = int(raw[i].get("size") or 0)
        gone += size
        if sizes.get(size):
            sizes[size] -= 1
            if not sizes[size]:
                del sizes[size]
    return dataclasses.replace(
        st,
        bytes=max(0, st.bytes - gone),
        count=st.count - len(now),
        traced=st.traced - len(now),
        sizes=sizes,
        alloc_indices=rest,
        last_index=rest[-1],
    )


ACCUMULATING_SHARE = 0.25  # of live memory: a site that keeps adding this much is a story of its own
GROWING_RUN = 8  # allocations from the failing request's stack, each no smaller than the one before
GROWING_SIZES = 3  # distinct sizes among them: grown at least twice before the request


def growth_run(newest_first: Iterable[int]) -> list[int]:
    """The sizes of the latest run of re-makes that only grew, newest first: read back in time until a
    size larger than the one after it. A run of at least ``GROWING_RUN`` of ``GROWING_SIZES`` sizes or more
    is a tensor re-made larger at every call."""
    out: list[int] = []
    for size in newest_first:
        if out and size > out[-1]:
            break
        out.append(size)
    return out


def grew(run: list[int], min_run: int = GROWING_RUN) -> bool:
    """Whether a ``growth_run`` is long (``min_run``) and varied enough to be a tensor re-made larger at
    every call."""
    return len(run) >= min_run and len(set(run)) >= GROWING_SIZES


FIRST_STEPS = 2  # steps a trace from the model's load may have seen end with nothing yet able to leak


def nothing_kept(ev: Evidence) -> bool:
    """Without the step samples, whether the trace shows that nothing was kept that could have filled the
    device instead of the step: stacks, no earlier forward passes still held (kept validation outputs), and
    either several steps with no site's blocks surviving across them, or a trace from the start (nothing
    live when it began: the model being loaded) that has seen no more than the first steps end (nothing
    had time to leak).

    The steps are the forward passes that came and went (calls of the model whose blocks were freed);
    only when no call of a model shows in the stacks, the cycles of live memory, which a forward pass's
    large temporaries can pass for, layer after layer."""
    tl = ev.oom_timeline
    if ev.trend is not None or tl is None or not ev.has_frames:
        return False
    if any(s.cycles for s in ev.survivors):
        return False  # some line's blocks outlived a step: a leak too young to convict, but there
    kc = ev.kept_calls
    if kc is not None and kc.calls >= 2 and kc.more_than_before:
        return False  # earlier calls held, more than the line ever held: maybe outputs kept
    steps = ev.freed_calls if ev.freed_calls is not None else ev.trace_steps
    if steps >= TRACE_MIN_CYCLES:
        return True
    return tl.start_allocated == 0 and steps <= (FIRST_STEPS if ev.freed_calls is not None else 1)


def regrown_blocks(ev: Evidence, min_run: int = GROWING_RUN) -> list[tuple[SiteStats, list[int]]]:
    """User lines whose one live block is the latest of a run of ``min_run`` or more re-makes that only
    grew, each freeing the one before (``buf = torch.cat([buf, new])``): (the line's live blocks, trace
    indices of the run's allocations, oldest first)."""
    tl = ev.oom_timeline
    if tl is None:
        return []
    made = allocs_by_site(ev)
    out: list[tuple[SiteStats, list[int]]] = []
    for st in ev.sites:
        if st.site.kind != "user" or st.count > 2 or not st.traced:
            continue
        sized = [
            (i, s) for i in made.get((tl.device, st.site), []) if isinstance(s := tl.raw[i].get("size"), int)
        ]
        run = growth_run(s for _, s in reversed(sized))  # newest first
        if grew(run, min_run) and st.bytes >= 0.9 * run[0]:
            out.append((st, [i for i, _ in sized[len(sized) - len(run) :]]))
    return out


REGROWN_CYCLES = 3  # passes through the model between a block's re-makes before it reads as kept across them
REGROWN_SHARE = 0.25  # of live memory at the OOM


def regrown_across_calls(ev: Evidence) -> tuple[SiteStats, int, int, int, int] | None:
    """(the line's live blocks, re-makes, first size, last size, passes) for the largest block that was
    re-made larger outside the model (its stack runs in no forward) with a whole pass through the model
    between re-makes at least ``REGROWN_CYCLES`` times, and that holds ``REGROWN_SHARE`` of live memory or
    more: a tensor concatenated onto itself from call to call and never trimmed (an embedding bank, every
    prediction so far). A KV cache grown by ``torch.cat`` inside ``generate()`` runs in the forward."""
    tl = ev.oom_timeline
    if tl is None or not ev.allocated_bytes:
        return None
    raw = tl.raw
    call_of = _model_calls(ev, tl)
    best: tuple[SiteStats, int, int, int, int] | None = None
    for st, idx in regrown_blocks(ev, REGROWN_CYCLES + 1):
        if st.bytes < REGROWN_SHARE * ev.allocated_bytes or (best is not None and st.bytes <= best[0].bytes):
            continue
        frames = raw[idx[-1]].get("frames") or []
        if model_call(ev.classifier, frames) is not None:
            continue
        passes = sum(1 for a, c in itertools.pairwise(idx) if _model_pass(raw, call_of, a, c))
        if passes >= REGROWN_CYCLES:
            sizes = [raw[i]["size"] for i in idx]
            best = (st, len(idx), sizes[0], sizes[-1], passes)
    return best


def _model_pass(raw: Sequence[Any], call_of: dict[int, CallId], a: int, c: int) -> bool:
    """Whether a block made inside a forward between entries a and c was freed before c."""
    made: set[Any] = set()
    for i in range(a + 1, c):
        e = raw[i]
        if i in call_of:
            made.add(e.get("addr"))
        elif e.get("action") in ("free_requested", "free_completed") and e.get("addr") in made:
            return True
    return False


def regrown_request(ev: Evidence) -> tuple[int, int, int, int, int] | None:
    """(re-makes, first size, request, passes, live bytes) when the failing request is the next re-make of
    one tensor rebuilt larger outside the model (``growing_request``, its stack in no forward), the last
    re-make still alive (the tensor the request was to replace) and holding ``REGROWN_SHARE`` of live
    memory or more, with a whole pass through the model between re-makes at least ``REGROWN_CYCLES``
    times: every call's outputs concatenated onto one tensor on the device (an evaluation loop gathering
    its predictions with ``torch.cat``), found even when the line that keeps it is a library's and the
    user's own frame is the one that started the whole loop."""
    grow = growing_request(ev)
    run = _request_run(ev)
    tl, oom = ev.oom_timeline, ev.oom_entry
    if grow is None or run is None or tl is None or oom is None or not ev.allocated_bytes:
        return None
    if model_call(ev.classifier, oom.frames) is not None:
        return None  # a KV cache grown inside the forward
    idx = run[0]
    if len(idx) < REGROWN_CYCLES + 1:
        return None
    raw = tl.raw
    last = raw[idx[-1]]
    freed = any(
        e.get("action") in ("free_requested", "free_completed") and e.get("addr") == last.get("addr")
        for e in itertools.islice(raw, idx[-1] + 1, oom.index)
    )
    size = last.get("size", 0)
    if freed or not isinstance(size, int):
        return None
    if size < REGROWN_SHARE * ev.allocated_bytes:
        return None
    call_of = _model_calls(ev, tl)
    passes = sum(1 for a, c in itertools.pairwise(idx) if _model_pass(raw, call_of, a, c))
    if passes < REGROWN_CYCLES:
        return None
    return grow[0], grow[1], grow[2], passes, size


def growing_request(ev: Evidence) -> tuple[int, int, int] | None:
    """(allocations, first size, request) when the failing request is the latest of a run of allocations
    from its own stack that only grew: the last ``GROWING_RUN`` or more, each at least as large as the one
    before, of at least ``GROWING_SIZES`` sizes, the request larger than the first. A tensor rebuilt larger
    at every call (a KV cache grown by ``torch.cat`` token after token, a buffer re-made to a longer length):
    the demand was still growing when it failed, and how far it was going is not in the record."""
    run = _request_run(ev)
    if run is None:
        return None
    _, sizes, req = run
    if not grew(sizes) or req <= sizes[-1] or req < max(sizes):
        return None
    return len(sizes), sizes[-1], req


def _request_run(ev: Evidence) -> tuple[list[int], list[int], int] | None:
    """(trace indices oldest first, sizes newest first, request) of the latest run of allocations from the
    failing request's own stack that only grew (``growth_run``); worked out once."""
    if ev.request_run is not False:
        return ev.request_run if isinstance(ev.request_run, tuple) else None
    ev.request_run = None
    tl, oom = ev.oom_timeline, ev.oom_entry
    if tl is None or oom is None or not oom.frames:
        return None
    req = oom.size or ev.request_bytes
    if not req:
        return None
    key = tuple(frame_key(f) for f in oom.frames if isinstance(f, dict))
    seen: dict[int, bool] = {}
    raw = tl.raw
    indices: list[int] = []  # of the sizes yielded, newest first

    def same_stack_sizes() -> Iterator[int]:
        """Sizes of the allocations from the request's own stack before it, newest first."""
        for i in reversed(tl.alloc_indices):
            frames = raw[i].get("frames")
            if i >= oom.index or not frames:
                continue
            hit = seen.get(id(frames))
            if hit is None:
                hit = seen[id(frames)] = tuple(frame_key(f) for f in frames if isinstance(f, dict)) == key
            if hit:
                size = raw[i].get("size", 0)
                if not isinstance(size, int):
                    return
                indices.append(i)
                yield size

    sizes = growth_run(same_stack_sizes())
    if not sizes:
        return None
    ev.request_run = (indices[: len(sizes)][::-1], sizes, req)
    return ev.request_run


def accumulating_site(ev: Evidence) -> Survivors | None:
    """The largest user site that keeps adding (``Survivors.accumulating``) and holds at least
    ``ACCUMULATING_SHARE`` of live memory at the OOM; without step samples, which could settle it. A site
    whose older blocks went as its new ones came (``store_turnover``) does not keep adding: it turns over."""
    if ev.steps or not ev.allocated_bytes:
        return None
    grown = [
        s
        for s in ev.survivors
        if s.accumulating
        and s.stats.site.kind == "user"
        and s.stats.bytes >= ACCUMULATING_SHARE * ev.allocated_bytes
        and store_turnover(ev, s) is None
    ]
    return max(grown, key=lambda s: s.stats.bytes) if grown else None


TURNED_OVER_SHARE = 0.2  # of the bytes a site made in the trace: older blocks of its sizes freed meanwhile
TURNED_OVER_GAPS = 2  # ... between different pairs of its blocks: entries leaving now and again, not one step


def store_turnover(ev: Evidence, sv: Survivors) -> tuple[int, int] | None:
    """(blocks, bytes) of blocks older than the trace freed after the site's first block in it, sized
    within the range of the blocks the site made in the trace, when they are ``TURNED_OVER_SHARE`` of
    what the site made in it or more and were freed between different pairs of its blocks
    (``TURNED_OVER_GAPS``): a store whose entries come and go (an inference server's per-request caches,
    finished requests' freed now and again as new ones are admitted), not a pile that only grows. Read by
    size because a free's stack, when torch records one, is where the tensor died, not where it was made:
    an older block's own line is not in the trace. A leak frees nothing it kept; the step in flight when
    the trace began frees its older tensors once, between the site's first block and its next."""
    tl = next((t for t in ev.timelines if t.device in (sv.stats.devices or {0})), None)
    idx = sv.stats.alloc_indices
    if tl is None or not idx:
        return None
    raw = tl.raw
    sizes = [z for i in idx if isinstance(z := raw[i].get("size"), int)]
    if not sizes:
        return None
    lo, hi, made_bytes = min(sizes), max(sizes), sum(sizes)
    blocks = freed = 0
    gaps: set[int] = set()
    for i in older_block_frees(ev, tl):
        if i > idx[0] and isinstance(z := raw[i].get("size"), int) and lo <= z <= hi:
            blocks += 1
            freed += z
            gaps.add(bisect_left(idx, i))
    turned = len(gaps) >= TURNED_OVER_GAPS and freed >= TURNED_OVER_SHARE * made_bytes
    return (blocks, freed) if turned else None


PER_STEP_MIN = 8  # steps (and blocks) before a count of kept blocks can match the job's step
# how far the count may be from the step, as a share of it (steps are counted from 0 or from 1, with the
# failing one or without)
PER_STEP_SLACK = 0.1


def per_step_blocks(ev: Evidence) -> tuple[Site, int, int] | None:
    """(site, blocks, block size) when one user line holds as many live blocks of one size as the job has
    run steps (within ``PER_STEP_SLACK``), and they are ``ACCUMULATING_SHARE`` of live memory or more: one
    tensor kept at every step (a loss or the logits appended to a list), read off the snapshot alone when
    neither step samples nor a trace that reaches back show the steps. Weights and optimizer state come in
    one per parameter, of many sizes, and a step's own activations of one size come in one per layer:
    neither follows the step count."""
    step = ev.step
    if ev.snapshot is None or step is None or step < PER_STEP_MIN or not ev.allocated_bytes or ev.steps:
        return None
    tl = ev.oom_timeline
    counts = {
        (st.site, size): n
        for st in ev.sites
        if st.site.kind == "user"
        and (tl is None or tl.device in st.devices)
        # (made while the model was built or loaded: a transformer's layers give many weights of one size)
        and not _RE_SETUP_NAME.match(st.site.name or "")
        for size, n in st.sizes.items()
    }
    best: tuple[Site, int, int] | None = None
    for (site, size), n in counts.items():
        if (
            n >= PER_STEP_MIN
            and abs(n - step) <= max(2, PER_STEP_SLACK * step)
            and n * size >= ACCUMULATING_SHARE * ev.allocated_bytes
            and (best is None or n * size > best[1] * best[2])
        ):
            best = (site, n, size)
    return best


# a function that builds or loads a model: what it allocates is weights, not one tensor kept per step
_RE_SETUP_NAME = re.compile(r"__init__$|__new__$|setup$|(?:load|build|init|create|make)(?:_|[A-Z]|$)")
DOMINANT_SHARE = 0.5  # of live memory held by one line that keeps adding: what filled the device
DOMINANT_COUNT = 8  # blocks it holds: added over many steps, not a few buffers


def filling_site(ev: Evidence) -> Survivors | None:
    """The ``accumulating_site`` when it holds ``DOMINANT_SHARE`` of live memory or more in
    ``DOMINANT_COUNT`` blocks or more: added step after step, never let go, most of what the job held.
    Whatever the job meant by it, it is what filled the device."""
    sv = accumulating_site(ev)
    if sv is None or sv.stats.count < DOMINANT_COUNT:
        return None
    return sv if sv.stats.bytes >= DOMINANT_SHARE * (ev.allocated_bytes or 0) else None


WINDOW_GROWTH = 0.3  # of the earlier pace: growth per step since a window began turning over, at most


def turning_window(ev: Evidence) -> Survivors | None:
    """The survivor site whose blocks replace blocks older than the trace, one for one
    (``Survivors.replacing``), and, when the collector sampled the steps, since which live memory stopped
    growing: its steps since the first replaced block grew by under ``WINDOW_GROWTH`` of the pace before.
    A window that filled (the steps grew) and turns over (they stopped): bounded, not a leak."""
    for sv in ev.survivors:
        if sv.replacing is None:
            continue
        k = sv.replacing[2]
        trend = ev.trend
        if trend is None or not ev.steps or len(ev.steps) <= k:
            return sv
        since = ev.steps[-1].allocated_bytes - ev.steps[-(k + 1)].allocated_bytes
        if since <= WINDOW_GROWTH * max(trend.slope_bytes_per_step, 0) * k:
            return sv
    return None


def kept_graphs(ev: Evidence, *, unproven: bool = False) -> tuple[KeptCalls, int | None] | None:
    """(the kept calls, the highest earlier step's peak) when the OOM comes from forward passes kept
    alive: at least two earlier calls of one model-running line still hold their blocks, the earlier
    steps (same batch size) needed less than this moment, and freeing the kept calls' blocks would have
    brought it back within what they needed. Otherwise kept calls that hold at least half of what this
    moment needed, without which it fitted, convict without an earlier peak (None in its place): the call
    under way may want more than a training step did, and a trace that begins at the model's load and
    keeps every forward pass has no step free of them. A step that runs the model several times before one
    backward (views of one sample, micro-batches of a pipeline) keeps its calls alive too, but every
    step does it: the trace shows the line holding half as many calls or more before (a step that runs
    twice as many micro-batches holds twice as many), or, when the line had not run before, at least two
    earlier forward passes (of other lines), freed since, must show that the trace reaches back into the
    steps before it.

    ``unproven``: the same, but for the case the trace cannot settle — it begins with the kept calls (a
    short history), so whether the line kept as many at every step is not known."""
    kc = ev.kept_calls
    if kc is None or kc.calls < 2 or ev.batch_grew_from:
        return None
    if not kc.more_than_before:
        # the line held as many calls at once before, or nearly (a step that sums a varying number of
        # micro-batches' losses for one backward holds one or two more when it runs more of them)
        return None
    # the line held fewer before; or, new in the trace, the trace shows the line's calls freed before; or
    # kept calls outlived an optimizer step (their step's backward and update are over, and their graphs
    # were not let go: a hidden state carried without detach, outputs kept across steps)
    known = kc.before is not None or kc.freed_before >= 2 or kc.past_step >= 1
    if known == unproven:
        return None
    # the collector's samples of the steps, and what the trace shows before the first kept call
    peaks = [s.peak_allocated_bytes for s in ev.steps] if len(ev.steps) >= 2 else []
    if kc.freed_before >= 2 or kc.past_step >= 1:
        peaks.append(kc.peak_before)
    needed = ev.needed_bytes
    if needed is None:
        return None
    if peaks and needed > max(peaks) and kc.kept_bytes >= needed - max(peaks):
        return kc, max(peaks)
    # no earlier step was as large as this moment less the kept calls (the call under way is larger, or
    # no step free of kept calls is known): they are most of what it needed, and without them it fitted
    usable = ev.usable_bytes
    # most of it; a quarter when they outlived an optimizer step (their step was over: nothing else
    # explains them, and their loss's saved tensors, made outside the call, are kept with them)
    share = ACCUMULATING_SHARE if kc.past_step >= 1 else 0.5
    if usable is not None and kc.kept_bytes >= share * needed and needed - kc.kept_bytes <= usable:
        return kc, None
    return None


_MODULE_CALL = frozenset({"_call_impl", "_wrapped_call_impl"})  # torch/nn/modules/module.py: Module.__call__


def frame_key(fr: Any) -> tuple[Any, Any, Any]:
    key = (fr.get("filename"), fr.get("line"), fr.get("name"))
    try:
        hash(key)
    except TypeError:  # an untrusted file put a list or a dict in a frame: it reads as unknown
        name, filename, line = frame_fields(fr)
        return (filename, line, name)
    return key


def model_call(classifier: FrameClassifier, frames: Sequence[Any]) -> tuple[Any, Any, Any] | None:
    """The user line that called the model an allocation ran in (``out = model(x)``): the outermost user
    frame with torch's module-call frames just inside it, or a user ``forward`` (a model's forward called
    directly, or a stack recorded without the module-call frames). None when the allocation did not happen
    inside a forward (the loss, the optimizer, a copy in the loop, the autograd engine's thread)."""
    call = None
    inside = False
    for fr in frames:  # innermost first
        if not isinstance(fr, dict):
            continue
        is_python, is_user = classifier.classify(fr)
        if is_user:
            if inside:
                call = frame_key(fr)
            inside = fr.get("name") == "forward"
        elif is_python and fr.get("name") in _MODULE_CALL and "modules/module" in str(fr.get("filename", "")):
            inside = True
    return call


def live_under_calls(ev: Evidence) -> dict[tuple[Any, Any, Any], tuple[int, int]]:
    """(block bytes, requested bytes) of the live blocks on the OOM's device made inside the calls of each
    model-running line, by the line; their stacks say so whether or not the trace reaches back to them.
    Worked out once."""
    if ev.under_calls is not None:
        return ev.under_calls
    out: dict[tuple[Any, Any, Any], tuple[int, int]] = {}
    tl = ev.oom_timeline
    if ev.snapshot is not None and tl is not None:
        calls: dict[int, tuple[Any, Any, Any] | None] = {}  # by frames-list identity (stacks are shared)
        for seg in ev.snapshot.segments:
            if seg.device != tl.device:
                continue
            for b in seg.blocks:
                if b.allocated and b.frames:
                    key = id(b.frames)
                    if key not in calls:
                        calls[key] = model_call(ev.classifier, b.frames)
                    c = calls[key]
                    if c is not None:
                        size, requested = out.get(c, (0, 0))
                        out[c] = (size + b.size, requested + b.requested_size)
    ev.under_calls = out
    return out


@dataclass(slots=True)
class OlderBlocks:
    """The live blocks on the OOM's device made before the trace began (their allocation is not in it)."""

    bytes: int = 0
    # by the model-running line they were made in a call of: what those calls have held since before the trace
    under_calls: dict[tuple[Any, Any, Any], int] = field(default_factory=dict)
    # by the user line they were made at, outside any call of the model: (blocks, bytes)
    outside_calls: dict[Site, tuple[int, int]] = field(default_factory=dict)


def older_blocks(ev: Evidence) -> OlderBlocks | None:
    """The blocks older than the trace, read once (None without a snapshot and a trace)."""
    if ev.older_blocks is not None:
        return ev.older_blocks
    tl = ev.oom_timeline
    if ev.snapshot is None or tl is None or not tl.entries:
        return None
    out = OlderBlocks()
    calls: dict[int, tuple[Any, Any, Any] | None] = {}  # by frames-list identity (stacks are shared)
    sites: dict[int, Site] = {}
    for seg in ev.snapshot.segments:
        if seg.device != tl.device:
            continue
        for b in seg.blocks:
            if not b.allocated or b.address in tl.live_alloc_index:
                continue
            out.bytes += b.size
            if not b.frames:
                continue
            key = id(b.frames)
            if key not in calls:
                calls[key] = model_call(ev.classifier, b.frames)
                sites[key] = ev.classifier.site(b.frames)
            c = calls[key]
            if c is not None:
                out.under_calls[c] = out.under_calls.get(c, 0) + b.size
            elif sites[key].kind == "user":
                n, size = out.outside_calls.get(sites[key], (0, 0))
                out.outside_calls[sites[key]] = (n + 1, size + b.size)
    ev.older_blocks = out
    return out


def live_under_calls_before_trace(ev: Evidence) -> dict[tuple[Any, Any, Any], int]:
    """Bytes of the live blocks on the OOM's device made inside the calls of each model-running line before
    the trace began (their allocation is not in it): what those calls have held since before the trace."""
    older = older_blocks(ev)
    return older.under_calls if older is not None else {}


STORED_SLACK = 64 * MiB  # what a store's bytes may pass the memory above the last step's floor by (rounding)


def stored_since_steps(ev: Evidence) -> tuple[Site, int, int] | None:
    """(site, blocks, bytes) of the user line, outside any call of the model, whose live blocks made before
    the trace began hold the most, when they fit in what is live beyond the floor the last sampled step
    left, and without them this moment needed no more than the sampled steps peaked at: stored since the
    steps (outputs or metrics appended in an evaluation loop), not the model's weights or state, which the
    floor holds. Needs the collector's samples and a trace."""
    older = older_blocks(ev)
    peaks, needed = ev.step_peaks, ev.needed_bytes
    if older is None or len(ev.steps) < 2 or ev.log_peaks_only or not peaks or needed is None:
        return None
    if not older.outside_calls or needed <= max(peaks):
        return None
    site, (n, size) = max(older.outside_calls.items(), key=lambda kv: kv[1][1])
    if (
        n < 2
        or size > older.bytes - ev.steps[-1].allocated_bytes + STORED_SLACK
        or size < needed - max(peaks)
    ):
        return None
    return site, n, size


def older_block_frees(ev: Evidence, tl: DeviceTimeline) -> list[int]:
    """Entry indices of the frees of blocks allocated before the trace began (no allocation of their
    address in the trace before them), in order; one entry per block (``free_requested`` where the trace
    records it, else ``free_completed``). Worked out once per device."""
    got = ev.older_frees_by_device.get(tl.device)
    if got is not None:
        return got
    action = (
        "free_requested" if any(e.get("action") == "free_requested" for e in tl.raw) else "free_completed"
    )
    made: set[Any] = set()
    got = ev.older_frees_by_device[tl.device] = []
    for i, e in enumerate(tl.raw):
        a = e.get("action")
        if a == "alloc":
            made.add(e.get("addr"))
        elif a == action:
            addr = e.get("addr")
            if addr in made:
                made.discard(addr)
            else:
                got.append(i)
    return got


def _older_frees(ev: Evidence, tl: DeviceTimeline) -> dict[tuple[Any, Any, Any], list[tuple[int, int]]]:
    """Blocks allocated before the trace began and freed in it, by the user line that freed them (the
    innermost user frame of the free's stack): (entry index, size) each. A tensor dies where its last
    reference goes: the line that drops it from a list or a ``deque(maxlen=N)`` that pushes it out."""
    key_of: dict[int, tuple[Any, Any, Any] | None] = {}
    out: dict[tuple[Any, Any, Any], list[tuple[int, int]]] = {}
    for i in older_block_frees(ev, tl):
        e = tl.raw[i]
        frames = e.get("frames")
        if not frames:
            continue
        fid = id(frames)
        if fid not in key_of:
            key_of[fid] = next(
                (frame_key(f) for f in frames if isinstance(f, dict) and ev.classifier.classify(f)[1]),
                None,
            )
        key = key_of[fid]
        size = e.get("size", 0)
        if key is not None and isinstance(size, int):
            out.setdefault(key, []).append((i, size))
    return out


REPLACED_SHARE = 0.6  # of the gaps between a site's blocks: one older block freed in each, at least
TURNOVER_SHARE = 0.9  # of the gaps since the first one freed: a full window turning over, step after step


def _replacing(
    tl: DeviceTimeline, firsts: list[int], older: dict[tuple[Any, Any, Any], list[tuple[int, int]]]
) -> tuple[tuple[Any, Any, Any], int, int] | None:
    """(line, blocks freed, gaps since the first) for the line that freed blocks older than the trace at
    the pace the site made its own — one in most gaps between two of its blocks, or in nearly every gap
    since the first was freed (a window that filled, then turned over), never more than two — and as many
    bytes as the site made meanwhile, give or take 3x: the site's blocks replace older ones."""
    gaps = list(itertools.pairwise(firsts))
    for key, frees in older.items():
        at = [i for i, _ in frees]
        per_gap = [bisect_left(at, c) - bisect_right(at, a) for a, c in gaps]
        if max(per_gap) > 2:
            continue
        throughout = sum(1 for n in per_gap if n) >= REPLACED_SHARE * len(gaps)
        start = 0 if throughout else next((j for j, n in enumerate(per_gap) if n), len(per_gap))
        tail = per_gap[start:]
        hits = sum(1 for n in tail if n)
        if not throughout and (len(tail) < 3 or hits < TURNOVER_SHARE * len(tail)):
            continue
        made = sum(s for i in firsts[start + 1 :] if isinstance(s := tl.raw[i].get("size", 0), int))
        freed = sum(sz for i, sz in frees if firsts[start] <= i <= firsts[-1])
        if made / 3 <= freed <= 3 * made:
            return key, hits, len(tail)
    return None


def _call_between(tl: DeviceTimeline, call_of: dict[int, CallId], order: list[int], a: int, c: int) -> bool:
    """Whether a whole call of the model came and went between two blocks made outside it, at entries a
    and c: an evaluation or inference loop run without gradients, whose forward passes free what they
    allocate as they go, swings by one layer's temporaries, far less than a training step, but each of its
    iterations is one call of the model (``order``: the entries ``call_of`` holds, sorted). The call began
    after ``a``, ended before ``c``, and gave back
    what it allocated: far more came and went in between than the block at ``a`` (4x), and live memory
    grew by no more than a quarter of that block (a training step that keeps its graph keeps more)."""
    if call_of.get(a) is not None or call_of.get(c) is not None or c - a < 3:
        return False
    j = bisect_right(order, a)
    if j >= len(order) or order[j] >= c:
        return False  # no allocation of the model between them
    # a call that began after ``a`` ended before ``c`` (made outside it); it gave back what it allocated
    size = tl.raw[a].get("size", 0)
    size = size if isinstance(size, int) and size > 0 else 1
    net = tl.level_at(c - 1) - tl.level_at(a)
    return net <= 0.25 * size and tl.volumes[c - 1] - tl.volumes[a] >= 4 * size


NO_GRAD_SHARE = 0.1  # of what a call allocated: what a forward without gradients still holds at its end


def _next_call_without_grad(tl: DeviceTimeline, call_of: dict[int, CallId], a: int, c: int) -> bool:
    """Whether two blocks made in different calls of the same model-running line (its outputs, say) have
    a whole forward pass without gradients between them: an inference or evaluation loop under
    ``torch.no_grad()`` frees each layer's tensors as it goes, so at the end of the later call little more
    is live than before it (a tenth of what it allocated), and what it allocated is far more than the
    earlier block (4x). A forward with gradients holds its saved activations until a backward: it does
    not qualify, and two calls of one training step are not two steps."""
    ca, cc = call_of.get(a), call_of.get(c)
    if ca is None or cc is None or ca[0] != cc[0] or ca[1] >= cc[1]:
        return False
    return _no_grad_pass(tl, a, c)


def _passed_again(ev: Evidence, tl: DeviceTimeline, call_of: dict[int, CallId], a: int, c: int) -> bool:
    """Whether two blocks made in what reads as one call (a and c) are two forward passes' without
    gradients: the run's first stack came back between them (a loop calling the model back to back),
    and what came between came and went as a forward without gradients does. One forward's layers do
    not qualify: a later layer does not repeat the run's first allocation (the embedding, the input's
    cast), and one with gradients keeps its saved activations."""
    restarts = _call_restarts(ev, tl, call_of).get(call_of[a])
    if not restarts:
        return False
    k = bisect_right(restarts, a)
    return k < len(restarts) and restarts[k] < c and _no_grad_pass(tl, a, c)


def _no_grad_pass(tl: DeviceTimeline, a: int, c: int) -> bool:
    """Whether what was allocated between entries a and c came and went as a forward without gradients
    does: far more than the block at a (4x), and at most a tenth of it still live before c."""
    size = tl.raw[a].get("size", 0)
    size = size if isinstance(size, int) and size > 0 else 1
    volume = tl.volumes[c - 1] - tl.volumes[a]
    net = tl.level_at(c - 1) - tl.level_at(a)
    return volume >= 4 * size and net <= NO_GRAD_SHARE * volume


def _call_restarts(ev: Evidence, tl: DeviceTimeline, call_of: dict[int, CallId]) -> dict[CallId, list[int]]:
    """Where, inside one run of allocations under a model-running line, the run's first stack came back
    (by entry index, in order): the next forward pass of a loop that calls the model back to back with
    nothing allocated in between (inputs already on the device, outputs kept as they are), which reads
    as one call. Worked out once per device."""
    got = ev.call_restarts_by_device.get(tl.device)
    if got is not None:
        return got
    got = ev.call_restarts_by_device[tl.device] = {}
    stack_of: dict[int, tuple[tuple[Any, Any, Any], ...]] = {}
    first: dict[CallId, tuple[tuple[Any, Any, Any], ...]] = {}
    raw = tl.raw
    for i in sorted(call_of):
        frames = raw[i].get("frames") or ()
        key = stack_of.get(id(frames))
        if key is None:
            key = stack_of[id(frames)] = tuple(frame_key(fr) for fr in frames if isinstance(fr, dict))
        c = call_of[i]
        if c not in first:
            first[c] = key
        elif key == first[c]:
            got.setdefault(c, []).append(i)
    return got


def _model_calls(ev: Evidence, tl: DeviceTimeline) -> dict[int, CallId]:
    """Which call of a model-running line each traced allocation was made in, by entry index. A call is
    a run of allocations made under that line, ended by any allocation that is not (the next batch
    copied in, the loss, the backward on the engine's thread, the optimizer). Worked out once per device."""
    got = ev.calls_by_device.get(tl.device)
    if got is None:
        got = ev.calls_by_device[tl.device] = _find_model_calls(ev, tl) if ev.has_frames else {}
    return got


def _find_model_calls(ev: Evidence, tl: DeviceTimeline) -> dict[int, CallId]:
    key_of: dict[int, tuple[Any, Any, Any] | None] = {}
    count: dict[tuple[Any, Any, Any], int] = {}
    out: dict[int, CallId] = {}
    prev = None
    raw = tl.raw
    for i in tl.alloc_indices:
        frames = raw[i].get("frames")
        key = None
        if frames:
            fid = id(frames)
            if fid not in key_of:
                key_of[fid] = model_call(ev.classifier, frames)
            key = key_of[fid]
        if key is not None:
            if key != prev:
                count[key] = count.get(key, 0) + 1
            out[i] = (key, count[key])
        prev = key
    return out


def _kept_calls(ev: Evidence) -> None:
    """The line that runs the model whose earlier calls' blocks are still alive, the most of them.

    A call is a run of allocations made under that line, ended by any allocation that is not (the next
    batch copied in, the loss, the backward on the engine's thread). Inside one forward pass the saved
    activations stay alive until the backward; when a call's blocks are still alive after later calls of
    the same line began, and they are a large part of all that call allocated (temporaries are freed,
    what is saved for the backward is not), its output still holds its autograd graph: a validation loop
    run with gradients on that keeps its outputs, or losses summed over calls for one backward.

    What the same line did earlier in the trace says whether that is new: a step that runs the model on
    several views before one backward holds as many calls at every step."""
    tl = ev.oom_timeline
    if tl is None or not ev.has_frames:
        return
    end = ev.oom_entry.index if ev.oom_entry is not None else len(tl.raw)
    call_of = _model_calls(ev, tl)
    count: dict[tuple[Any, Any, Any], int] = {}
    volume: dict[CallId, int] = {}
    live: dict[CallId, int] = {}
    blocks: dict[CallId, int] = {}
    first_index: dict[CallId, int] = {}
    held_at_start: dict[CallId, int] = {}
    owner: dict[Any, tuple[CallId, int]] = {}  # address -> (call, size)

    # per line, how many of its ended calls still hold their share; a call ends when the line's next one
    # begins, and stops holding for good at the free that takes it below (nothing it made comes back)
    holding: dict[tuple[Any, Any, Any], int] = {}
    held_calls: set[CallId] = set()

    def holds(c: CallId) -> bool:
        return live[c] >= KEPT_CALL_SHARE * volume[c]

    def held(key: tuple[Any, Any, Any], upto: int) -> int:
        """How many of the line's calls before ``upto`` still hold their share."""
        ended = (key, upto - 1)
        if upto > 1 and holds(ended):
            held_calls.add(ended)
            holding[key] = holding.get(key, 0) + 1
        return holding.get(key, 0)

    last: tuple[Any, Any, Any] | None = None  # the line the last allocation before the OOM was made under
    last_step = -1  # the last allocation an optimizer step made before the OOM
    in_step: dict[int, bool] = {}  # by frames-list identity
    in_python: dict[int, bool] = {}  # by frames-list identity
    backwards: list[int] = []  # where each run of allocations without a Python frame began
    prev_python = True
    for i, e in enumerate(itertools.islice(tl.raw, end)):
        action = e.get("action")
        if action == "alloc":
            call = call_of.get(i)
            last = call[0] if call is not None else None
            if call is None:
                frames = e.get("frames") or ()
                python = _has_python(ev.classifier, frames, in_python) if frames else False
                if python:
                    hit = in_step.get(id(frames))
                    if hit is None:
                        hit = in_step[id(frames)] = _optimizer_step(frames)
                    if hit:
                        last_step = i
                elif prev_python:
                    backwards.append(i)  # no Python frame: the autograd engine's thread, a backward begun
                prev_python = python
                continue
            prev_python = True
            if call not in volume:
                key, n = call
                count[key] = n
                held_at_start[call] = held(key, n)
                first_index[call] = i
                volume[call] = live[call] = blocks[call] = 0
            size = e.get("size", 0)
            size = size if isinstance(size, int) else 0
            volume[call] += size
            live[call] += size
            blocks[call] += 1
            owner[e.get("addr")] = (call, size)
        elif action in ("free_requested", "free_completed"):
            got = owner.pop(e.get("addr"), None)
            if got is not None:
                c = got[0]
                live[c] -= got[1]
                blocks[c] -= 1
                if c in held_calls and not holds(c):
                    held_calls.discard(c)
                    holding[c[0]] -= 1
    oom = ev.oom_entry
    starts = model_call(ev.classifier, oom.frames) if oom is not None and oom.frames else None
    best: KeptCalls | None = None
    for key, n in count.items():
        # the line's last call is the one the OOM came in when nothing else was allocated since and the
        # failing allocation was made under the same line (or its stack is not known)
        if last == key and (starts == key or not (oom is not None and oom.frames)):
            n -= 1
        done = [c for c in range(1, n + 1) if holds((key, c))]
        if not done:
            continue
        first = done[0]
        kept = KeptCalls(
            call=Site(str(key[0]), int(key[1] or 0), str(key[2])),
            calls=len(done),
            blocks=sum(blocks[(key, c)] for c in done),
            bytes=sum(live[(key, c)] for c in done),
            made=n,
            before=max(held_at_start[(key, c)] for c in range(2, first + 1)) if first > 1 else None,
            freed_before=sum(
                1 for c, at in first_index.items() if at < first_index[(key, first)] and not holds(c)
            ),
            peak_before=tl.max_level_between(0, first_index[(key, first)]),
            in_call=starts == key,
            past_step=sum(
                1
                for c in done
                if first_index[(key, c)] < last_step
                # a backward ran after the call and before a later call of the same line: its step was
                # over, and the call's graph outlived that backward (``retain_graph=True``, a hidden
                # state carried without ``.detach()``)
                or bisect_right(backwards, first_index[(key, c)])
                < bisect_left(backwards, first_index[(key, n)])
            ),
        )
        # the line whose calls keep the most blocks: whole forward passes (every layer's saved activations)
        # rather than a criterion module's one saved tensor a call, however large
        if best is None or (kept.blocks, kept.bytes) > (best.blocks, best.bytes):
            best = kept
    if best is not None:
        # the line's live blocks from before the trace began are more of the same (calls kept since before
        # the window), made well before the call under way
        key = (best.call.filename, best.call.line, best.call.name)
        best.older_bytes = live_under_calls_before_trace(ev).get(key, 0)
    ev.kept_calls = best
    freed: dict[tuple[Any, Any, Any], int] = {}
    for c in volume:
        if not holds(c):
            freed[c[0]] = freed.get(c[0], 0) + 1
    # a step may call several modules from its own lines (the model, the loss): count one line's calls
    ev.freed_calls = max(freed.values(), default=0) if volume else None


ALIGN_MIN_GROWTH = 0.01  # of the live memory: an earlier call that grew less than this aligns nothing
ALIGN_MAX_EXTRA = 2  # allocations the failing step may make that the earlier did not (or a tenth of its)


def aligned_step(ev: Evidence) -> AlignedStep | None:
    """The failing step aligned with the one before it (``AlignedStep``): from the call of the model that
    began each (the call the OOM came in, else the last one before it: the loss, the backward) up to the
    failing request, the same stacks allocation by allocation, and the step before ended (its memory fell
    back before the failing call began). None when an earlier step already peaked as high as this
    moment. Worked out once."""
    if ev.aligned is not False:
        return ev.aligned if isinstance(ev.aligned, AlignedStep) else None
    ev.aligned = None
    tl, oom, needed = ev.oom_timeline, ev.oom_entry, ev.needed_bytes
    if tl is None or oom is None or needed is None or not ev.has_frames:
        return None
    peaks = ev.step_peaks if len(ev.steps) >= 2 else ev.earlier_peaks
    if peaks and max(peaks) >= needed:
        # a step as large already ran to its end: scaling a smaller one (whose parts grow at different
        # rates: attention with the square of the length) says less than that
        return None
    call_of = _model_calls(ev, tl)
    end = oom.index
    allocs = tl.alloc_indices
    last_i = next((i for i in reversed(allocs) if i < end and i in call_of), None)
    if last_i is None:
        return None
    key, n = call_of[last_i]  # the call the step began with (the OOM came in it, or after it)
    if oom.frames and model_call(ev.classifier, oom.frames) == key:
        # the OOM came in a call of the same line: the next one, when anything else was allocated since
        n += bisect_right(allocs, last_i) < bisect_left(allocs, end)
    if n < 2:
        return None
    begins: dict[CallId, int] = {}
    for i, c in call_of.items():  # in trace order
        if c[0] == key and c[1] in (n - 1, n) and c not in begins:
            begins[c] = i
    e0, f0 = begins.get((key, n - 1)), begins.get((key, n), end)
    if e0 is None:
        return None
    lo, mid, hi = bisect_right(allocs, e0 - 1), bisect_right(allocs, f0 - 1), bisect_right(allocs, end - 1)
    earlier, mine = allocs[lo:mid], allocs[mid:hi]
    raw = tl.raw

    def stack(frames: Any) -> tuple[Any, ...]:
        return tuple((f.get("filename"), f.get("line")) for f in frames or [] if isinstance(f, dict))

    # allocation by allocation; a few the failing step made and the earlier did not (a cache's miss: a mask
    # for a length not seen before) are taken as they are, not scaled
    m = extra_bytes = 0
    inserted = 0
    for b in mine:
        if m < len(earlier) and stack(raw[earlier[m]].get("frames")) == stack(raw[b].get("frames")):
            m += 1
            continue
        size = raw[b].get("size", 0)
        extra_bytes += size if isinstance(size, int) else 0
        inserted += 1
    if inserted > max(ALIGN_MAX_EXTRA, len(mine) // 10) or len(earlier) <= m:
        return None
    if stack(raw[earlier[m]].get("frames")) != stack(oom.frames):
        return None
    e_start = tl.level_at(e0 - 1) if e0 > 0 else tl.start_allocated
    f_start = tl.level_at(f0 - 1) if f0 > 0 else tl.start_allocated
    # the earlier step, its counterpart of the failing request made
    e_grown = tl.level_at(earlier[m]) - e_start
    if e_grown <= ALIGN_MIN_GROWTH * max(1, e_start):
        return None
    e_peak = tl.max_level_between(e0, f0)
    # the earlier step ended before the failing call began: its growth came back down
    if tl.min_level_between(earlier[-1], f0) - e_start > 0.5 * (e_peak - e_start):
        return None
    ratio = (needed - extra_bytes - f_start) / e_grown
    if ratio <= 0:
        return None
    got = AlignedStep(
        call=Site(str(key[0]), int(key[1] or 0), str(key[2])),
        position=m,
        ratio=ratio,
        earlier_peak=e_peak,
        start=f_start,
        predicted=f_start + extra_bytes + round(ratio * (e_peak - e_start)),
        unmatched=inserted,
    )
    ev.aligned = got
    return got


def _has_python(classifier: FrameClassifier, frames: Sequence[Any], seen: dict[int, bool]) -> bool:
    """Whether a stack has a Python frame (cached by the frames list's identity)."""
    got = seen.get(id(frames))
    if got is None:
        got = seen[id(frames)] = any(isinstance(f, dict) and classifier.classify(f)[0] for f in frames)
    return got


def _optimizer_step(frames: Sequence[Any]) -> bool:
    """Whether an allocation was made by an optimizer's step (its state, or the temporaries of a foreach
    update): torch/optim's frames on its stack."""
    return any(
        isinstance(f, dict) and "/optim/" in str(f.get("filename", "")).replace("\\", "/") for f in frames
    )


def _freed_after(tl: DeviceTimeline, allocs: list[int], first: int) -> bool:
    """Whether a block the site allocated before entry ``first`` (its first survivor) was freed after it."""
    mine = {i for i in allocs if i < first}
    held: dict[Any, bool] = {}  # address -> its current block was one of ``mine``
    for i, e in enumerate(tl.raw):
        action = e.get("action")
        if action == "alloc":
            held[e.get("addr")] = i in mine
        elif action == "free_requested" and held.pop(e.get("addr"), False) and i > first:
            return True
    return False


def allocs_by_site(ev: Evidence) -> dict[tuple[int, Site], list[int]]:
    """Entry indices of every traced allocation, grouped by (device, site). Worked out once."""
    if ev.site_allocs is not None:
        return ev.site_allocs
    out: dict[tuple[int, Site], list[int]] = {}
    for tl in ev.timelines:
        site_of = {key: ev.classifier.site(fr) for key, fr in tl.stacks.items()}
        raw = tl.raw
        for i in tl.alloc_indices:
            fr = raw[i].get("frames")
            if fr:
                out.setdefault((tl.device, site_of[id(fr)]), []).append(i)
    ev.site_allocs = out
    return out


RELEASED_CALLS = 2  # whole calls of the model a block outlived before it was freed: it was kept, then let go


def turned_over(ev: Evidence, leak: Survivors) -> tuple[int, int, int] | None:
    """(live blocks, allocations made since, most held at once) when the site's count of live blocks
    reached about what it holds now early and the site then went on allocating at least as many blocks again,
    freeing as many, never holding more than a quarter more (or one extra): a cache that evicts (least
    recently used, one entry per key) or a server's store of per-request caches, coming and going around
    one level, turning over, not a leak. A leak's count keeps rising to the end."""
    tl = ev.oom_timeline
    st = leak.stats
    if tl is None or tl.device not in st.devices or st.traced < st.count or leak.freed_at_site < st.count:
        return None  # every live block must be in the trace, and the site must have turned over once
    site = leak.site
    mine: dict[int, bool] = {}
    live: set[int] = set()
    counts: list[int] = []  # live blocks of the site after each of its allocations
    for e in tl.raw:
        action = e.get("action")
        if action == "alloc":
            frames = e.get("frames")
            if not frames:
                continue
            hit = mine.get(id(frames))
            if hit is None:
                hit = mine[id(frames)] = ev.classifier.site(frames) == site
            if hit:
                live.add(e.get("addr", 0))
                counts.append(len(live))
        elif action == "free_requested" and e.get("addr") in live:
            live.discard(e.get("addr", 0))
    final = st.count
    slack = max(1, final // 4)
    if len(counts) < 2 * final:
        return None
    # (within a quarter of what it holds now: the last few of a set of re-made tensors come in their turn)
    reached = next((i for i, c in enumerate(counts) if c >= final - slack), None)
    if reached is None:
        return None
    since = len(counts) - 1 - reached
    # early: it has held that many for most of what it made since it first did (a count that climbed
    # through the trace and levels only among the step under way's own temporaries is still climbing)
    if since < max(final, reached):
        return None
    if max(counts) > final + slack:
        # the site's own temporaries (a forward pass under one user line) lift the count between its
        # re-makes: its floor in each quarter of what it made since must stay level (a pile's floor rises)
        tail = counts[reached:]
        q = max(1, len(tail) // 4)
        floors = [min(tail[k : k + q]) for k in range(0, len(tail), q)]
        if max(floors) > final + slack or floors[-1] - floors[0] > slack:
            return None
    return final, since, max(counts)


def released_after_calls(ev: Evidence, sv: Survivors) -> int:
    """How many of the site's traced allocations were kept across at least ``RELEASED_CALLS`` later calls
    of the model and then freed: a site that lets go of what it keeps (a memory bank or cache that ages its
    entries out, however irregularly), unlike a pile that only grows. A leak's freed allocations are its
    temporaries, freed within their own step; a leak that began late freed its earlier ones the same way."""
    dev = min(sv.stats.devices) if sv.stats.devices else 0
    tl = next((t for t in ev.timelines if t.device == dev), None)
    idx = allocs_by_site(ev).get((dev, sv.site), [])
    if tl is None or not idx:
        return 0
    call_of = _model_calls(ev, tl)
    seen: set[CallId] = set()
    starts: list[int] = []
    for i in sorted(call_of):
        if call_of[i] not in seen:
            seen.add(call_of[i])
            starts.append(i)
    if len(starts) <= RELEASED_CALLS:
        return 0
    mine = set(idx)
    owner: dict[Any, int] = {}
    released = 0
    raw = tl.raw
    for i in range(idx[0], len(raw)):
        e = raw[i]
        action = e.get("action")
        if action == "alloc":
            if i in mine:
                owner[e.get("addr")] = i
            else:
                owner.pop(e.get("addr"), None)
        elif action == "free_requested":
            a = owner.pop(e.get("addr"), None)
            if a is not None and bisect_left(starts, i) - bisect_right(starts, a) >= RELEASED_CALLS:
                released += 1
    return released


def _step_swing(tl: DeviceTimeline) -> int:
    """How far live memory falls in one step of this trace: its largest fall from a high (the backward
    pass freeing the step's saved activations). Unlike the trace's range, a leak's growth across steps
    does not change it; a trace without a backward has only its temporaries' falls."""
    high = fall = 0
    for v in tl.levels:
        if v > high:
            high = v
        elif high - v > fall:
            fall = high - v
    return fall


def _is_cycle(tl: DeviceTimeline, a: int, c: int, swing: int = 0, *, low_point: bool = True) -> bool:
    """Whether a training step ended between two survivors allocated at entries a and c.

    Far more was allocated in between than was kept (at least 4x the net growth), and either live
    memory fell below its level from before ``a`` (what was allocated around ``a`` was freed again) and
    rose back to it by ``c``, or
    it rose and came back down to within a quarter of the rise (``a`` was made at the step's low point,
    the top of the loop): a whole forward/backward came and went. Inside one forward pass the saved
    activations make the net growth a large part of what is allocated and memory does not come back
    down, so layer after layer of the same line does not count as steps; and between two steps' survivors
    live memory swings by at least half of what one step swings (``swing``), where between two layers of
    one forward it swings only by that layer's temporaries (``swing``: the trace's largest fall).
    A block made inside a forward pass (``low_point`` false) is not made at the top of the loop.
    """
    if c - a < 3:
        return False
    if tl.max_level_between(a + 1, c) - tl.min_level_between(a + 1, c) < STEP_SWING_SHARE * swing:
        return False  # a layer's temporaries rose and fell, not a step's forward and backward
    e = tl.raw[a]
    size = e.get("size", 0)
    s = size if isinstance(size, int) else 0
    level_a = tl.level_at(a)
    net = tl.level_at(c - 1) - level_a
    volume = tl.volumes[c - 1] - tl.volumes[a]
    if volume < 4 * max(net, 1):
        return False
    if tl.min_level_between(a + 1, c) < level_a - s:
        # ... and came back up before ``c``: the next step's forward. Inside one backward pass memory falls
        # layer by layer (saved activations freed as gradients are made) and does not come back
        return net >= -s
    if not low_point:
        return False  # made inside a forward pass, not at the top of the loop
    # made at the step's low point (the top of the loop): nothing live at ``a`` is freed later, so memory
    # cannot fall below it; the step shows as a rise that came all the way back down before ``c``
    rise = tl.max_level_between(a + 1, c) - level_a
    return rise > 0 and net <= 0.25 * rise


def _contract(ev: Evidence) -> None:
    facts = {**_part(ev.bundle, "host"), **_part(ev.bundle, "k8s")}
    if not facts:
        return
    try:
        from triage.contract.evidence import pod_violations
        from triage.contract.load import load_contract
    except ImportError:
        return
    try:
        ns = _get(ev.bundle, "workload", "namespace")
        contract = load_contract(namespace=ns if isinstance(ns, str) else None)
        ev.contract_violations = list(pod_violations(facts, contract))
    except Exception as exc:  # a broken contract file must not break the diagnosis
        ev.notes.append(f"contract check skipped: {exc}")
