"""Parser for every OOM-related message a training log or an exception text can hold.

One pass over the text finds each CUDA out-of-memory, shared-memory (``/dev/shm``) and host-memory
message, in order, and returns an :class:`OomMessage` per occurrence with the exact byte values it
prints (see SNAPSHOT_FORMAT.md §4–5 for the formats):

``cuda_oom``
    ``pre-2.1`` ``Tried to allocate A (GPU d; T total capacity; X already allocated; F free;
    [C allowed; ]R reserved in total by PyTorch)``; ``pre-2.1-cached`` the very old ``…; F free;
    C cached)``; ``2.1`` ``GPU d has a total capacty of …`` (torch's typo); ``2.2+`` ``… total
    capacity of …`` with NVML process lines, ``C allowed;`` and private pools; ``fraction-rejected``
    (``Allocation was preemptively rejected …``); ``async`` (the ``cudaMallocAsync`` backend's ``Allocation on
    device d would exceed allowed memory. (out of memory)`` followed by its ``Currently allocated``,
    ``Requested``, ``Device limit``, ``Free (according to CUDA)`` and ``PyTorch limit`` lines); ``unknown`` (``CUDA out of memory`` with too little
    text to tell the era, e.g. a truncated log); ``cuda-error`` (``CUDA error: out of memory``, the
    driver/runtime/NCCL/cuBLAS/cuDNN spellings, and cuBLAS/cuDNN "not initialized", which a full GPU gives
    on their first use, and accelerate's ``No executable batch size found, reached zero.``: no numbers); ``nvml-assert`` (``NVML_SUCCESS == r INTERNAL
    ASSERT FAILED at …CUDACachingAllocator.cpp``, seen on MIG) and ``allocator-assert`` (any other
    internal assert of that file, e.g. ``!handles_.at(i)`` under memory pressure); ``vgpu``
    (HAMi-core's ``[HAMI-core ERROR (pid:P thread=T allocator.c:L)]: Device d OOM U / L``) and
    ``vgpu-alloc-failed`` (``cuMemoryAllocate failed res=2``).
``shm_exhausted``
    ``shm-unable-to-write`` (``unable to write to file </torch_…>: No space left on device (28)``),
    ``shm-unable-to-allocate`` (``unable to allocate shared memory(shm) for file <…>``),
    ``shm-unable-to-mmap``, ``shm-no-space`` (a lone ``No space left on device (28)``, or ``[Errno 28]``
    on a ``/dev/shm`` or ``torch_`` path), ``shm-bus-error`` (``DataLoader worker (pid N) is killed by
    signal: Bus error``), ``shm-worker-bus-error`` (``Unexpected bus error encountered in worker …
    (shm)``), ``shm-nccl`` (NCCL's ``failed to extend /dev/shm/nccl-… to N bytes``, or its ``Error while creating
    shared memory segment /dev/shm/nccl-… (size N)`` after ``posix_fallocate`` found no space),
    ``shm-emptydir-evicted`` (the kubelet's ``Usage of EmptyDir volume "dshm" exceeds the limit "32Gi"`` for a
    volume named like a /dev/shm mount).
``host_oom``
    ``host-killed`` (``Killed`` alone on a line, accepted only when nothing but other host-OOM lines
    follows it; or a shell job line ``line 3:  4242 Killed  python train.py``), ``host-oomkilled``
    (``OOMKilled``), ``host-exit-137`` (``exit code 137`` and its spellings), ``host-sigkill``
    (``exitcode: -9``, ``Signal 9 (SIGKILL) received by PID N``), ``host-kernel-oom`` (``Memory cgroup out
    of memory: Killed process N (python)`` and its ``oom-kill:`` line), ``host-slurm-oom``,
    ``host-worker-killed`` (a DataLoader worker killed by ``Killed``), ``host-cpu-alloc``
    (``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes``), ``host-pinned`` (``CUDA
    error: out of memory`` raised while pinning host memory: the DataLoader's pin memory thread, a
    ``pin_memory()`` call — page-locked host RAM the driver could not get), ``host-ray-oom`` (Ray's
    memory monitor: ``Task was killed due to the node running low on memory``), ``host-evicted`` (the kubelet's
    eviction of a pod that used more than it requested on a node short of memory: ``The node was low on
    resource: memory. … Container C was using NKi, request is R``). Every message that
    means a SIGKILL (killed, sigkill, kernel, worker-killed) carries ``exit_code`` 137, the shell's 128 + 9;
    ``OOMKilled`` gets one only from an exit-code line beside it.

Logs are taken as they come: ANSI colours, timestamps (ISO, CRI ``… stdout F``, syslog, dmesg,
``[2024-05-01 12:00:00,123]``, glog), rank prefixes (``[rank3]:``, torchrun's ``[default3]:`` which is
the *local* rank, ``3: `` and ``[3]:`` labels, mpirun's ``[1,3]<stdout>:``, ``rank 3:``) and Ray's
``(pid=…)`` are stripped per line; an unprefixed line inside torchrun's error summary takes the rank of
its ``rank : N (local_rank: M)`` entry. A torch message wrapped over several lines (each one prefixed
again) is joined back: the following lines of the same stream are appended until the message is
complete; a line break that a word-wrapper made (dropping the space) and one that cut a word or a number
in two are told apart from the characters on both sides (see ``_join``).

Duplicates: the same message is printed again by a traceback chain (``During handling of the above
exception…``), by a ``logger.error(e)``, or by torchrun's error summary. Two occurrences are one when they
carry the same data (every parsed number, process line and key detail, so a rewrapped copy still
matches), their ranks agree (an occurrence without any rank agrees with any rank and takes the other's),
and the later one starts at most ``DEDUPE_WINDOW_LINES`` after the earlier; an elastic-agent restart line
(``… restart worker group``) ends the window, so an OOM that recurs after a restart counts again. Host
evidence of one event is folded into one message: an ``exit code 137`` or SIGKILL line within
``HOST_MERGE_LINES`` of an ``OOMKilled``/kernel/``Killed``/slurm line fills that message's ``exit_code``.
A ``vgpu`` line stays its own entry and also fills ``vgpu_*`` of the next torch CUDA OOM of the same
rank within ``VGPU_ATTACH_LINES``.

Two more readings of a whole log: ``went_on_after`` counts the training-progress lines (``step 120 |
loss …``) a rank printed after an error, and the fatal error it died of later, so a caught OOM is not taken
for the failure; ``memory_samples`` reads the live GPU memory a loop printed at its steps (DeepSpeed's
``see_memory_usage``, ``torch.cuda.memory_allocated()`` under any name that says allocated, never a max or a
peak; in a progress bar's postfix each redraw is a sample, and a key may name its unit,
``cuda_mem_allocated_gb=4.42``), which stand in for the collector's step samples when a log is all there
is; ``setup_frame`` and ``first_step_bar`` tell an OOM that came before the first step ended (under the
model's setup or an inference server's start-up sizing, or with the progress bar still at ``0/N``).

Every pattern is anchored or bounded, and the text of a message is capped at ``MAX_TEXT`` characters,
so the parse is linear in the input and never raises on arbitrary text.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from triage.units import GiB, MiB, parse_size

__all__ = [
    "DEDUPE_WINDOW_LINES",
    "HOST_MERGE_LINES",
    "MAX_TEXT",
    "VGPU_ATTACH_LINES",
    "OomMessage",
    "ProcessUsage",
    "first_step_bar",
    "host_memory_samples",
    "lines_holding",
    "memory_samples",
    "non_pytorch_bytes",
    "parse_message",
    "parse_messages",
    "setup_frame",
    "size_change_before",
    "split_processes",
    "went_on_after",
]

CUDA_OOM = "cuda_oom"
SHM_EXHAUSTED = "shm_exhausted"
HOST_OOM = "host_oom"

DEDUPE_WINDOW_LINES = 1000
HOST_MERGE_LINES = 10
VGPU_ATTACH_LINES = 200
MAX_TEXT = 16384
_MAX_CONT_LINES = 12  # continuation lines joined onto one message
_MAX_CONT_SKIP = 40  # lines of other ranks skipped while looking for the next piece


@dataclass(slots=True)
class ProcessUsage:
    """One NVML process line of a 2.1+ message."""

    pid: int | None  # None for "this process" lines
    used_bytes: int
    this_process: bool  # "Including non-PyTorch memory, this process has X memory in use."


@dataclass(slots=True)
class OomMessage:
    """One OOM / shm / host-OOM message found in a text. Sizes are exact bytes of what was printed."""

    kind: str  # "cuda_oom" | "shm_exhausted" | "host_oom"
    format: str  # see the module docstring
    text: str  # the message, without log prefixes (torch messages: joined back when wrapped)
    line_no: int | None = None  # 1-based line where it starts
    rank: int | None = None  # global rank if known, else the local rank ([defaultN]:); extra["local_rank"]
    exception_type: str | None = None  # "torch.OutOfMemoryError", "RuntimeError", …
    device_index: int | None = None  # "GPU N" (HAMi: "Device N")
    requested_bytes: int | None = None  # "Tried to allocate X": the allocator's segment request
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None  # 2.2+: includes the private pools, as torch prints it
    reserved_bytes: int | None = None  # old: "reserved in total"; 2.1+: allocated + unallocated
    reserved_unallocated_bytes: int | None = None  # old: reserved - allocated; very old: "cached"
    private_pool_bytes: int | None = None
    allowed_bytes: int | None = None  # per-process fraction cap
    cached_bytes: int | None = None  # very old "…; C cached)" (= reserved - allocated)
    processes: list[ProcessUsage] = field(default_factory=list)
    fraction_rejected: bool = False
    vgpu_used_bytes: int | None = None  # HAMi prints usage + this request ("new_allocated")
    vgpu_limit_bytes: int | None = None
    exit_code: int | None = None  # 137 for exit code 137 and for SIGKILL
    worker_pid: int | None = None  # DataLoader worker
    extra: dict[str, str] = field(default_factory=dict)


def parse_messages(text: str) -> list[OomMessage]:
    """Every OOM/shm/host-OOM message in ``text`` (a whole log or one exception), in order."""
    if not isinstance(text, str) or not text:
        return []
    return _Parser(text).run()


def parse_message(text: str) -> OomMessage | None:
    """The first message in ``text``, or None."""
    found = parse_messages(text)
    return found[0] if found else None


def split_processes(msg: OomMessage, own_pids: set[int]) -> tuple[list[ProcessUsage], list[ProcessUsage]]:
    """(own, others) among the message's NVML process lines.

    A "this process" line is always own. Inside a container with its own PID namespace torch prints the
    failing process itself as "Process PID has …", so without ``own_pids`` the caller cannot tell it from
    a neighbour: compare with :func:`non_pytorch_bytes`.
    """
    own: list[ProcessUsage] = []
    others: list[ProcessUsage] = []
    for p in msg.processes:
        if p.this_process or (p.pid is not None and p.pid in own_pids):
            own.append(p)
        else:
            others.append(p)
    return own, others


def non_pytorch_bytes(msg: OomMessage) -> int | None:
    """Device memory not reserved by this PyTorch process: total − free − reserved (≥ 0).

    That is other processes, this process's CUDA context and non-PyTorch allocations together. Each of
    the three numbers is printed with two decimals, so the result is exact only to about ±1.5 % of a
    unit of the largest (±15 MiB for GiB values). None when a number is missing.
    """
    if msg.total_bytes is None or msg.free_bytes is None or msg.reserved_bytes is None:
        return None
    return max(0, msg.total_bytes - msg.free_bytes - msg.reserved_bytes)


# --------------------------------------------------------------------------------------------- lines

_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]|\x1b\][^\x07\x1b]{0,256}(?:\x07|\x1b\\)?")

# Prefixes stripped from the start of a line, again and again until none matches: timestamps and stream
# tags ("ts") and rank prefixes (which set the line's rank). One alternation, every branch bounded.
_PREFIX = re.compile(
    "|".join(
        (
            # CRI (kubelet's log files): 2024-05-01T12:00:00.123456789Z stderr F
            r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2}) (?:stdout|stderr) [FP] "
            # ISO, [2024-05-01 12:00:00,123], 2024/05/01 12:00:00
            r"|\[?\d{4}[-/]\d{2}[-/]\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?: ?(?:Z|UTC|[+-]\d{2}:?\d{2}))?\]?"
            r"(?: {1,4}|:\s|\s?\|\s?|$)"
            # syslog: May  1 12:00:00 host prog[12]:
            r"|[A-Z][a-z]{2} {1,2}\d{1,2} \d{2}:\d{2}:\d{2}(?: [\w.-]{1,255} [\w./-]{1,64}(?:\[\d{1,10}\])?:)? ?"
            # dmesg: [12345.678901]
            r"|\[ {0,12}\d{1,10}\.\d{1,9}\] ?"
            # glog: E0501 12:00:00.123456 140 file.cpp:12]
            r"|\[?[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{1,9} {1,8}\d{1,10} [^\]\s]{1,200}\] ?"
            # Ray: (pid=123) or (RayTrainWorker pid=123, ip=10.0.0.1)
            r"|\((?:[\w.-]{1,64} )?pid=\d{1,10}(?:, ?ip=[\w.:-]{1,64})?\) ?)",
            r"(?P<rank>\[[Rr]ank ?(?P<rank_n>\d{1,7})\]:? ?|[Rr]ank ?(?P<rank_w>\d{1,7}): )",
            r"(?P<mpi>\[\d{1,7},(?P<mpi_n>\d{1,7})\]<(?:stdout|stderr)>: ?)",
            r"(?P<label>\[(?P<label_b>\d{1,7})\]: ?(?=\S)| {0,6}(?P<label_n>\d{1,7}): (?=\S))",
            r"(?P<role>\[[A-Za-z_][\w-]{0,63}?(?P<role_n>\d{1,7})\]: ?)",
        )
    )
)

# A continuation line may carry the same decoration as the message's first line: "# " in a comment,
# "> " in a quote, pytest's "E   ".
_DECO = re.compile(r"(?:#{1,4}|>{1,4}|E|\||//) {1,8}")


@dataclass(slots=True)
class _Line:
    content: str  # without ANSI colours, prefixes and trailing whitespace
    g: int | None  # global rank from a prefix
    lr: int | None  # local rank from a prefix
    sig: tuple[str, ...]  # kinds of prefixes stripped, in order


def _strip_line(raw: str) -> _Line:
    s = raw
    if "\r" in s:
        parts = [p for p in s.split("\r") if p.strip()]
        s = parts[-1] if parts else ""
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    g: int | None = None
    lr: int | None = None
    sig: list[str] = []
    for _ in range(8):
        m = _PREFIX.match(s)
        if m is None or m.end() == 0:
            break
        kind = m.lastgroup or "ts"
        if kind == "role":
            if lr is None:
                lr = int(m.group("role_n"))
        elif kind != "ts" and (g is None or kind == "rank"):
            n = m.group("rank_n") or m.group("rank_w") or m.group("mpi_n")
            g = int(n or m.group("label_b") or m.group("label_n"))
        sig.append(kind)
        s = s[m.end() :]
    return _Line(s.rstrip(), g, lr, tuple(sig))


# --------------------------------------------------------------------------------------------- sizes

_NUM = r"(\d{1,20}(?:\.\d{1,6})?)"
_SIZE = _NUM + r" ?(bytes|KiB|MiB|GiB|TiB)\b"
_RE_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_RE_OLD_GPU = re.compile(r"\(GPU (\d{1,4});")
_RE_OLD_TOTAL = re.compile(_SIZE + r" total capacity")
_RE_OLD_ALLOC = re.compile(_SIZE + r" already allocated")
_RE_OLD_FREE = re.compile(_SIZE + r" free[;)]")
_RE_ALLOWED = re.compile(_SIZE + r" allowed;")
_RE_OLD_RESERVED = re.compile(_SIZE + r" reserved in total by PyTorch")
_RE_OLD_CACHED = re.compile(_SIZE + r" cached(?:\)|; " + _NUM + r" ?(?:bytes|KiB|MiB|GiB) inactive\))")
_RE_NEW_TOTAL = re.compile(r"GPU (\d{1,4}) has a total (capacity|capacty) of " + _SIZE)
_RE_NEW_FREE = re.compile(r"of which " + _SIZE + r" is free")
_RE_PROC = re.compile(r"(?:Process (\d{1,10})|this process) has " + _SIZE + r" memory in use")
_RE_NEW_ALLOC = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_RE_PRIVATE = re.compile(r"with " + _SIZE + r" allocated in private pools")
_RE_UNALLOC = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")


def _size(m: re.Match[str], i: int) -> int:
    return parse_size(m.group(i), m.group(i + 1))


# ------------------------------------------------------------------------------------------ detection

# what an inference server says at start-up when its device or budget is too small (see _RE_VLLM_FREE)
_SERVING_WORDS = (
    "less than desired gpu memory",
    "memory for the cache blocks",
    "stored in kv cache",
    "to serve at least one request",
    "prefill tokens",
    "reserved for kv cache is",
    "available kv cache memory",
    "blocks: 0",
)
# a literal (lower case) of every alternative of _TRIGGER: a line with none of them cannot match it
_TRIGGER_WORDS = (
    "out of memory",
    "low on resource: memory",
    "internal assert failed",
    "hami-core",
    "4pdvgpu",
    "unable to",
    "no space left",
    "killed",
    "bus error",
    "oomkill",
    "137",
    "sigkill",
    "exitcode",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "_status_not_initialized",
    "no executable batch size found",
    "failed to extend",
    "shared memory segment",
    "emptydir volume",
    "running low on memory",
    "oom-kill",
    "oom_kill",
    "defaultcpuallocator",
    "preemptively",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    *_SERVING_WORDS,
    "all available ram",
)
_TRIGGER = re.compile(
    r"out of memory|internal assert failed|hami-core|4pdvgpu|unable to (?:write|allocate|mmap)|no space left"
    r"|killed|bus error|oomkill|(?<!\d)137(?!\d)|sigkill|exitcode|cu(?:blas|dnn)_status_(?:alloc_failed|not_initialized)|failed to extend"
    r"|shared memory segment|emptydir volume|running low on memory"
    r"|oom[-_]kill|defaultcpuallocator|preemptively|cuda_error_out_of_memory|cudaerrormemoryallocation"
    r"|all available ram|low on resource: memory|no executable batch size found|"
    + "|".join(map(re.escape, _SERVING_WORDS)),
    re.IGNORECASE,
)
# Colab's notice when the kernel ran out of the VM's memory and was restarted
_RE_NOTEBOOK_RAM = re.compile(r"(?:Your )?session crashed after using all available RAM")
# An inference server sizing itself at start-up (vLLM, TGI) says in its own words that the device or its
# budget is too small: vLLM's check of the device's free memory before it loads anything (what is missing
# is held by other processes), its KV cache left too small by the weights for its max_model_len, TGI's
# warm-up that cannot fit its largest prefill.
_RE_VLLM_FREE = re.compile(
    r"Free memory on device(?: [\w:]{1,20})? \((\d{1,6}(?:\.\d{1,4})?)(?:-\d{1,6}(?:\.\d{1,4})?)?/(\d{1,6}(?:\.\d{1,4})?) GiB\)"
    r" on startup is less than desired GPU memory utilization \((\d{0,2}\.\d{1,6}|1), (\d{1,6}(?:\.\d{1,4})?) GiB\)"
)
_RE_VLLM_KV = re.compile(
    r"No available memory for the cache blocks"
    r"|The model's max seq len \((\d[\d,]{0,12})\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((\d[\d,]{0,12})\)"
    r"|To serve at least one request with the models?'s max seq len \((\d[\d,]{0,12})\),?\s{0,3}(?:\(?"
    r"(\d{1,6}(?:\.\d{1,4})?) GiB KV cache is needed, which is larger than the available KV cache memory "
    r"\((-?\d{1,6}(?:\.\d{1,4})?) GiB\))?"
)
# vLLM's own memory profile at start-up, when the error that follows it was cut from the log: nothing left
# for the KV cache once the weights and the activation peak are counted (v0's "the rest of the memory
# reserved for KV Cache is -1.05GiB", v1's "Available KV cache memory: -0.52 GiB", "# GPU blocks: 0")
_RE_VLLM_KV_PROFILE = re.compile(
    r"the rest of the memory reserved for KV Cache is (-\d{1,6}(?:\.\d{1,4})?|0(?:\.0{1,4})?) ?GiB"
    r"|Available KV cache memory: (-\d{1,6}(?:\.\d{1,4})?|0(?:\.0{1,4})?) ?GiB"
    r"|# (?:GPU|cuda) blocks: 0\b"
)
_RE_TGI_PREFILL = re.compile(r"Not enough memory to handle (\d{1,9}) prefill tokens")
_RE_TORCH = re.compile(r"(?<![\w])(CUDA|HIP) out of memory")
# the allocator's message whose "CUDA" a hard wrap cut ("…exception: CUD" / "A out of memory. Tried to …")
_RE_TORCH_CUT = re.compile(r"(?<![\w])(?:UDA|DA|A) out of memory\. Tried to allocate")
# the cudaMallocAsync backend: its first line, then one "key : size" line per figure
_RE_ASYNC = re.compile(r"Allocation on device (\d{1,4}) would exceed allowed memory\.? ?\(out of memory\)")
_RE_ASYNC_FIGURE = re.compile(
    r"^\s{0,30}(Currently allocated|Requested|Device limit|Free \(according to CUDA\)|PyTorch limit"
    r"(?: \(set by user-supplied memory fraction\))?)?\s{0,30}:\s{0,30}" + _SIZE + r"\s*$"
)
_RE_ASYNC_LIMIT_HEAD = re.compile(r"^\s{0,30}PyTorch limit(?: \(set by user-supplied memory fraction\))?\s*$")
# a limit this large is none: with no fraction set the backend prints 2^64 - 1 bytes ("17179869184.00 GiB")
ASYNC_UNLIMITED = 1 << 60
_RE_CUDA_ERR = re.compile(
    r"(?:CUDA|HIP) (?:driver )?error: (?:out of memory|CUBLAS_STATUS_ALLOC_FAILED)"
    r"|cuda runtime error \(2\) ?: out of memory"
    r"|Cuda failure (?:\d{1,4} )?'out of memory'"
    r"|CUDA failed with error out of memory"  # CTranslate2's (faster-whisper's) wording
    r"|CU(?:BLAS|DNN)_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
    # cuBLAS and cuDNN allocate their handle and workspace on first use: on a full GPU that fails as
    # "not initialized" (a library/driver mismatch says the same; extra "library_init" tells them apart)
    r"|CU(?:BLAS|DNN)_STATUS_NOT_INITIALIZED"
)
_RE_BATCH_SEARCH = re.compile(r"No executable batch size found, reached zero\.?")
_RE_ASSERT = re.compile(
    r"INTERNAL ASSERT FAILED at \"?([^\"\s]{0,512}CUDACachingAllocator\.cpp)\"?:(\d{1,7})"
)
_RE_HAMI = re.compile(r"\[HAMI-core ERROR([^\]\n]{0,300})\]: ?Device (\d{1,4}) OOM (\d{1,24}) ?/ ?(\d{1,24})")
# HAMi's earlier name (4paradigm's vGPU library): "[4pdvGPU ERROR (pid:99 …)]: device OOM encountered:
# usage=9502195712 limit=8388608000"
_RE_4PD = re.compile(
    r"\[4pdvGPU ERROR([^\]\n]{0,300})\]: ?device OOM encountered: usage=(\d{1,24}) limit=(\d{1,24})"
)
_RE_HAMI_ALLOC = re.compile(r"\[HAMI-core ERROR([^\]\n]{0,300})\]: ?cuMemoryAllocate failed res=2\b")
_RE_HAMI_PID = re.compile(r"pid:(\d{1,10})")
_RE_HAMI_LOC = re.compile(r"([\w.-]{1,64}\.c(?:pp)?:\d{1,7})\)?$")
_ERRNO_TAIL = r"(?:: ?([^()<>]{0,200}?) ?\((\d{1,5})\))?"
_RE_SHM_WRITE = re.compile(r"unable to write to file <([^<>]{0,4096})>" + _ERRNO_TAIL)
_RE_SHM_ALLOC = re.compile(
    r"unable to allocate shared memory\(shm\) for file <([^<>]{0,4096})>" + _ERRNO_TAIL
)
_RE_SHM_MMAP = re.compile(r"unable to mmap (\d{1,24}) bytes from file <([^<>]{0,4096})>" + _ERRNO_TAIL)
_RE_NOSPACE = re.compile(r"No space left on device \(28\)")
_RE_ERRNO28 = re.compile(r"\[Errno 28\] No space left on device(?:: ?'([^']{0,4096})')?")
_RE_NCCL_SHM = re.compile(r"failed to extend (/dev/shm/[^\s]{1,4096}) to (\d{1,24}) bytes")
_RE_NCCL_SEGMENT = re.compile(
    # NCCL before 2.19 names the segment without its folder ("nccl-shm-recv-…")
    r"Error while creating shared memory segment (/dev/shm/[^\s()]{1,4096}|nccl-[^\s()/]{1,4096})"
    r"(?: \(size (\d{1,24})\))?"
)
# the kubelet evicting a pod whose memory-backed /dev/shm volume went over its sizeLimit
_RE_EMPTYDIR = re.compile(r'Usage of EmptyDir volume "([^"]{1,253})" exceeds the limit "([^"]{1,64})"')
_RE_DL_SIGNAL = re.compile(
    # the signal's name ends the sentence, or the line when a paste wrapped it ("…signal: Bus" / "error. …")
    r"DataLoader worker \(pid (\d{1,10})\) is killed by signal: ([A-Za-z][A-Za-z ]{0,40}?)(?:\.|\s*$)"
)
_RE_WORKER_BUS = re.compile(r"Unexpected bus error encountered in worker", re.IGNORECASE)
_RE_KERNEL = re.compile(
    r"(Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: "
    r"Kill(?:ed)? process (\d{1,10}) \(([^()]{0,64})\)"
)
_RE_OOM_KILL_LINE = re.compile(r"oom-kill:constraint=(\w{1,64}),")
_RE_OOM_KILL_TASK = re.compile(r",task=([^,\s]{1,64}),pid=(\d{1,10})")
_RE_ANON_RSS = re.compile(r"anon-rss:(\d{1,20})kB")
_RE_OOMKILLED = re.compile(r"(?<![\w])OOMKill(?:ed|ing)(?![\w])")
_RE_EXIT137 = re.compile(
    r"(?<![\w])(?:exit(?:ed)?(?: with)?[ _]?(?:code|status)|exitcode|return ?code|returncode)"
    r"[\"']?\s{0,40}[:=]?\s{0,40}137(?!\d|\.\d)",
    re.IGNORECASE,
)
_RE_SIGKILL = re.compile(
    r"exitcode\s{0,10}:\s{0,10}-9(?!\d)|Signal 9 \(SIGKILL\) received by PID (\d{1,10})"
    r"|terminated with signal SIGKILL|signal: killed|<Signals\.SIGKILL: 9>"
    r"|exits with return code = -9(?!\d)"  # DeepSpeed's launcher
)
_RE_PID_PAREN = re.compile(r"\(pid: ?(\d{1,10})\)")
_RE_LOCAL_RANK = re.compile(r"(?<![\w])local_rank ?[:=] ?(\d{1,7})")
_RE_BASH_KILLED = re.compile(r"(?:(?<![\w])line \d{1,7}: {1,10}(\d{1,10})|^\[\d{1,5}\][+-]?) {1,30}Killed\b")
_RE_SLURM_EVENT = re.compile(r"Detected (\d{1,7}) oom[-_]kill events? in (?:StepId=)?([\w.]{1,64})")
_RE_SLURM_TASK = re.compile(r"task (\d{1,7}): Out Of Memory")
# slurmstepd's accounting poll (no cgroup enforcement): "Job 552190 exceeded memory limit (1048837120 >
# 1048576000), being killed" (KiB), "Step 4.0 exceeded …", or alone "Exceeded job memory limit"
_RE_SLURM_EXCEEDED = re.compile(
    r"(?:(?:Job|Step) ([\w.]{1,64}) exceeded memory limit \((\d{1,20}) > (\d{1,20})\), being killed"
    r"|Exceeded (?:job|step) memory limit)"
)
_RE_EVICTED = re.compile(
    r"The node was low on resource: memory\.(?:.{0,300}?Container ([\w.-]{1,253}) was using (\d{1,20})Ki)?"
)
_RE_RAY_OOM = re.compile(r"(?:Task|Actor|Worker) was killed due to (?:the )?node running low on memory")
_RE_CPU_ALLOC = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate (\d{1,24}) bytes"
)
_RE_EXC_END = re.compile(r"(?<![\w.])([A-Za-z_][\w.]{0,150}(?:Error|Exception|Interrupt))(?::\s*|\(['\"]?)$")
_RE_EXC_ANY = re.compile(r"(?<![\w.])([A-Za-z_][\w.]{0,150}(?:Error|Exception|Interrupt)): ")
_RE_EXC_LINE = re.compile(r"\s{0,16}([A-Za-z_][\w.]{0,150}(?:Error|Exception|Interrupt)): ")
_RE_RANK_WORD = re.compile(r"(?<![\w])rank[\s:=#_-]{0,3}(\d{1,7})(?![\d])", re.IGNORECASE)

# How a torch message ends: the numbers ("core") and then the hint.
_RE_CORE_END = re.compile(
    r"(?:reserved in total by PyTorch|cached|inactive)\)|is reserved by PyTorch but unallocated\.?"
    r"|per_process_memory_fraction limit\.?"
)
_RE_HINT_END = re.compile(r"Memory Management and PYTORCH_CUDA_ALLOC_CONF|\(https?://[^()\s]{1,300}\)")
_HINT_STARTS = ("If reserved", "See documentation", "PYTORCH_CUDA_ALLOC_CONF", "(https://", "fragmentation")
_RE_NEW_RECORD = re.compile(
    r"(?:Traceback \(most recent|File \"|During handling|The above exception|\[?[IWEF]\d{4} "
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b"
    r"|[A-Za-z_][\w.]{0,150}(?:Error|Exception|Warning|Interrupt)\b)"
)

_HOST_PRIORITY = {
    "host-kernel-oom": 0,
    "host-oomkilled": 1,
    "host-slurm-oom": 2,
    "host-notebook-ram": 2,
    "host-killed": 3,
    "host-worker-killed": 4,
    "host-cpu-alloc": 5,
    "host-pinned": 5,
    "host-evicted": 2,
    "host-sigkill": 6,
    "host-exit-137": 7,
}
_HOST_STRONG = frozenset(
    {"host-kernel-oom", "host-oomkilled", "host-slurm-oom", "host-killed", "host-notebook-ram"}
)
_HOST_WEAK = frozenset({"host-sigkill", "host-exit-137"})
_TORCH_FORMATS = frozenset(
    {"pre-2.1", "pre-2.1-cached", "2.1", "2.2+", "fraction-rejected", "async", "unknown"}
)


@dataclass(slots=True)
class _Hit:
    start: int  # column in the line's content where the message text starts
    msg: OomMessage
    end: int = -1  # column where the text ends (-1: end of line)
    torch: bool = False  # a torch allocator message: may continue on the following lines
    killed_alone: bool = False  # "Killed" alone: accepted only at the end of the output
    g: int | None = None  # rank named by the message itself (slurm "task N")
    lr: int | None = None  # local rank named by the line (torchrun agent "local_rank: N")


def _exc_before(content: str, start: int) -> str | None:
    """The exception type printed right before ``start`` ("torch.OutOfMemoryError: …")."""
    pre = content[max(0, start - 200) : start].rstrip()
    m = _RE_EXC_END.search(pre)
    return m.group(1) if m else None


def _detect(content: str) -> list[_Hit]:
    """The messages that start on one line (content without prefixes), by column."""
    if not content:
        return []
    low = content.lower()
    hits: list[_Hit] = []
    if "out of memory" in low:
        hits.extend(_detect_torch(content))
    if "would exceed allowed memory" in low:
        m = _RE_ASYNC.search(content)
        if m:
            msg = OomMessage(CUDA_OOM, "async", "", device_index=int(m.group(1)))
            hits.append(_Hit(_error_start(content, m.start()), msg))
    if "cuda" in low or "cublas" in low or "hip error" in low or "cudnn" in low:
        m = _RE_CUDA_ERR.search(content)
        if m and (m.start() == 0 or content[m.start() - 1] not in "\"'"):
            msg = OomMessage(CUDA_OOM, "cuda-error", "", extra={"error": m.group(0)})
            if m.group(0).endswith("NOT_INITIALIZED"):
                msg.extra["library_init"] = m.group(0).split("_", 1)[0].lower()
            hits.append(_Hit(m.start(), msg))
    if "no executable batch size found" in low:
        m = _RE_BATCH_SEARCH.search(content)
        if m:
            # accelerate's find_executable_batch_size (HF Trainer's auto_find_batch_size) halves the batch
            # after each out-of-memory error it catches, and gives up when it reaches zero
            msg = OomMessage(
                CUDA_OOM, "cuda-error", "", extra={"error": m.group(0), "batch_search": "exhausted"}
            )
            hits.append(_Hit(_error_start(content, m.start()), msg))
    if "internal assert failed" in low:
        hits.extend(_detect_assert(content))
    if "hami-core" in low or "4pdvgpu" in low:
        hits.extend(_detect_hami(content))
    if (
        "unable to" in low
        or "no space left" in low
        or "failed to extend" in low
        or "shared memory segment" in low
    ):
        hits.extend(_detect_shm_files(content))
    if "emptydir volume" in low:
        m = _RE_EMPTYDIR.search(content)
        if m and "shm" in m.group(1).lower():
            msg = OomMessage(SHM_EXHAUSTED, "shm-emptydir-evicted", "", extra={"volume": m.group(1)})
            msg.extra["limit"] = m.group(2)
            hits.append(_Hit(m.start(), msg))
    if "killed by signal" in low:
        m = _RE_DL_SIGNAL.search(content)
        if m:
            sig = m.group(2)
            pid = int(m.group(1))
            if sig in ("Bus error", "Bus"):
                msg = OomMessage(SHM_EXHAUSTED, "shm-bus-error", "", worker_pid=pid, extra={"signal": sig})
                hits.append(_Hit(m.start(), msg))
            elif sig == "Killed":
                msg = OomMessage(HOST_OOM, "host-worker-killed", "", worker_pid=pid, exit_code=137)
                msg.extra["signal"] = sig
                hits.append(_Hit(m.start(), msg))
    if "bus error" in low:
        m = _RE_WORKER_BUS.search(content)
        if m:
            hits.append(_Hit(m.start(), OomMessage(SHM_EXHAUSTED, "shm-worker-bus-error", "")))
    if "low on resource: memory" in low:
        m = _RE_EVICTED.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-evicted", "")
            if m.group(1):
                msg.extra["container"] = m.group(1)
                msg.extra["used_bytes"] = str(int(m.group(2)) * 1024)
            hits.append(_Hit(m.start(), msg))
    if "running low on memory" in low:
        m = _RE_RAY_OOM.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-ray-oom", "", exit_code=137, extra={"signal": "SIGKILL"})
            hits.append(_Hit(_error_start(content, m.start()), msg))
    if "defaultcpuallocator" in low:
        m = _RE_CPU_ALLOC.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-cpu-alloc", "", requested_bytes=int(m.group(1)))
            hits.append(_Hit(m.start(), msg))
    if any(w in low for w in _SERVING_WORDS):
        hits.extend(_detect_serving(content))
    hits.extend(_detect_host(content, low))
    hits.sort(key=lambda h: h.start)
    return hits


def _gib(text: str) -> int:
    return round(float(text) * GiB)


def _detect_serving(content: str) -> list[_Hit]:
    """An inference server's own words that the device or its memory budget is too small (see
    ``_RE_VLLM_FREE``): the free-memory check is a CUDA OOM with the device's numbers (nothing of the
    server's allocated yet, its budget the request); the others are ``serving-config``."""
    m = _RE_VLLM_FREE.search(content)
    if m:
        msg = OomMessage(
            CUDA_OOM,
            "vllm-startup",
            "",
            requested_bytes=_gib(m.group(4)),
            total_bytes=_gib(m.group(2)),
            free_bytes=_gib(m.group(1)),
            allocated_bytes=0,
            reserved_bytes=0,
            extra={"engine": "vllm", "gpu_memory_utilization": m.group(3)},
        )
        return [_Hit(_error_start(content, m.start()), msg)]
    m = _RE_VLLM_KV.search(content)
    if m:
        msg = OomMessage(CUDA_OOM, "serving-config", "", extra={"engine": "vllm", "limit": "kv-cache"})
        if m.group(1):
            msg.extra.update(max_model_len=m.group(1).replace(",", ""), kv_tokens=m.group(2).replace(",", ""))
        elif m.group(3):
            msg.extra["max_model_len"] = m.group(3).replace(",", "")
            if m.group(4):
                msg.requested_bytes = _gib(m.group(4))
                msg.extra["kv_available_bytes"] = str(max(0, _gib(m.group(5))))
        return [_Hit(_error_start(content, m.start()), msg)]
    m = _RE_VLLM_KV_PROFILE.search(content)
    if m:
        msg = OomMessage(CUDA_OOM, "serving-config", "", extra={"engine": "vllm", "limit": "kv-cache"})
        left = m.group(1) or m.group(2)
        msg.extra["kv_available_bytes"] = "0" if left is None else str(max(0, _gib(left)))
        return [_Hit(m.start(), msg)]
    m = _RE_TGI_PREFILL.search(content)
    if m:
        msg = OomMessage(CUDA_OOM, "serving-config", "", extra={"engine": "tgi", "limit": "prefill"})
        msg.extra["prefill_tokens"] = m.group(1)
        return [_Hit(_error_start(content, m.start()), msg)]
    return []


def _detect_torch(content: str) -> list[_Hit]:
    found: list[tuple[int, str]] = []
    lead = len(content) - len(content.lstrip())
    for n, m in enumerate(_RE_TORCH.finditer(content)):
        if n >= 256 or len(found) >= 64:
            break
        after = content[m.end() : m.end() + 40]
        ok = after.startswith((". Tried to allocate", ". Allocation was preemptively"))
        if not ok:
            ok = m.start() == lead or _exc_before(content, m.start()) is not None
        if ok:
            found.append((m.start(), m.group(1)))
    if not found and (cut := _RE_TORCH_CUT.search(content)) is not None:
        # "CUD" ended the line above: a terminal's hard wrap cut the word; the allocator's own words follow
        found.append((cut.start(), "CUDA"))
    hits: list[_Hit] = []
    for k, (start, backend) in enumerate(found):
        end = found[k + 1][0] if k + 1 < len(found) else -1
        msg = OomMessage(CUDA_OOM, "unknown", "")
        if backend != "CUDA":
            msg.extra["backend"] = backend
        hits.append(_Hit(start, msg, end=end, torch=True))
    return hits


def _detect_assert(content: str) -> list[_Hit]:
    m = _RE_ASSERT.search(content)
    if not m:
        return []
    pre = content[max(0, m.start() - 300) : m.start()]
    base = m.start() - len(pre)
    start = m.start()
    exc: str | None = None
    for e in _RE_EXC_ANY.finditer(pre):
        exc, start = e.group(1), base + e.end()
    if exc is None:  # no "RuntimeError: " before it: the condition starts at "NVML…" or the line start
        i = pre.rfind("NVML")
        if i >= 0:
            start = base + i
        elif base == 0:
            start = len(pre) - len(pre.lstrip())
    cond = content[start : m.start()].strip()
    fmt = "nvml-assert" if "NVML" in cond else "allocator-assert"
    msg = OomMessage(CUDA_OOM, fmt, "", exception_type=exc)
    msg.extra.update({"assert": cond[:300], "file": m.group(1), "line": m.group(2)})
    return [_Hit(start, msg)]


def _detect_hami(content: str) -> list[_Hit]:
    hits: list[_Hit] = []
    m = _RE_HAMI.search(content)
    if m:
        used, limit = int(m.group(3)), int(m.group(4))
        msg = OomMessage(CUDA_OOM, "vgpu", "", device_index=int(m.group(2)))
        msg.vgpu_used_bytes, msg.vgpu_limit_bytes = used, limit
        _hami_extra(msg, m.group(1))
        if used >= 2**63:
            msg.extra["vgpu_used_wrapped"] = "true"  # HAMi's unsigned usage counter underflowed
        hits.append(_Hit(m.start(), msg))
    m = _RE_4PD.search(content)
    if m:
        msg = OomMessage(CUDA_OOM, "vgpu", "")
        msg.vgpu_used_bytes, msg.vgpu_limit_bytes = int(m.group(2)), int(m.group(3))
        _hami_extra(msg, m.group(1))
        hits.append(_Hit(m.start(), msg))
    m = _RE_HAMI_ALLOC.search(content)
    if m:
        msg = OomMessage(CUDA_OOM, "vgpu-alloc-failed", "", extra={"cuda_result": "2"})
        _hami_extra(msg, m.group(1))
        hits.append(_Hit(m.start(), msg))
    return hits


def _hami_extra(msg: OomMessage, bracket: str) -> None:
    msg.extra["layer"] = "HAMi-core"
    p = _RE_HAMI_PID.search(bracket)
    if p:
        msg.extra["pid"] = p.group(1)
    loc = _RE_HAMI_LOC.search(bracket.strip())
    if loc:
        msg.extra["location"] = loc.group(1)


def _errno_extra(msg: OomMessage, m: re.Match[str], first: int) -> None:
    """Fill path/error/errno from groups (path, error, errno) starting at ``first``."""
    msg.extra["path"] = m.group(first)
    if m.group(first + 2):
        msg.extra["error"] = (m.group(first + 1) or "").strip()
        msg.extra["errno"] = m.group(first + 2)


def _detect_shm_files(content: str) -> list[_Hit]:
    hits: list[_Hit] = []
    covered = False
    m = _RE_SHM_WRITE.search(content)
    if m:
        msg = OomMessage(SHM_EXHAUSTED, "shm-unable-to-write", "")
        _errno_extra(msg, m, 1)
        hits.append(_Hit(m.start(), msg))
        covered = True
    m = _RE_SHM_ALLOC.search(content)
    if m:
        msg = OomMessage(SHM_EXHAUSTED, "shm-unable-to-allocate", "")
        _errno_extra(msg, m, 1)
        hits.append(_Hit(m.start(), msg))
        covered = True
    m = _RE_SHM_MMAP.search(content)
    if m:
        msg = OomMessage(SHM_EXHAUSTED, "shm-unable-to-mmap", "", requested_bytes=int(m.group(1)))
        _errno_extra(msg, m, 2)
        hits.append(_Hit(m.start(), msg))
        covered = True
    if not covered:
        m = _RE_NOSPACE.search(content)
        if m:
            msg = OomMessage(SHM_EXHAUSTED, "shm-no-space", "", extra={"errno": "28"})
            hits.append(_Hit(_error_start(content, m.start()), msg))
        else:
            e = _RE_ERRNO28.search(content)
            path = e.group(1) if e else None
            if e and path and ("/dev/shm" in path or "torch_" in path):
                msg = OomMessage(SHM_EXHAUSTED, "shm-no-space", "", extra={"errno": "28", "path": path})
                hits.append(_Hit(_error_start(content, e.start()), msg))
    m = _RE_NCCL_SHM.search(content) or _RE_NCCL_SEGMENT.search(content)
    if m:
        size = m.group(2)
        msg = OomMessage(SHM_EXHAUSTED, "shm-nccl", "", requested_bytes=int(size) if size else None)
        msg.extra["path"] = m.group(1)
        hits.append(_Hit(m.start(), msg))
    return hits


def _error_start(content: str, pos: int) -> int:
    """Start a text at the exception type before ``pos`` when there is one on the line."""
    pre = content[max(0, pos - 300) : pos]
    start = pos
    for e in _RE_EXC_ANY.finditer(pre):
        start = pos - len(pre) + e.end()
    return start


def _detect_host(content: str, low: str) -> list[_Hit]:
    hits: list[_Hit] = []
    if "out of memory" in low:
        m = _RE_KERNEL.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-kernel-oom", "", exit_code=137)
            msg.extra.update({"pid": m.group(2), "process": m.group(3), "signal": "SIGKILL"})
            if m.group(1).startswith("Memory cgroup"):
                msg.extra["cgroup"] = "true"
            rss = _RE_ANON_RSS.search(content, m.end())
            if rss:
                msg.extra["anon_rss_bytes"] = str(int(rss.group(1)) * 1024)
            hits.append(_Hit(m.start(), msg))
        m = _RE_SLURM_TASK.search(content)
        if m:
            hits.append(_Hit(0, OomMessage(HOST_OOM, "host-slurm-oom", ""), g=int(m.group(1))))
    if "oom-kill" in low or "oom_kill" in low:
        m = _RE_OOM_KILL_LINE.search(content)
        if m:
            t = _RE_OOM_KILL_TASK.search(content, m.end())
            if t:
                msg = OomMessage(HOST_OOM, "host-kernel-oom", "", exit_code=137)
                msg.extra.update({"pid": t.group(2), "process": t.group(1), "signal": "SIGKILL"})
                msg.extra["constraint"] = m.group(1)
                if "MEMCG" in m.group(1):
                    msg.extra["cgroup"] = "true"
                hits.append(_Hit(m.start(), msg))
        m = _RE_SLURM_EVENT.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-slurm-oom", "", extra={"events": m.group(1)})
            msg.extra["step"] = m.group(2).rstrip(".")
            hits.append(_Hit(0, msg))
    if "available ram" in low:
        m = _RE_NOTEBOOK_RAM.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-notebook-ram", "", exit_code=137)
            hits.append(_Hit(m.start(), msg))
    if "xceeded" in low:
        m = _RE_SLURM_EXCEEDED.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-slurm-oom", "", exit_code=137)
            if m.group(1):
                msg.extra["step"] = m.group(1)
                msg.extra["usage_bytes"] = str(int(m.group(2)) * 1024)
                msg.extra["limit_bytes"] = str(int(m.group(3)) * 1024)
            hits.append(_Hit(0, msg))
    if "oomkill" in low and _RE_OOMKILLED.search(content):
        hits.append(_Hit(0, OomMessage(HOST_OOM, "host-oomkilled", "")))
    if "137" in low:
        m = _RE_EXIT137.search(content)
        if m:
            hits.append(_Hit(0, OomMessage(HOST_OOM, "host-exit-137", "", exit_code=137)))
    if "kill" in low or "exitcode" in low:
        m = _RE_SIGKILL.search(content)
        if m:
            msg = OomMessage(HOST_OOM, "host-sigkill", "", exit_code=137, extra={"signal": "SIGKILL"})
            pid = m.group(1)
            if pid is None:
                p = _RE_PID_PAREN.search(content)
                pid = p.group(1) if p else None
            if pid is not None:
                msg.extra["pid"] = pid
            lr = _RE_LOCAL_RANK.search(content)
            hits.append(_Hit(0, msg, lr=int(lr.group(1)) if lr else None))
        stripped = content.strip()
        if stripped in ("Killed", "Killed."):
            hits.append(_Hit(0, OomMessage(HOST_OOM, "host-killed", "", exit_code=137), killed_alone=True))
        else:
            m = _RE_BASH_KILLED.search(content)
            if m:
                msg = OomMessage(HOST_OOM, "host-killed", "", exit_code=137, extra={"signal": "SIGKILL"})
                if m.group(1):
                    msg.extra["pid"] = m.group(1)
                hits.append(_Hit(0, msg))
    if len(hits) > 1:  # several spellings of one host event on one line: keep the most specific
        hits.sort(key=lambda h: _HOST_PRIORITY.get(h.msg.format, 99))
        best = hits[0]
        for h in hits[1:]:
            _fill(best.msg, h.msg)
            best.g = best.g if best.g is not None else h.g
            best.lr = best.lr if best.lr is not None else h.lr
        hits = [best]
    return hits


# ------------------------------------------------------------------------------------------ torch text


def _fill_torch(msg: OomMessage, text: str) -> None:
    """Parse the numbers of a torch allocator message into ``msg`` (sets ``format`` too)."""
    norm = " ".join(text.split())
    m = _RE_TRIED.search(norm)
    if m:
        msg.requested_bytes = _size(m, 1)
    msg.fraction_rejected = "preemptively rejected" in norm
    old = _RE_OLD_GPU.search(norm)
    new = _RE_NEW_TOTAL.search(norm)
    fmt = "unknown"
    if old and (new is None or old.start() < new.start()):
        pos = old.start()
        msg.device_index = int(old.group(1))
        if m := _RE_OLD_TOTAL.search(norm, pos):
            msg.total_bytes = _size(m, 1)
        if m := _RE_OLD_ALLOC.search(norm, pos):
            msg.allocated_bytes = _size(m, 1)
        if m := _RE_OLD_FREE.search(norm, pos):
            msg.free_bytes = _size(m, 1)
        if m := _RE_ALLOWED.search(norm, pos):
            msg.allowed_bytes = _size(m, 1)
        fmt = "pre-2.1"
        if m := _RE_OLD_RESERVED.search(norm, pos):
            msg.reserved_bytes = _size(m, 1)
            if msg.allocated_bytes is not None:
                msg.reserved_unallocated_bytes = msg.reserved_bytes - msg.allocated_bytes
        elif m := _RE_OLD_CACHED.search(norm, pos):
            # torch ≤ 1.3: "cached" is memory held by the allocator but not allocated (reserved − allocated)
            fmt = "pre-2.1-cached"
            msg.cached_bytes = msg.reserved_unallocated_bytes = _size(m, 1)
            if msg.allocated_bytes is not None:
                msg.reserved_bytes = msg.allocated_bytes + msg.cached_bytes
                total = msg.total_bytes
                if total and msg.reserved_bytes > 1.01 * total and msg.cached_bytes >= msg.allocated_bytes:
                    # read that way the process would hold more than the device: the figure is the whole
                    # reservation (memory_cached(), allocated included), as some releases and hand-copied
                    # messages print it
                    msg.reserved_bytes = msg.cached_bytes
                    msg.reserved_unallocated_bytes = msg.cached_bytes - msg.allocated_bytes
    elif new:
        pos = new.start()
        msg.device_index = int(new.group(1))
        msg.total_bytes = _size(new, 3)
        fmt = "2.1" if new.group(2) == "capacty" else "2.2+"
        if m := _RE_NEW_FREE.search(norm, pos):
            msg.free_bytes = _size(m, 1)
        for p in _RE_PROC.finditer(norm, pos):
            pid = int(p.group(1)) if p.group(1) else None
            used = _size(p, 2)
            if used > msg.total_bytes * 1.05:
                # more than the whole device: NVML could not say (Windows/WDDM and WSL print 2^64 bytes,
                # "17179869184.00 GiB"); the line names a process whose usage is not known
                msg.extra["process_usage_unknown"] = "1"
                continue
            msg.processes.append(ProcessUsage(pid, used, pid is None))
        if m := _RE_ALLOWED.search(norm, pos):
            msg.allowed_bytes = _size(m, 1)
        if m := _RE_NEW_ALLOC.search(norm, pos):
            msg.allocated_bytes = _size(m, 1)
        if m := _RE_PRIVATE.search(norm, pos):
            msg.private_pool_bytes = _size(m, 1)
        if m := _RE_UNALLOC.search(norm, pos):
            msg.reserved_unallocated_bytes = _size(m, 1)
            if msg.allocated_bytes is not None:
                msg.reserved_bytes = msg.allocated_bytes + msg.reserved_unallocated_bytes
    if msg.fraction_rejected:
        fmt = "fraction-rejected"
    msg.format = fmt


_ASYNC_LINES = 6  # the figures the cudaMallocAsync backend prints, the limit's key on a line of its own


def _fill_async(msg: OomMessage, text: str) -> None:
    """The figures of a cudaMallocAsync message. The backend keeps no cache of its own that torch counts:
    what it has allocated is what it holds (reserved = allocated); the limit is a fraction cap only when
    one was set (unset, it prints 2^64 − 1 bytes)."""
    key: str | None = None
    for line in text.split("\n")[1:]:
        if _RE_ASYNC_LIMIT_HEAD.match(line):
            key = "PyTorch limit"
            continue
        m = _RE_ASYNC_FIGURE.match(line)
        if m is None:
            continue
        name = m.group(1) or key or ""
        size = _size(m, 2)
        if name.startswith("PyTorch limit"):
            if size < ASYNC_UNLIMITED:
                msg.allowed_bytes = size
        elif name.startswith("Free"):
            msg.free_bytes = size
        elif name == "Currently allocated":
            msg.allocated_bytes = msg.reserved_bytes = size
            msg.reserved_unallocated_bytes = 0
        elif name == "Requested":
            msg.requested_bytes = size
        elif name == "Device limit":
            msg.total_bytes = size
        key = None


def _last(rx: re.Pattern[str], s: str) -> re.Match[str] | None:
    """The last match of ``rx`` in ``s``."""
    tail = deque(rx.finditer(s), maxlen=1)
    return tail[0] if tail else None


def _trim_torch(text: str) -> str:
    """Cut what follows the end of the message on its line (a JSON log's closing quote, …)."""
    m = _last(_RE_HINT_END, text)
    if m is not None:
        return text[: m.end()]
    m = _last(_RE_CORE_END, text)
    if m is not None and not text[m.end() :].lstrip().startswith(_HINT_STARTS):
        return text[: m.end()]
    return text.rstrip()


# Words of torch's templates: a line break between two pieces that only make one of these together
# cut a word in two ("capa|city"); otherwise it replaced a space.
_VOCAB = frozenset(
    {
        "tried",
        "allocate",
        "allocated",
        "already",
        "total",
        "capacity",
        "capacty",
        "free",
        "reserved",
        "pytorch",
        "cached",
        "allowed",
        "which",
        "process",
        "memory",
        "including",
        "non",
        "this",
        "private",
        "pools",
        "graphs",
        "unallocated",
        "documentation",
        "management",
        "fragmentation",
        "setting",
        "expandable",
        "segments",
        "environment",
        "variables",
        "preemptively",
        "rejected",
        "because",
        "exceed",
        "limit",
        "fraction",
        "large",
        "avoid",
        "try",
        "see",
        "has",
        "and",
        "with",
        "use",
        "the",
        "if",
        "out",
        "gpu",
        "cuda",
        "bytes",
        "kib",
        "mib",
        "gib",
        "tib",
        "docs",
        "stable",
        "notes",
        "html",
        "https",
        "pytorch_cuda_alloc_conf",
        "max_split_size_mb",
        "true",
    }
)
_RE_TAIL_WORD = re.compile(r"[A-Za-z]{1,40}$")
_RE_HEAD_WORD = re.compile(r"[A-Za-z]{1,40}")


def _join(a: str, b: str) -> str:
    """Join two pieces of one wrapped message."""
    if not a:
        return b
    if not b:
        return a
    x, y = a[-1], b[0]
    if x.isspace() or y.isspace():
        return a + b
    glue = " "
    if (x.isdigit() and (y.isdigit() or y == ".")) or (x == "." and y.isdigit()):
        glue = ""  # a number cut in two: torch never prints two numbers side by side
    elif x.isalpha() and y.isalpha():
        t = _RE_TAIL_WORD.search(a)
        h = _RE_HEAD_WORD.match(b)
        if t and h:
            tw, hw = t.group(0).lower(), h.group(0).lower()
            if (tw + hw) in _VOCAB and not (tw in _VOCAB and hw in _VOCAB):
                glue = ""
    elif (x.isalnum() and y in ".;,):") or x in "(_/-=:#<" or y in "_/-=#>":
        glue = ""
    return a + glue + b


def _core_complete(text: str) -> bool:
    return _RE_CORE_END.search(text) is not None


def _needs_hint(text: str) -> bool:
    """The hint sentence has started but not ended."""
    i = text.find("If reserved")
    return i >= 0 and _RE_HINT_END.search(text, i) is None


# --------------------------------------------------------------------------------------------- parser


@dataclass(slots=True)
class _Found:
    msg: OomMessage
    g: int | None
    lr: int | None
    line: int  # 0-based
    col: int
    last_line: int  # last line of this message or of a duplicate merged into it


def _compatible(a: _Found, b: _Found) -> bool:
    """Whether two occurrences may come from the same rank."""
    if (a.g is None and a.lr is None) or (b.g is None and b.lr is None):
        return True
    if a.g is not None and b.g is not None and a.g != b.g:
        return False
    if a.lr is not None and b.lr is not None and a.lr != b.lr:
        return False
    return (a.g is not None and a.g == b.g) or (a.lr is not None and a.lr == b.lr)


def _fill(dst: OomMessage, src: OomMessage) -> None:
    """Fill what ``dst`` lacks from ``src`` (another occurrence or spelling of the same event)."""
    for name in _FILLABLE:
        if getattr(dst, name) is None:
            v = getattr(src, name)
            if v is not None:
                setattr(dst, name, v)
    if not dst.processes and src.processes:
        dst.processes = list(src.processes)
    for k, v in src.extra.items():
        dst.extra.setdefault(k, v)


_FILLABLE = tuple(
    f.name
    for f in fields(OomMessage)
    if f.name not in ("kind", "format", "text", "line_no", "rank", "processes", "extra", "fraction_rejected")
)


# A line that shows training going on: "step 120 | loss …", "Epoch 3/10", "iter: 40", the Hugging Face
# Trainer's "{'loss': 0.52, …}", a tqdm bar ("450/1000 [02:10<…").
_RE_PROGRESS = re.compile(
    # (not a count per epoch a banner states: "Num batches each epoch = 2", "steps per epoch: 500")
    r"(?<![\w])(?<!each )(?<!per )(?:global_step|step|iter(?:ation)?|epoch)(?![\w])['\"]?\s{0,3}[:=#]?\s{0,3}\[?\d"
    r"|'loss': ?-?\d|(?<![\w/])\d{1,9}/\d{1,9} \[\d",
    re.IGNORECASE,
)
# What a process prints when it dies of something else: an exception ending a traceback, a fatal signal.
_RE_FATAL = re.compile(
    r"\s{0,16}(?:[A-Za-z_][\w.]{0,150}(?:Error|Exception|Interrupt)(?::\s|$)"
    r"|Fatal Python error: |Segmentation fault|Bus error \(core dumped\)|Aborted \(core dumped\))"
)
_MAX_AFTER_LINES = 2_000_000


def went_on_after(text: str, line_no: int, rank: int | None = None) -> tuple[int, str | None]:
    """(training-progress lines, the last fatal error line) in ``text`` after line ``line_no`` (1-based):
    how far a process went on after an error it caught (an OOM skipped by an evaluation loop, a batch
    size finder, a retry with a smaller batch). Only lines of ``rank`` (or lines without a rank prefix)
    count, and nothing after a restart of the worker group: that is a new attempt."""
    lines = text.split("\n")
    progress = 0
    fatal: str | None = None
    for raw in lines[line_no : line_no + _MAX_AFTER_LINES]:
        if "estart" in raw and _RE_RESTART.search(raw):
            break
        ln = _strip_line(raw)
        if rank is not None and ln.g is not None and ln.g != rank:
            continue
        if _RE_FATAL.match(ln.content):
            fatal = ln.content.strip()[:200]
        elif _RE_PROGRESS.search(ln.content):
            # a progress bar redraws itself after carriage returns: each redraw counts (the line reads as
            # its last one)
            redraws = [p for p in raw.split("\r") if p.strip()][:-1] if "\r" in raw else []
            progress += 1 + sum(1 for p in redraws if _RE_PROGRESS.search(p))
            fatal = None  # an error the process went on after is not its last
    return progress, fatal


# What a training loop prints of its live GPU memory, per step: DeepSpeed's ``see_memory_usage`` ("MA 21.3 GB
# Max_MA 27.4 GB CA …", GiB printed as GB), and ``torch.cuda.memory_allocated()`` printed under any name that
# says allocated (``mem_allocated 14.2 GiB``, ``memory_allocated()=9663676416``, ``| alloc 22.41 GiB |``,
# DeepSpeed's timer ``MemAllocated=22.1GB, MaxMemAllocated=31.5GB``, Lightning's ``mem/alloc_gib=43.4``,
# ``peak_allocated(step)=44.2 GiB``); a max or peak value is the peak.
_RE_DS_MA = re.compile(r"(?<![\w])MA (\d{1,9}(?:\.\d{1,6})?) ?GB\s{1,40}Max_MA (\d{1,9}(?:\.\d{1,6})?) ?GB")
_RE_ALLOCATED = re.compile(
    r"(?<![\w.])((?:(?:[A-Za-z_]{1,40}[._/]){0,4}alloc(?:ated)?(?:_(?:idle|now|cur|current|live|after|post|end))?"
    r"|(?-i:(?:[A-Z][a-z]{1,10}){1,3}Alloc(?:ated)?))"
    r"(?:_bytes(?:\.all\.current)?|_(gib|mib|gb|mb))?(?:\([a-z_]{0,12}\))?)"
    r"['\"]?\s{0,3}[:=]?\s{0,3}(\d{1,20}(?:\.\d{1,6})?(?:e\+?\d{1,2})?)\s{0,2}(GiB|MiB|KiB|GB|MB|KB|G|M|bytes|B)?(?![\w])",
    re.IGNORECASE,
)
# the same under Chinese, Russian and Japanese keys ("显存 已分配 27.51GB 已保留 58.68GB 峰值 58.43GB",
# "память: выделено 8.73 ГБ, … пик 19.93 ГБ", "割り当て済み 12.1GiB"): allocated, and a peak beside it
_INTL_ALLOCATED = ("已分配", "分配显存", "выделено", "割り当て")
_RE_INTL_SIZE = (
    r"\s{0,3}[:=：]?\s{0,3}(\d{1,20}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M|ГиБ|МиБ|ГБ|МБ|Г|М)(?![\w])"
)
_RE_INTL_ALLOCATED = re.compile(
    r"(?:已分配(?:显存)?|分配显存|выделено|割り当て済み|割り当て)" + _RE_INTL_SIZE
)
_RE_INTL_PEAK = re.compile(r"(?:峰值|最大已分配|пик|максимум|ピーク)" + _RE_INTL_SIZE)
# GPU memory "in use" under a key that does not say which counter ("显存占用 8.48 GB", "GPU-память 12 ГБ"): read
# as the weakest reading, a peak printed alone, like the generic English key
_INTL_GENERIC = ("显存占用", "显存使用", "占用显存", "GPU显存", "GPU-память", "видеопамять")
_RE_INTL_GENERIC = re.compile("(?:" + "|".join(map(re.escape, _INTL_GENERIC)) + ")" + _RE_INTL_SIZE)
# a peak printed alone: torchvision's MetricLogger ("max mem: 9518", MiB of torch.cuda.max_memory_allocated()),
# detectron2 ("max_mem: 4539M"), "Peak GPU memory: 30.10 GB", "peak_mem=12.1GiB"
_PEAK_ONLY_WORDS = ("max mem", "max_mem", "max_memory", "peak", "Peak", "PEAK")
_RE_PEAK_ONLY = re.compile(
    r"(?<![\w])(?:max[ _]mem(?:ory)?|peak[ _](?:gpu[ _])?mem(?:ory)?|mem(?:ory)?[ _]peak)"
    r"(?:[ _](usage|used|reserved|cached))?"
    r"['\"]?\s{0,3}[:=]\s{0,3}(\d{1,20}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)?(?![\w])",
    re.IGNORECASE,
)
# "mem(alloc/reserved) 10.75/16.65 GB", "alloc/res: 10.2/16.1 GiB": the pair, allocated first
_RE_ALLOC_PAIR = re.compile(
    r"(?<![\w])alloc(?:ated)?\s{0,2}/\s{0,2}(?:res(?:erved)?|cached)\)?['\"]?\s{0,3}[:=]?\s{0,3}"
    r"(\d{1,20}(?:\.\d{1,6})?)\s{0,2}/\s{0,2}\d{1,20}(?:\.\d{1,6})?\s{0,2}(GiB|MiB|GB|MB|G|M)(?![\w])",
    re.IGNORECASE,
)
# the size printed before the word ("mem 5.21GiB alloc / 11.69GiB reserved", "12.1 GB allocated")
_RE_SIZE_ALLOCATED = re.compile(
    r"(?<![\w.])(\d{1,9}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)\s{1,2}alloc(?:ated)?(?![\w])", re.IGNORECASE
)
# GPU memory under a key that does not say which counter ("Mem 0.57G", "gpu_mem_gb=6.21", "cuda_memory: 12 GiB"):
# allocated, reserved or a peak, so read as the weakest of them, a peak printed alone
_RE_GENERIC_MEM = re.compile(
    r"(?<![\w./])((?:gpu|cuda)[ _]?mem(?:ory)?|mem(?:ory)?)(?:_(gib|mib|gb|mb))?['\"]?\s{0,3}[:=]?\s{0,3}"
    r"(\d{1,9}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)?(?![\w])",
    re.IGNORECASE,
)
# a word just before a generic key that makes it another counter ("reserved mem: 16G", "host memory 12 GB")
_RE_NOT_LIVE = re.compile(r"reserv|cach|free|total|avail|host|cpu|sys|ram", re.IGNORECASE)
_RE_PEAK_WORD = re.compile(r"max|peak", re.IGNORECASE)
# torch.cuda.memory_stats()'s whole-device byte counts, printed as a dict or as (key, value) pairs
_RE_STATS_CUMULATIVE = re.compile(r"allocated_bytes\.[a-z_]{1,12}\.(?:allocated|freed)")
_RE_STATS_KEY = re.compile(r"['\"]allocated_bytes\.all\.(current|peak)['\"]\s{0,2}[:,]\s{0,2}(\d{1,20})")
# torch.cuda.memory_summary()'s "| Allocated memory      |   3993 MiB |   6963 MiB |  46778 GiB | …"
_RE_SUMMARY_ROW = re.compile(
    r"^\| Allocated memory\s{1,30}\|\s{0,12}(\d{1,12}) (B|KiB|MiB|GiB|TiB) \|\s{0,12}(\d{1,12}) (B|KiB|MiB|GiB|TiB) \|"
)
# torch.cuda.memory_reserved() (or its peak) printed alone ("mem_reserved: 22.4 GB", "memory_reserved()=…",
# "max_memory_reserved 61.0GiB"): the allocator's reservation bounds each step's peak from above and never
# shrinks without empty_cache(), so it reads as a peak printed alone, like Ultralytics' GPU_mem column
_RE_RESERVED = re.compile(
    r"(?<![\w.])(?:[A-Za-z_]{1,40}[._/]){0,3}(?:max_|peak_)?(?:mem(?:ory)?[ _])?reserved(?:_bytes|_(gib|mib|gb|mb))?"
    r"(?:\(\))?['\"]?\s{0,3}[:=]?\s{0,3}(\d{1,20}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)?(?![\w])",
    re.IGNORECASE,
)
_RE_BARE_PEAK = re.compile(
    r"(?<![\w.])(?:peak|max)\s{0,2}[:=]\s{0,2}(\d{1,9}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)(?![\w])",
    re.IGNORECASE,
)
_DS_TIMER_KEYS = frozenset({"MemAllocated", "MaxMemAllocated"})
# a peak under a GPU-memory key, then what the step left behind under "after": "peak_cuda=5.54GiB after=4.71GiB"
_SZ = r"(\d{1,9}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)(?![\w])"
_RE_AFTER_PEAK = re.compile(
    r"(?<![\w])peak[_ ](?:cuda|gpu|mem(?:ory)?|vram)\w{0,12}\s{0,2}[:=]\s{0,2}"
    + _SZ
    + r"[,;|\s]{1,6}after\s{0,2}[:=]\s{0,2}"
    + _SZ,
    re.IGNORECASE,
)
# an allocated key followed by one reading per device: "memory_allocated cuda:0 9.49G cuda:1 3.28G"
_RE_PER_DEVICE = re.compile(
    r"(?:(?<=alloc )|(?<=allocated )|(?<=allocated: )|(?<=alloc: )|(?<=G )|(?<=B )|(?<=M )|(?<=, ))"
    r"cuda:\d{1,2}\s{0,2}[:=]?\s{0,2}(\d{1,9}(?:\.\d{1,6})?)\s{0,2}(GiB|MiB|GB|MB|G|M)(?![\w])"
)
_RE_WEBUI_PEAK = re.compile(
    r"(?<![\w])A: (\d{1,4}(?:\.\d{1,3})?) ?GB, R: \d{1,4}(?:\.\d{1,3})? ?GB"
    r"|Torch active/reserved: (\d{1,7})/\d{1,7} MiB"
)
# OpenMMLab's training log line (mmcv's "Epoch [1][50/7330] … memory: 3800", mmengine's "Epoch(train) [1][50/2931]
# … memory: 19332" or "Iter(train) [500/90000]"): its memory is a unitless MiB count
_RE_MM_ITER = re.compile(r"(?<![\w])(?:Epoch|Iter)(?:\((?:train|val|test)\))?\s{0,3}\[\d{1,7}\]")
_RE_MM_MEMORY = re.compile(r"(?<![\w])memory: (\d{1,7})(?![\w.])")
# the word in front, apart from the key: Megatron's "| max allocated: 53440.1 |", "peak allocated 31.2 GiB"
_RE_PEAK_BEFORE = re.compile(r"(?<![\w])(?:max|peak)[ _-]{1,2}$", re.IGNORECASE)
_RE_STEP_NO = re.compile(
    r"(?<![\w])(?<![A-Za-z]/)(?:global_step|step|iter(?:ation)?|it)(?![\w])[\s:=#\[]{0,8}(\d{1,9})"  # "it    50" padded
    r"|(?<![\w/])(\d{1,9})/\d{1,9} \[\d"  # a progress bar's "450/10000 [02:10<…"
    r"|\(after (\d{1,9}) iterations\)"  # Megatron's memory report
    r"|(?:步数?|шаг|ステップ)[\s:=#]{0,8}(\d{1,9})|第\s{0,2}(\d{1,9})\s{0,2}步",  # "步数 100", "шаг 100/1000", "第 20 步"
    re.IGNORECASE,
)
_SHORT_UNITS = {"G": "GIB", "M": "MIB"}
_INTL_UNITS = {**_SHORT_UNITS, "ГиБ": "GiB", "МиБ": "MiB", "ГБ": "GB", "МБ": "MB", "Г": "GIB", "М": "MIB"}
MIN_SIZED_BYTES = 1 << 20  # a bare number below this is not a byte count of GPU memory
RESTART_LEVEL = 1.05  # of the first sample's live memory: a count that starts again at this level restarted
# a unit printed once for the whole line: Megatron's "memory (MB) | allocated: 20121.6 | max allocated: …"
# (torch's bytes / 1024**2, printed as MB)
_RE_HEADER_UNIT = re.compile(r"\((MB|GB|MiB|GiB)\)")
_HEADER_UNITS = {"MB": "MIB", "GB": "GIB", "MiB": "MIB", "GiB": "GIB"}


def memory_samples(text: str, rank: int | None = None, until: int | None = None) -> list[dict[str, int]]:
    """The live GPU memory a log printed at each step, oldest first: ``{"step", "allocated_bytes",
    "peak_allocated_bytes"}`` (the peak only when printed beside it; a line that printed the peak alone
    gives it for both, with ``"peak_only": 1``). Lines up to line ``until`` (1-based),
    of ``rank`` or without a rank prefix; a step number from the line or the three lines before it."""
    out: list[dict[str, int]] = []
    lines = text.split("\n")
    end = min(until if until is not None else len(lines), len(lines))
    # the attempt the failure belongs to: after the launcher's last restart of the workers before it
    start = 0
    for j in range(end - 1, -1, -1):
        if "estart" in lines[j] and _RE_RESTART.search(lines[j]):
            start = j + 1
            break
    for i in range(start, end):
        whole = lines[i]
        if not _may_sample(whole):
            continue
        # a progress bar redraws itself after carriage returns: each redraw is a sample of its own
        for raw in whole.split("\r") if "\r" in whole else (whole,):
            if _may_sample(raw):
                _sample_line(out, lines, i, raw, rank)
    for sample in out:
        sample.pop("epoch", None)
        sample.pop("offset", None)
    if not out and "GPU_mem" in text:
        out = _gpu_mem_column(lines[start:end])
    if not out and "allocated_bytes.all.current," in text:
        out = _stats_csv(lines[start:end])
    return out


def _reserved_alone(content: str) -> dict[str, int] | None:
    """The reservation printed on a line that prints no allocated memory: a peak printed alone."""
    if "reserv" not in content.lower():
        return None
    m = _RE_RESERVED.search(content)
    if m is None:
        return None
    unit = m.group(3) or m.group(1)
    if unit is None:
        value = float(m.group(2))
        if value < MIN_SIZED_BYTES:
            return None
        size = int(value)
    else:
        size = _short_size(m.group(2), unit)
    if size < MIN_SIZED_BYTES:
        return None
    return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1, "reserved": 1}


def _stats_csv(lines: Sequence[str]) -> list[dict[str, int]]:
    """Lightning's metrics.csv (DeviceStatsMonitor's columns ``…/allocated_bytes.all.current`` and, when
    logged, ``…/allocated_bytes.all.peak``, beside ``step``): one sample per row that has the value."""
    out: list[dict[str, int]] = []
    cols: tuple[int, int | None, int | None] | None = None
    for raw in lines:
        content = _strip_line(raw).content.strip()
        if "allocated_bytes.all.current" in content:
            names = content.split(",")
            cur = next(i for i, n in enumerate(names) if n.endswith("allocated_bytes.all.current"))
            peak = next((i for i, n in enumerate(names) if n.endswith("allocated_bytes.all.peak")), None)
            step = next((i for i, n in enumerate(names) if n.strip() == "step"), None)
            cols = (cur, peak, step)
            continue
        if cols is None or "," not in content:
            continue
        cells = content.split(",")
        cur, peak, step = cols
        if len(cells) <= cur or not cells[cur].strip().isdigit():
            continue
        value = int(cells[cur])
        top = (
            int(cells[peak])
            if peak is not None and len(cells) > peak and cells[peak].strip().isdigit()
            else value
        )
        at = (
            int(cells[step])
            if step is not None and len(cells) > step and cells[step].strip().isdigit()
            else None
        )
        if at is None or (out and at <= out[-1]["step"]):
            at = out[-1]["step"] + 1 if out else 0
        out.append({"allocated_bytes": value, "peak_allocated_bytes": max(value, top), "step": at})
    return out


# Ultralytics' training table: a header "Epoch GPU_mem box_loss … Instances Size" and, per epoch, a row
# "  3/100  7.6G  1.35 …" whose GPU_mem is torch.cuda.memory_reserved() / 1e9 (so GB), printed as "7.6G"
_RE_EPOCH_ROW = re.compile(r"^\s{0,12}(\d{1,6})/\d{1,6}\s")


def _gpu_mem_column(lines: Sequence[str]) -> list[dict[str, int]]:
    """The GPU_mem column of Ultralytics' table, one sample per epoch (its last row drawn), read as a peak
    printed alone: the reservation bounds the epoch's peak from above."""
    out: list[dict[str, int]] = []
    col: int | None = None
    for raw in lines:
        for part in raw.split("\r") if "\r" in raw else (raw,):
            content = _strip_line(part).content
            if "GPU_mem" in content:
                cells = content.split()
                col = cells.index("GPU_mem") if "GPU_mem" in cells else None
                continue
            m = _RE_EPOCH_ROW.match(content)
            if col is None or m is None:
                continue
            cells = content.split()
            if len(cells) <= col or not cells[col].endswith("G"):
                continue
            try:
                size = parse_size(cells[col][:-1], "GB")
            except ValueError:
                continue
            epoch = int(m.group(1))
            sample = {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1, "step": epoch}
            if out and out[-1]["step"] == epoch:
                out[-1] = sample  # the bar redrawn within the epoch: its last drawing counts
            elif not out or epoch > out[-1]["step"]:
                out.append(sample)
    return out


# host memory a training loop prints beside its step ("host_rss=9.01GiB", "main_rss 6.2G workers_rss_total
# 49.2G", "RAM: 31.4 GB", "cpu_mem 12.1GiB"): what the process tree holds of the node's RAM
_RE_HOST_MEM = re.compile(
    r"(?<![\w])(\w{0,24}?(?:rss|host_?mem(?:ory)?|cpu_?mem(?:ory)?|ram)\w{0,24})\s{0,2}[=:]?\s{0,2}"
    r"(\d{1,7}(?:\.\d{1,4})?)\s?(GiB|MiB|GB|MB|G|M)(?![\w])",
    re.IGNORECASE,
)
_HOST_UNITS = {"G": "GIB", "M": "MIB"}
_HOST_MEM_WORDS = ("rss", "host", "cpu", "ram", "estart")  # one of which every line read above holds
MIN_HOST_SAMPLES = 6


def host_memory_samples(text: str) -> list[tuple[int, int, bool]]:
    """(step, bytes, training) of the host memory a log printed at its steps, oldest first: on a line with a
    step number, the sum of what it printed for the process and its workers (keys naming a peak or a maximum
    left out); a line without one is the next step in order. ``training`` tells a line that shows training
    progress from one printed while the job loaded its data or weights. The last attempt's only (after a
    restart)."""
    out: list[tuple[int, int, bool]] = []
    lines = text.split("\n")
    for i in lines_holding(lines, _HOST_MEM_WORDS):
        raw = lines[i]
        if "estart" in raw and _RE_RESTART.search(raw):
            out.clear()
            continue
        if not _RE_HOST_MEM.search(raw):
            continue
        content = _strip_line(raw).content
        total = 0
        for m in _RE_HOST_MEM.finditer(content):
            key = m.group(1).lower()
            if "max" in key or "peak" in key or "limit" in key or "total_ram" in key:
                continue
            unit = m.group(3).upper()
            total += parse_size(m.group(2), _HOST_UNITS.get(unit, unit))
        if not total:
            continue
        sm = _RE_STEP_NO.search(content)
        step = int(next(g for g in sm.groups() if g)) if sm else (out[-1][0] + 1 if out else 0)
        if out and step <= out[-1][0]:
            if step < out[-1][0]:
                out.clear()  # the count started again: a new attempt
            else:
                continue
        training = (sm is not None or _progress_past_start(content)) and not _RE_LOADING.search(content)
        out.append((step, total, training))
    return out


def _may_sample(line: str) -> bool:
    """Whether a line holds a word one of the sample patterns needs (cheap, before the patterns run)."""
    return (
        "lloc" in line
        or "mem" in line
        or "Mem" in line
        or "MEM" in line
        or "MA " in line
        or "A: " in line
        or "eserved" in line
        or any(k in line for k in _INTL_ALLOCATED)
        or any(k in line for k in _INTL_GENERIC)
        or any(k in line for k in _PEAK_ONLY_WORDS)
    )


def _sample_line(out: list[dict[str, int]], lines: list[str], i: int, raw: str, rank: int | None) -> None:
    """Add the sample line ``raw`` (of line ``i``) printed, if it is one, to ``out``."""
    ln = _strip_line(raw)
    if rank is not None and ln.g is not None and ln.g != rank:
        return
    content = ln.content
    if "out of memory" in content or "allocate " in content or "allocate=" in content:
        return
    sample = _sample_on(content)
    if sample is None:
        return
    step = None
    for j in range(i, max(-1, i - 4), -1):
        m = _RE_STEP_NO.search(content if j == i else _strip_line(lines[j]).content)
        if m:
            step = int(next(g for g in m.groups() if g))
            break
    # a count that starts again in a later epoch (a progress bar per epoch) goes on from where the last
    # epoch's ended: no new attempt
    e = _RE_EPOCH_NO.search(content)
    offset = out[-1].get("offset", 0) if out else 0
    if e is not None:
        sample["epoch"] = int(e.group(1))
        if (
            step is not None
            and out
            and out[-1].get("epoch", sample["epoch"]) < sample["epoch"]
            and step + offset <= out[-1]["step"]
        ):
            offset = out[-1]["step"] + 1 - step
    elif out and "epoch" in out[-1]:
        sample["epoch"] = out[-1]["epoch"]
    sample["offset"] = offset
    sizes = _printed_sizes(content)
    if sizes:
        sample["sizes"] = sizes  # type: ignore[assignment]  # the input's sizes printed beside it
    if step is not None:
        step += offset
    if step is not None and j == i and out and step == out[-1]["step"]:
        # the same step printed again, by another rank (ranks without a prefix) or another logger:
        # one sample, the largest (the rank nearest its limit)
        last = out[-1]
        last["allocated_bytes"] = max(last["allocated_bytes"], sample["allocated_bytes"])
        last["peak_allocated_bytes"] = max(last["peak_allocated_bytes"], sample["peak_allocated_bytes"])
        return
    if (
        step is not None
        and j == i
        and out
        and step < out[-1]["step"]
        and sample["allocated_bytes"]
        <= RESTART_LEVEL * out[0]["allocated_bytes"]
        < max(s["allocated_bytes"] for s in out)
    ):
        # the count started again and live memory is back where the first sample was: a new attempt (a
        # container restarted, a job requeued), whose samples are the ones that count
        out.clear()
    if step is None or (out and step <= out[-1]["step"]):
        step = out[-1]["step"] + 1 if out else 0  # unnumbered or repeated: in the order printed
    sample["step"] = step
    out.append(sample)


def _short_size(value: str, unit: str) -> int:
    """Bytes of ``value`` printed in ``unit``, where a bare "G" or "M" is GiB or MiB."""
    return parse_size(value, _SHORT_UNITS.get(unit.upper(), unit))


def _printed_sizes(content: str) -> dict[str, int]:
    """The input sizes a line prints (``seq_len=4096 bs=8``), by key in lower case."""
    return {m.group(1).lower(): int(m.group(2)) for m in _RE_SIZE_KEY.finditer(content)}


def _sample_on(content: str) -> dict[str, int] | None:
    if "allocated_bytes." in content:
        # torch.cuda.memory_stats() printed (a dict, or an OrderedDict of pairs): only the whole device's
        # current and peak count ("…_pool" and the cumulative "allocated"/"freed" counters are not live memory)
        stats = {k: int(v) for k, v in _RE_STATS_KEY.findall(content)}
        if "current" in stats:
            top = max(stats["current"], stats.get("peak", 0))
            return {"allocated_bytes": stats["current"], "peak_allocated_bytes": top}
        if _RE_STATS_CUMULATIVE.search(content):
            return None  # only the cumulative counters: bytes allocated over the run, not live memory
    if content.lstrip().startswith("| Allocated memory"):
        # torch.cuda.memory_summary()'s row: current and peak usage, then the cumulative totals
        row = _RE_SUMMARY_ROW.match(content.lstrip())
        if row is None:
            return None
        cur = parse_size(row.group(1), row.group(2))
        most = parse_size(row.group(3), row.group(4))
        return {"allocated_bytes": cur, "peak_allocated_bytes": max(cur, most)}
    m = _RE_DS_MA.search(content)
    if m:
        return {
            "allocated_bytes": parse_size(m.group(1), "GiB"),
            "peak_allocated_bytes": parse_size(m.group(2), "GiB"),
        }
    current: int | None = None
    peak: int | None = None
    header = _RE_HEADER_UNIT.search(content) if "(" in content else None
    for m in _RE_ALLOCATED.finditer(content):
        # printed after the number, named in the key ("…_allocated_gb=4.42"), or once for the whole line
        unit = m.group(4) or m.group(2) or (_HEADER_UNITS[header.group(1)] if header is not None else None)
        if unit is None:
            value = float(m.group(3))
            if value < MIN_SIZED_BYTES:
                continue
            size = int(value)
        else:
            if unit == "GB" and m.group(1) in _DS_TIMER_KEYS:
                unit = "GiB"  # DeepSpeed's timer divides by 1024**3 and prints GB
            size = _short_size(m.group(3), unit)
        if _RE_PEAK_WORD.search(m.group(1)) or _RE_PEAK_BEFORE.search(
            content, max(0, m.start() - 12), m.start()
        ):
            peak = peak if peak is not None else size
        elif current is None:
            current = size
    if current is not None and peak is None and (m := _RE_BARE_PEAK.search(content)) is not None:
        # a bare "peak=12.0GiB" beside the allocated reading ("alloc_idle=3.12GiB peak=11.96GiB"): its peak
        peak = _short_size(m.group(1), m.group(2))
    if current is None and (m := _RE_INTL_ALLOCATED.search(content)) is not None:
        current = parse_size(m.group(1), _INTL_UNITS.get(m.group(2), m.group(2)))
        p = _RE_INTL_PEAK.search(content)
        if p is not None and peak is None:
            peak = parse_size(p.group(1), _INTL_UNITS.get(p.group(2), p.group(2)))
    if current is None and (m := _RE_INTL_GENERIC.search(content)) is not None:
        size = parse_size(m.group(1), _INTL_UNITS.get(m.group(2), m.group(2)))
        return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1}
    if current is None and peak is not None:
        # the peak alone under a key that names allocated memory ("max_mem_alloc 58.1G")
        return {"allocated_bytes": peak, "peak_allocated_bytes": peak, "peak_only": 1}
    if current is None and (m := _RE_PEAK_ONLY.search(content)) is not None:
        if m.group(1):
            return _reserved_alone(content)  # the peak of the reservation (or the device's usage)
        unit = m.group(3)
        value = float(m.group(2))
        if unit is None and value >= MIN_SIZED_BYTES:
            size = int(value)
        else:  # unitless and small: MiB, as torchvision's MetricLogger prints it
            size = parse_size(m.group(2), _SHORT_UNITS.get((unit or "M").upper(), unit or "MiB"))
        return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1}
    if current is None and ("A: " in content or "active/reserved" in content):
        ui = _RE_WEBUI_PEAK.search(content)
        if ui is not None:
            # Stable Diffusion web UI's memory monitor: each generation's peak of active memory (its peaks are
            # reset as a generation starts), "A: 3.41 GB, R: 4.02 GB" (GiB) or "Torch active/reserved: 4057/4612 MiB"
            size = parse_size(ui.group(1), "GiB") if ui.group(1) else int(ui.group(2)) * MiB
            return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1}
    if current is None and "memory: " in content and _RE_MM_ITER.search(content):
        mm = _RE_MM_MEMORY.search(content)
        if mm is not None:
            # OpenMMLab's logger: torch.cuda.max_memory_allocated() in MiB, its peak reset every log interval
            size = int(mm.group(1)) * MiB
            return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1}
    if current is None and "after" in content and (aft := _RE_AFTER_PEAK.search(content)) is not None:
        # "peak_cuda=5.54GiB after=4.71GiB": the step's peak and what it left behind
        top = _short_size(aft.group(1), aft.group(2))
        current = _short_size(aft.group(3), aft.group(4))
        peak = max(peak or 0, top)
    if current is None and "cuda:" in content and (each := _RE_PER_DEVICE.findall(content)):
        # one reading per device on the line ("memory_allocated cuda:0 9.49G cuda:1 3.28G"): the fullest
        # device's, the one nearest its limit (DataParallel gathers on its first)
        current = max(_short_size(v, u) for v, u in each)
    if current is None and (m := _RE_ALLOC_PAIR.search(content)) is not None:
        current = _short_size(m.group(1), m.group(2))
    if current is None and (m := _RE_SIZE_ALLOCATED.search(content)) is not None:
        current = _short_size(m.group(1), m.group(2))
    if current is None and (m := _RE_GENERIC_MEM.search(content)) is not None:
        unit = m.group(4) or m.group(2)
        if unit is None or _RE_NOT_LIVE.search(content, max(0, m.start() - 12), m.start()):
            # a bare number, or the reservation's, the host's or the device's free memory
            return _reserved_alone(content)
        size = _short_size(m.group(3), unit)
        return {"allocated_bytes": size, "peak_allocated_bytes": size, "peak_only": 1}
    if current is None:
        return _reserved_alone(content)
    return {"allocated_bytes": current, "peak_allocated_bytes": max(current, peak or 0)}


def _key(m: OomMessage) -> tuple[object, ...]:
    """What makes two occurrences the same message (the data, not the wrapping of the text)."""
    extra = tuple(sorted((k, v) for k, v in m.extra.items() if k != "local_rank"))
    if m.kind == CUDA_OOM:
        procs = tuple((p.pid, p.used_bytes, p.this_process) for p in m.processes)
        return (
            m.kind,
            m.format,
            m.device_index,
            m.requested_bytes,
            m.total_bytes,
            m.free_bytes,
            m.allocated_bytes,
            m.reserved_bytes,
            m.reserved_unallocated_bytes,
            m.private_pool_bytes,
            m.allowed_bytes,
            m.cached_bytes,
            m.fraction_rejected,
            procs,
            m.vgpu_used_bytes,
            m.vgpu_limit_bytes,
            extra,
        )
    pid_like = tuple(m.extra.get(k) for k in ("pid", "path", "process", "step"))
    return (m.kind, m.format, m.worker_pid, m.requested_bytes, pid_like)


_RE_SUMMARY_RANK = re.compile(r"(?<![\w])rank\s{0,20}: (\d{1,7}) \(local_rank: (\d{1,7})\)")
_RE_SUMMARY_HEAD = re.compile(r"^\s{0,8}\[\d{1,7}\]:\s*$")
_RE_RULE = re.compile(r"(?:={20,}|-{20,})\s*$")
_RE_RESTART = re.compile(r"will restart worker group|[Rr]estarting worker group|Restarting workers")


# A frame of model setup in a traceback: moving the model to the device, wrapping it for data parallel,
# loading weights. An OOM under one of these, with no training progress printed before it, came before
# the first step.
_RE_SETUP_FRAME = re.compile(
    r'File "[^"]{0,300}?(?:'
    r'nn/parallel/distributed\.py", line \d+, in __init__'
    r'|fully_sharded_data_parallel\.py", line \d+, in __init__'
    r'|nn/modules/module\.py", line \d+, in (?:_apply|to|cuda)'
    r'|deepspeed/__init__\.py", line \d+, in initialize'
    r'|accelerate/accelerator\.py", line \d+, in prepare(?:_model)?'
    r'|", line \d+, in (?:from_pretrained|load_state_dict)'
    # a checkpoint deserialised straight onto the device (torch serialization with map_location="cuda",
    # safetensors' load_file)
    r'|torch/serialization\.py", line \d+, in load'
    r'|safetensors/torch\.py", line \d+, in load_file'
    # an inference server sizing itself before it serves: vLLM's profiling, warm-up and graph capture
    r'|vllm/[^"]{1,200}", line \d+, in (?:profile_run|_dummy_run|_dummy_sampler_run|determine_num_available_blocks'
    r"|determine_available_memory|capture_model|compile_or_warm_up_model|_initialize_kv_caches)"
    # TGI's warm-up: the largest prefill its flags allow, run once before it serves
    r'|text_generation_server/[^"]{1,200}", line \d+, in [Ww]armup'
    # torch.compile's first call: Inductor benchmarking kernel choices on example buffers (max-autotune)
    r'|torch/_inductor/select_algorithm\.py", line \d+, in \w+'
    r")\b"
)
# a model server's words, on the OOM's own line, that it failed while loading a model (Triton's model
# repository: "failed to load model 'x': CUDA out of memory", its Python backend's stub initialising a model)
_RE_LOAD_FAILED = re.compile(r"failed to load model '[^'\n]{1,200}'|Failed to initialize Python stub")
# an inference server's own words, after the error, that it died while starting (loading and sizing itself)
_RE_START_FAILED = re.compile(
    r"Shard \d{1,4} failed to start|ShardCannotStart|Engine core initialization failed"
)
_START_LOOKAHEAD = 40  # lines after an OOM searched for the server's word that it failed to start
_RE_TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\)")
# progress that is not training: loading or fetching the model ("Loading checkpoint shards: 2/6 [00:42…",
# "[mem] after shard 2/6: …")
_RE_LOADING = re.compile(
    r"(?<![\w])(?:load(?:ing|ed)?|download(?:ing|ed)?|fetch(?:ing|ed)?|shards?)(?![\w])", re.I
)
# the bars of preparing the data, not of training: HF datasets' map/filter/tokenize passes, split
# generation, hub downloads (a finished one says nothing about the first training step)
_RE_DATA_BAR = re.compile(
    r"(?<![\w])(?:Running tokenizer|Tokeniz(?:ing|e)|Map(?: \(num_proc=\d{1,4}\))?:|Filter(?: \(num_proc=\d{1,4}\))?:"
    r"|Generating \w{1,20} split|Resolving data files|Grouping texts|Packing|Preprocessing"
    r"|Scanning|Caching images|Extracting|Indexing|Building (?:the )?(?:dataset|index|vocab)"
    r"|Sanity Checking"  # (Lightning's validation batches before training: run without gradients, freed)
    # a hub download's bar, named after its file ("generation_config.json: 100%|…| 234/234")
    r"|[\w.-]{1,120}\.(?:json|safetensors|bin|model|txt|pt|pth|ckpt|gguf|msgpack|h5|onnx|tiktoken|jinja|py)"
    r"\s{0,2}:\s{0,4}\d{1,3}%)",
    re.I,
)
# the HF Trainer's banner as training begins: bars before it were the setup's
_RE_TRAINING_BANNER = re.compile(
    r"\*{3,} Running training \*{3,}|Starting training for \d{1,6} epochs|^\s{0,8}Epoch\s{1,8}GPU_mem\s"
)  # (the HF Trainer's, Ultralytics' line and its table header)
_SETUP_LOOKBACK = 400  # lines above an OOM searched for its traceback
_PIN_LOOKBACK = 6  # lines above a CUDA error searched for the pinning frame it was raised in
_SEMAPHORE_LOOKBACK = 12  # lines above an ENOSPC searched for the semaphore its traceback was creating


def setup_frame(text: str, line_no: int | None, rank: int | None = None) -> str | None:
    """The model-setup frame (``distributed.py in __init__`` …) in the traceback that ends at line
    ``line_no`` (1-based) of ``rank`` (or of unprefixed lines), or an inference server's word just after it
    that it failed to start (TGI's ``Shard 0 failed to start``), when no training progress was printed
    before it; else None."""
    if line_no is None:
        return None
    lines = text.split("\n")
    found: str | None = None
    if 0 < line_no <= len(lines) and (lf := _RE_LOAD_FAILED.search(lines[line_no - 1])) is not None:
        found = lf.group(0)
    i = min(line_no, len(lines)) - 2
    stop = max(-1, line_no - 2 - _SETUP_LOOKBACK)
    while i > stop:
        ln = _strip_line(lines[i])
        if rank is None or ln.g is None or ln.g == rank:
            if found is None:
                m = _RE_SETUP_FRAME.search(ln.content)
                if m:
                    found = m.group(0).rsplit("/", 1)[-1].replace('", line ', ":").replace(", in ", " in ")
            if _RE_TRACEBACK_HEAD.search(ln.content):
                break
        i -= 1
    if found is None:
        for raw in lines[line_no : line_no + _START_LOOKAHEAD]:
            m = _RE_START_FAILED.search(raw)
            if m:
                found = m.group(0)
                break
    if found is None:
        return None
    for raw in lines[: max(0, i)]:
        ln = _strip_line(raw)
        if (
            (rank is None or ln.g is None or ln.g == rank)
            and _RE_PROGRESS.search(ln.content)
            and not _RE_LOADING.search(ln.content)
        ):
            return None
    return found


_RE_BAR = re.compile(r"(?<![\w/])(\d{1,9})/(\d{1,9}) \[\d")
_RE_EPOCH_NO = re.compile(r"(?<![\w])epoch(?![\w])\s{0,3}[:=#]?\s{0,3}(\d{1,9})", re.IGNORECASE)


def _progress_past_start(content: str) -> bool:
    """A line that shows training progress, other than the first epoch's number on its own ("Epoch 0:", or
    "Epoch 1/20" counted from one: what a bar's description or a banner prints as the epoch begins, no step
    has finished yet)."""
    for m in _RE_PROGRESS.finditer(content):
        e = _RE_EPOCH_NO.match(content, m.start())
        # the first epoch: "Epoch 0", or "Epoch 1/20" counted from one
        first = e is not None and (
            e.group(1) == "0" or (e.group(1) == "1" and content[e.end() : e.end() + 1] == "/")
        )
        if not first:
            return True
    return False


def _traceback_head(text: str, line_no: int) -> tuple[list[str], int, int]:
    """(lines of ``text``, index of the ``Traceback`` line above line ``line_no`` (1-based) or of the
    last line searched, the index the search stopped above): ``_SETUP_LOOKBACK`` lines up at most."""
    lines = text.split("\n")
    i = min(line_no, len(lines)) - 2
    stop = max(-1, line_no - 2 - _SETUP_LOOKBACK)
    while i > stop and not _RE_TRACEBACK_HEAD.search(lines[i]):
        i -= 1
    return lines, i, stop


def first_step_bar(text: str, line_no: int | None) -> str | None:
    """The progress bar the log showed before the traceback that ends at line ``line_no`` (1-based), when
    it still read ``0/N`` and nothing printed before it showed any progress: the first step had not
    finished (a bar redraws as soon as a step ends). Returns the bar's ``0/N`` (or ``step 0`` when the
    loop's own lines name step 0 as the one it is in); else None."""
    if line_no is None:
        return None
    lines, i, stop = _traceback_head(text, line_no)
    if i <= stop:
        # no traceback above the message: one printed before its traceback (ComfyUI's "!!! Exception during
        # processing !!!" line), or with none
        i = min(line_no, len(lines)) - 1
    before = lines[: max(0, i)]
    if i >= 0 and (head := _RE_TRACEBACK_HEAD.search(lines[i])) and head.start() > 0:
        # the bar the traceback was printed on ("0/9375 [00:00<?, ?it/s]Traceback …")
        before.append(lines[i][: head.start()])
    # the bars before the trainer's banner were the setup's
    banner = next((k for k in range(len(before) - 1, -1, -1) if _RE_TRAINING_BANNER.search(before[k])), -1)
    bar: str | None = None
    # every rank's lines count: the ranks of one job step together (each step's collectives wait for all),
    # and often rank 0 alone draws the bar
    for raw in before[banner + 1 :]:
        for part in raw.split("\r") if "\r" in raw else (raw,):
            if _RE_DATA_BAR.search(part) or _RE_LOADING.search(part):
                continue  # preparing the data or loading the weights, not a training step
            m = _RE_BAR.search(part)
            e = _RE_EPOCH_NO.search(part)
            if (
                m is not None
                and int(m.group(1)) == 0
                and int(m.group(2)) > 0
                and (e is None or e.group(1) == "0")
            ):
                bar = f"0/{m.group(2)}"
                continue
            content = _strip_line(part).content
            if m is None and _first_step_line(content):
                bar = bar or "step 0"  # the loop names step 0 as the one it is in ("step 0 after forward")
            elif m is not None or _progress_past_start(content):
                return None
    return bar


_RE_STEP_WORD_NO = re.compile(
    r"(?<![\w])(?<![A-Za-z]/)(?:global_step|step|iter(?:ation)?)(?![\w])[\s:=#\[]{0,4}(\d{1,9})", re.I
)


def _first_step_line(content: str) -> bool:
    """A line that names step 0 and no other step, in the first epoch at most: what a loop prints within
    its first step ("[mem] step 0 after backward", "step 0: batch 16 x 4096")."""
    steps = _RE_STEP_WORD_NO.findall(content)
    if not steps or any(n != "0" for n in steps):
        return False
    e = _RE_EPOCH_NO.search(content)
    return e is None or e.group(1) in ("0", "1")


# a log's word that the input grew (a curriculum's schedule, progressive resizing, a batch-size ramp):
# "seq_len 2048 -> 4096", "batch size from 32 to 64", "image_size: 224 => 384"
_RE_SIZE_CHANGE = re.compile(
    r"(?<![\w])(seq(?:uence)?[_ ]?len(?:gth)?|max[_ ](?:seq[_ ])?len(?:gth)?|context[_ ]len(?:gth)?"
    r"|batch[_ ]?size|micro[_ ]batch(?:[_ ]size)?|image[_ ]size|img[_ ]size|resolution|crop[_ ]size"
    r"|num[_ ]frames)(?![\w])[^\d\n]{0,16}?(\d{1,7})\s{0,3}(?:->|→|=>|to)\s{0,3}(\d{1,7})(?![\w.])",
    re.IGNORECASE,
)


def size_change_before(
    text: str, line_no: int | None, rank: int | None = None
) -> tuple[str, int, int] | None:
    """(what, from, to) when the log says the input grew (``seq_len 2048 -> 4096``) after the job had shown
    progress and before the traceback that ends at line ``line_no`` (1-based), with no progress printed
    after it: the first step at the larger size is the one that failed."""
    if line_no is None:
        return None
    lines, i, stop = _traceback_head(text, line_no)
    printed = _size_printed_before(lines, i, stop, rank)
    if printed is not None:
        return printed
    for k in range(i - 1, stop, -1):
        ln = _strip_line(lines[k])
        if rank is not None and ln.g is not None and ln.g != rank:
            continue
        m = _RE_SIZE_CHANGE.search(ln.content)
        if m is not None and int(m.group(3)) > int(m.group(2)) > 0:
            before = (_strip_line(x).content for x in lines[max(0, k - _SETUP_LOOKBACK) : k])
            if any(_progress_past_start(c) for c in before):
                return m.group(1), int(m.group(2)), int(m.group(3))
            return None
        if _progress_past_start(ln.content):
            return None  # a step ran after the last change (or none was printed): not the first at its size
    return None


# a size the loop prints beside its steps ("seq_len=4096", "image_size: 384", "bs=8")
_RE_SIZE_KEY = re.compile(
    r"(?<![\w.])(seq(?:uence)?_?len(?:gth)?|max_(?:seq_)?len|context_len(?:gth)?|img_?size|image_size|resolution"
    r"|num_frames|batch_size|micro_batch_size|bs|size|res)(?:\s{0,2}[=:]\s{0,2}| )(\d{1,7})(?![\w.])"
    r"(?!\s{0,2}(?:[KMGT]i?B|bytes|[KMG]\b))",  # a bare "size" is an input's, not a byte count's
    re.IGNORECASE,
)


def _size_printed_before(
    lines: list[str], i: int, stop: int, rank: int | None
) -> tuple[str, int, int] | None:
    """(what, from, to) when the last line before the traceback at line index ``i`` prints a size
    (``[8001] seq_len=8192 bs=8``) larger than the same key had on the loop's earlier lines, and nothing
    after it reports a finished step (a loss or a memory reading): the first step at the larger size."""
    latest: tuple[int, str, int] | None = None
    for k in range(i - 1, stop, -1):
        ln = _strip_line(lines[k])
        if rank is not None and ln.g is not None and ln.g != rank:
            continue
        sizes = _printed_sizes(ln.content)
        if latest is None:
            if not ln.content.strip():
                continue
            if not sizes or "loss" in ln.content.lower() or _sample_on(ln.content) is not None:
                return None  # the last line before the failure finished a step, or says no size
            key = next(iter(sizes))
            latest = (k, key, sizes[key])
            continue
        _, key, new = latest
        if key in sizes:
            return (key, sizes[key], new) if sizes[key] < new else None
    return None


def restart_offsets(text: str) -> list[int]:
    """Offsets in ``text`` where a launcher restarts its worker group (a new attempt begins)."""
    return [m.start() for m in _RE_RESTART.finditer(text)]


def lines_holding(lines: Sequence[str], words: Sequence[str]) -> list[int]:
    """Indices of the ``lines`` that hold one of ``words`` (lower case; matched ignoring case), in order:
    found at C speed in the whole text, so a slower pattern needs to run on those lines only."""
    whole = "\n".join(lines)
    low = whole.lower()
    if len(low) != len(whole):  # a character whose lower case is longer ("İ"): offsets would drift
        return list(range(len(lines)))
    starts = list(itertools.accumulate((len(ln) + 1 for ln in lines), initial=0))
    hot: set[int] = set()
    for w in words:
        i = low.find(w)
        while i >= 0:
            k = bisect_right(starts, i) - 1
            hot.add(k)
            i = low.find(w, starts[k + 1])
    return sorted(hot)


class _Parser:
    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self._cache: dict[int, _Line] = {}

    def _semaphore_before(self, i: int) -> bool:
        """Whether the traceback above line ``i`` was creating a multiprocessing semaphore (``SemLock``)."""
        return any("SemLock" in self.lines[j] for j in range(max(0, i - _SEMAPHORE_LOOKBACK), i))

    def line(self, i: int) -> _Line:
        got = self._cache.get(i)
        if got is None:
            got = _strip_line(self.lines[i])
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[i] = got
        return got

    def run(self) -> list[OomMessage]:
        hot = set(lines_holding(self.lines, _TRIGGER_WORDS))  # the trigger pattern runs on these only
        found: list[_Found] = []
        killed: list[_Found] = []
        host_lines: set[int] = set()
        consumed: set[int] = set()
        restarts: list[int] = []
        ctx: tuple[int, int] | None = None  # torchrun error summary entry: (rank, local_rank)
        for i, raw in enumerate(self.lines):
            if "rank" in raw and "local_rank" in raw:
                s = _RE_SUMMARY_RANK.search(raw)
                if s:
                    ctx = (int(s.group(1)), int(s.group(2)))
            elif (("====" in raw or "----" in raw) and _RE_RULE.search(raw)) or (
                "]:" in raw and _RE_SUMMARY_HEAD.match(raw)
            ):
                ctx = None
            if "estart" in raw and _RE_RESTART.search(raw):
                restarts.append(i)
            if i in consumed or i not in hot or not _TRIGGER.search(raw):
                continue
            ln = self.line(i)
            hits = _detect(ln.content)
            if not hits and "[Errno 28]" in raw and self._semaphore_before(i):
                # a multiprocessing semaphore (a DataLoader worker's queue) lives in /dev/shm
                at = ln.content.find("[Errno 28]")
                msg = OomMessage(
                    SHM_EXHAUSTED, "shm-no-space", "", extra={"errno": "28", "path": "a semaphore"}
                )
                hits = [_Hit(_error_start(ln.content, at), msg)]
            for k, hit in enumerate(hits):
                if hit.msg.format == "cuda-error" and self._pinning_before(i):
                    hit.msg = OomMessage(HOST_OOM, "host-pinned", "", extra=hit.msg.extra)
                msg = hit.msg
                msg.line_no = i + 1
                content = ln.content
                end = len(content) if hit.end < 0 else hit.end
                if hit.torch:
                    later = [h.start for h in hits[k + 1 :] if h.start > hit.start]
                    end = min([end, *later])
                    text = content[hit.start : end]
                    if not later:
                        text = self._continue(i, ln, text, consumed)
                    text = _trim_torch(text[:MAX_TEXT])
                    _fill_torch(msg, text)
                else:
                    text = content[hit.start : end].strip()[:MAX_TEXT]
                    if msg.format == "async":
                        text = self._continue_async(i, ln, text, consumed)
                        _fill_async(msg, text)
                    elif "\\n" in text and '\\"' in content:
                        # a JSON log record: the message ends where its escaped newline does
                        text = text.split("\\n", 1)[0]
                msg.text = text
                if msg.exception_type is None:
                    msg.exception_type = _exc_before(content, hit.start)
                if msg.exception_type is None and hit.start > 0:  # "RuntimeError: step 3 failed: CUDA out…"
                    e = _RE_EXC_LINE.match(content)
                    msg.exception_type = e.group(1) if e and e.end() <= hit.start else None
                g, lr = ln.g, ln.lr
                if g is None and lr is None:
                    if hit.g is not None or hit.lr is not None:
                        g, lr = hit.g, hit.lr
                    elif ctx is not None:
                        g, lr = ctx
                    else:
                        w = _last(_RE_RANK_WORD, content[max(0, hit.start - 200) : hit.start])
                        if w is not None:
                            g = int(w.group(1))
                if msg.kind != CUDA_OOM and self._ignored(i):
                    msg.extra["ignored"] = "true"
                f = _Found(msg, g, lr, i, hit.start, i)
                if msg.kind == HOST_OOM:
                    host_lines.add(i)
                if hit.killed_alone:
                    killed.append(f)
                else:
                    found.append(f)
        if killed:
            found.extend(self._killed_at_end(killed, host_lines))
            found.sort(key=lambda f: (f.line, f.col))
        found = _dedupe(found, restarts)
        found = _merge_host(found)
        _attach_vgpu(found)
        out: list[OomMessage] = []
        for f in found:
            f.msg.rank = f.g if f.g is not None else f.lr
            if f.lr is not None:
                f.msg.extra["local_rank"] = str(f.lr)
            out.append(f.msg)
        return out

    def _pinning_before(self, i: int) -> bool:
        """Whether the traceback that ends at line ``i`` was pinning host memory: its innermost frames (or
        the DataLoader's note that the error came from its pin memory thread) say ``pin_memory``."""
        for j in range(i - 1, max(-1, i - _PIN_LOOKBACK), -1):
            c = self.line(j).content
            if "pin_memory" in c or "pin memory thread" in c:
                return True
            if _RE_TRACEBACK_HEAD.search(c) and "Original Traceback" not in c:
                return False
        return False

    def _ignored(self, i: int) -> bool:
        """Line ``i`` ends a traceback that Python printed under "Exception ignored in: …" (an exception
        raised in ``__del__`` or at interpreter exit, which ended nothing: a DataLoader's workers dying
        while the process shuts down)."""
        for j in range(i - 1, max(-1, i - _MAX_CONT_SKIP), -1):
            c = self.line(j).content
            if c.startswith("Exception ignored in"):
                return True
            if not (c.startswith(("Traceback (most recent call last)", " ", "\t")) or not c.strip()):
                return False
        return False

    def _continue(self, i: int, first: _Line, text: str, consumed: set[int]) -> str:
        """Append the following lines of the same stream while the message is not complete."""
        if _core_complete(text) and not _needs_hint(text):
            nxt = self._next_same(i, first)
            if nxt is None or not nxt[1].lstrip().startswith("If reserved"):
                return text
        deco_m = _DECO.match(first.content)
        deco = deco_m.group(0).strip() if deco_m else ""
        j, added = i, 0
        while added < _MAX_CONT_LINES and len(text) < MAX_TEXT:
            nxt = self._next_same(j, first)
            if nxt is None:
                break
            j, piece = nxt
            dm = _DECO.match(piece) if deco else None
            if dm is not None and dm.group(0).strip() == deco:
                piece = piece[dm.end() :]
            if not piece.strip() or _RE_NEW_RECORD.match(piece.lstrip()) or _detect(piece):
                break
            done = _core_complete(text) and not _needs_hint(text)
            if done and not piece.lstrip().startswith("If reserved"):
                break
            text = _join(text, piece)
            consumed.add(j)
            added += 1
            if _core_complete(text) and not _needs_hint(text) and "If reserved" in text:
                break
        return text

    def _continue_async(self, i: int, first: _Line, text: str, consumed: set[int]) -> str:
        """Append the ``key : size`` lines the cudaMallocAsync backend prints under its first line."""
        j = i
        for _ in range(_ASYNC_LINES):
            nxt = self._next_same(j, first)
            if nxt is None:
                break
            piece = nxt[1]
            if not (_RE_ASYNC_FIGURE.match(piece) or _RE_ASYNC_LIMIT_HEAD.match(piece)):
                break
            j = nxt[0]
            text += "\n" + piece.strip()
            consumed.add(j)
        return text

    def _next_same(self, i: int, first: _Line) -> tuple[int, str] | None:
        """The next line after ``i`` from the same stream (same prefixes), skipping other ranks' lines."""
        for j in range(i + 1, min(len(self.lines), i + 1 + _MAX_CONT_SKIP)):
            ln = self.line(j)
            if ln.g != first.g or ln.lr != first.lr:
                continue
            # same prefixes, or the same without the timestamps (a record whose text was wrapped later)
            if ln.sig == first.sig or ln.sig == tuple(k for k in first.sig if k != "ts"):
                return j, ln.content
        return None

    def _killed_at_end(self, killed: list[_Found], host_lines: set[int]) -> list[_Found]:
        """Keep the "Killed" lines after which only blank or host-OOM lines follow."""
        j = len(self.lines) - 1
        while j >= 0:
            if j in host_lines or not self.line(j).content.strip():
                j -= 1
                continue
            break
        return [f for f in killed if f.line > j]


def _dedupe(found: list[_Found], restarts: list[int]) -> list[_Found]:
    """Merge repeated occurrences (see the module docstring). Indexed by rank so that a log with many
    ranks printing the same text stays linear."""
    kept: list[_Found] = []
    by_g: dict[tuple[object, ...], list[_Found]] = {}
    by_l: dict[tuple[object, ...], list[_Found]] = {}
    anon: dict[tuple[object, ...], list[_Found]] = {}  # occurrences without any rank
    latest: dict[tuple[object, ...], _Found] = {}  # the last kept occurrence of each message, any rank
    r = 0
    for f in found:
        while r < len(restarts) and restarts[r] < f.line:
            by_g.clear()
            by_l.clear()
            anon.clear()
            latest.clear()
            r += 1
        key = _key(f.msg)
        if f.g is None and f.lr is None:
            last = latest.get(key)
            cands = [last] if last is not None else []
        else:
            cands = [*by_g.get((key, f.g), ()), *by_l.get((key, f.lr), ()), *anon.get(key, ())]
        dup = next(
            (k for k in cands if f.line - k.last_line <= DEDUPE_WINDOW_LINES and _compatible(k, f)),
            None,
        )
        if dup is None:
            kept.append(f)
            dup = f
        else:
            _fill(dup.msg, f.msg)
            if dup.g is None and dup.lr is None:
                dup.g, dup.lr = f.g, f.lr
            else:
                dup.g = dup.g if dup.g is not None else f.g
                dup.lr = dup.lr if dup.lr is not None else f.lr
            dup.last_line = f.line
        latest[key] = dup
        for index, ident in ((by_g, dup.g), (by_l, dup.lr)):
            if ident is not None:
                _remember(index, (key, ident), dup, f.line)
        if dup.g is None and dup.lr is None:
            _remember(anon, key, dup, f.line)
    return kept


def _remember(
    index: dict[tuple[object, ...], list[_Found]], k: tuple[object, ...], f: _Found, now: int
) -> None:
    """Add ``f`` under ``k`` once, dropping entries that fell out of the dedupe window."""
    lst = [x for x in index.get(k, ()) if now - x.last_line <= DEDUPE_WINDOW_LINES and x is not f]
    lst.append(f)
    index[k] = lst


def _merge_host(found: list[_Found]) -> list[_Found]:
    """Fold an exit-137/SIGKILL line into a nearby OOMKilled/kernel/Killed line of the same event."""
    strong = [f for f in found if f.msg.format in _HOST_STRONG]
    if not strong:
        return found
    lines = [s.line for s in strong]  # found is in line order
    out: list[_Found] = []
    for f in found:
        if f.msg.format in _HOST_WEAK:
            lo = bisect_left(lines, f.line - HOST_MERGE_LINES)
            hi = bisect_right(lines, f.line + HOST_MERGE_LINES)
            near = [s for s in strong[lo:hi][:64] if _same_event(s, f)]
            if near:
                best = min(near, key=lambda s: abs(s.line - f.line))
                _fill(best.msg, f.msg)
                continue
        out.append(f)
    return out


def _same_event(a: _Found, b: _Found) -> bool:
    """Two host lines of one event: the same stream (same rank prefixes) and no conflicting pid."""
    pa, pb = a.msg.extra.get("pid"), b.msg.extra.get("pid")
    return (a.g, a.lr) == (b.g, b.lr) and (pa is None or pb is None or pa == pb)


def _attach_vgpu(found: list[_Found]) -> None:
    """Give a torch CUDA OOM the numbers of the vGPU layer line that preceded it (same rank)."""
    last: list[_Found] = []
    for f in found:
        m = f.msg
        if m.format == "vgpu":
            last.append(f)
            continue
        if m.kind != CUDA_OOM or m.vgpu_limit_bytes is not None:
            continue
        if m.format not in _TORCH_FORMATS and m.format != "cuda-error":
            continue
        for v in reversed(last):
            if f.line - v.line > VGPU_ATTACH_LINES:
                break
            if _compatible(v, f):
                m.vgpu_used_bytes = v.msg.vgpu_used_bytes
                m.vgpu_limit_bytes = v.msg.vgpu_limit_bytes
                break


# nvidia-smi's process table ("|    0   N/A  N/A   2219903      C   /usr/bin/python   14838MiB |", before R450
# without the GI/CI columns) and its CSV (--query-compute-apps=pid[,process_name],used_memory, with or
# without its header: "1773302, tritonserver, 80904 MiB")
_RE_SMI_ROW = re.compile(
    r"^\|\s{1,8}(\d{1,3})\s+(?:(?:N/A|\d{1,3})\s+(?:N/A|\d{1,3})\s+)?(\d{1,9})\s+(?:C\+G|M\+C|C|G|M)\s+"
    r"(\S[^|]{0,200}?)\s+(\d{1,9})MiB\s*\|\s*$"
)
_RE_SMI_CSV = re.compile(r"^\s{0,4}(\d{1,9}),\s{1,4}(?:([^,\n]{1,200}),\s{1,4})?(\d{1,9}) MiB\s*$")
_SMI_WORDS = ("mib",)  # one of which every line either pattern matches holds


@dataclass(slots=True)
class SmiProcess:
    """One process nvidia-smi listed in a log: the GPU (the row's index; None in a CSV), its pid, name and
    memory in use, and the (1-based) line it was printed on."""

    gpu: int | None
    pid: int
    name: str
    used_bytes: int
    line_no: int


def smi_listing(text: str) -> list[SmiProcess]:
    """The last process listing nvidia-smi printed in ``text``: its rows, consecutive lines apart from the
    table's borders. A CSV counts only in a log that asked for it
    (``--query-compute-apps``): a bare "pid, N MiB" line is not known to be nvidia-smi's."""
    lines = text.split("\n")
    csv_ok = "query-compute-apps" in text
    run: list[SmiProcess] = []
    prev = -10
    for i in lines_holding(lines, _SMI_WORDS):
        content = _strip_line(lines[i]).content.strip()
        m = _RE_SMI_ROW.match(content)
        row: SmiProcess | None = None
        if m is not None:
            row = SmiProcess(
                int(m.group(1)), int(m.group(2)), m.group(3).strip(), int(m.group(4)) * MiB, i + 1
            )
        elif csv_ok and (c := _RE_SMI_CSV.match(content)) is not None:
            row = SmiProcess(None, int(c.group(1)), (c.group(2) or "").strip(), int(c.group(3)) * MiB, i + 1)
        if row is None:
            continue
        if i - prev > 2:  # a new listing (rows of one are next to each other, a border between at most)
            run = []
        run.append(row)
        prev = i
    return run


# nvidia-smi's per-GPU memory: the table's Memory-Usage column ("|  N/A 45C P0 30W / 72W | 22810MiB / 23034MiB |",
# its GPU's index on the row above) and --query-gpu's CSV ("index, name, memory.used [MiB], memory.total [MiB]"
# then "0, NVIDIA A100-SXM4-40GB, 27311 MiB, 40960 MiB"; with noheader, the fields as the command asked for them)
_RE_SMI_USAGE = re.compile(r"^\|.{0,120}?\|\s{0,8}(\d{1,9})MiB\s{0,8}/\s{0,8}(\d{1,9})MiB\s{0,8}\|")
_RE_SMI_GPU_ROW = re.compile(r"^\|\s{1,8}(\d{1,3})\s{1,8}[A-Za-z]")
_RE_QUERY_GPU = re.compile(r"--query-gpu[= ]([\w.,]{1,300})")
_RE_CSV_MIB = re.compile(r"^(\d{1,9})(?: MiB)?$")


@dataclass(slots=True)
class SmiGpu:
    """One GPU's memory in use as nvidia-smi printed it in a log (every process's, those it cannot list
    included), its index when printed, its total, and the (1-based) line."""

    gpu: int | None
    used_bytes: int
    total_bytes: int | None
    line_no: int


def smi_gpu_usage(text: str) -> list[SmiGpu]:
    """The last per-GPU memory reading nvidia-smi printed in ``text`` (its table or ``--query-gpu`` CSV),
    one entry per GPU of that reading."""
    if "MiB /" not in text and "memory.used" not in text:
        return []  # neither the table's Memory-Usage column nor the CSV's header
    lines = text.split("\n")
    run: list[SmiGpu] = []
    prev = -10
    fields: list[str] | None = None
    query = _RE_QUERY_GPU.search(text)
    if query and "noheader" in text[query.end() : query.end() + 200]:
        fields = [f.strip().lower() for f in query.group(1).split(",")]
    for i in lines_holding(lines, ("mib", "memory.used")):
        content = _strip_line(lines[i]).content.strip()
        got: SmiGpu | None = None
        m = _RE_SMI_USAGE.match(content)
        if m is not None:
            above = _RE_SMI_GPU_ROW.match(_strip_line(lines[i - 1]).content.strip()) if i else None
            gpu = int(above.group(1)) if above else None
            got = SmiGpu(gpu, int(m.group(1)) * MiB, int(m.group(2)) * MiB, i + 1)
        elif "memory.used" in content.lower() and "," in content and "--query" not in content:
            fields = [f.strip().split(" ", 1)[0].lower() for f in content.split(",")]
            continue
        elif fields and "memory.used" in fields and "," in content:
            cells = [c.strip() for c in content.split(",")]
            if len(cells) == len(fields):
                row = dict(zip(fields, cells, strict=True))
                used = _RE_CSV_MIB.match(row["memory.used"])
                total = _RE_CSV_MIB.match(row.get("memory.total", ""))
                idx = row.get("index", "")
                if used is not None:
                    got = SmiGpu(
                        int(idx) if idx.isdigit() else None,
                        int(used.group(1)) * MiB,
                        int(total.group(1)) * MiB if total else None,
                        i + 1,
                    )
        if got is None:
            continue
        if i - prev > 5:  # a new reading (a table's GPUs are four lines apart)
            run = []
        run.append(got)
        prev = i
    return run


# the stack faulthandler prints when a process dies of SIGBUS ("Fatal Python error: Bus error", then
# "Current thread 0x… (most recent call first):" and '  File "…", line N in NAME' lines)
_RE_FAULT_FRAME = re.compile(r'^\s{0,8}File "([^"\n]{1,4096})", line (\d{1,7}) in ([\w<>.]{1,200})')


def bus_error_frame(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) where a process faulted with SIGBUS, as faulthandler printed it (the innermost
    frame of the first stack after ``Fatal Python error: Bus error``); None when the log has no such stack."""
    i = text.find("Fatal Python error: Bus error")
    if i < 0:
        return None
    for raw in text[i:].split("\n", 12)[1:12]:
        m = _RE_FAULT_FRAME.match(_strip_line(raw).content)
        if m is not None:
            return m.group(1), int(m.group(2)), m.group(3)
    return None


def progress_before(text: str, line_no: int) -> bool:
    """Whether a line before line ``line_no`` (1-based) of ``text`` shows training progress (loading the
    model or the data is not progress)."""
    for raw in text.split("\n", line_no)[: max(0, line_no - 1)]:
        content = _strip_line(raw).content
        if _progress_past_start(content) and not _RE_LOADING.search(content):
            return True
    return False
