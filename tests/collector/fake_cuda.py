"""A stand-in for the CUDA calls that torch's CPU build lacks, for the collector's subprocess tests.

No GPU here, so the tests run torch's CPU build with this module patched in. It provides exactly the
calls the collector makes and a CPU build cannot answer:

- ``torch._C._cuda_attach_out_of_memory_observer`` (absent on CPU builds), ``_cuda_isHistoryEnabled``;
- ``torch.cuda.memory._record_memory_history`` (raises AttributeError on CPU builds): records its arguments;
- ``torch.cuda.memory._snapshot``: returns a snapshot produced by the project's simulator
  (``triage.simulate.scenarios.run_scenario``, the engine behind ``triage simulate``);
- ``torch.cuda.mem_get_info``, ``memory_stats``, ``memory_stats_as_nested_dict``, ``get_device_properties``,
  ``get_per_process_memory_fraction``, ``current_device``, ``is_initialized``, ``is_available``.

Everything else is real: torch's own ``torch.cuda._lazy_call`` queue (``init()`` runs it the way
``torch.cuda._lazy_init`` does), the real optimizer hooks, DataLoader, excepthooks, and a real
``torch.OutOfMemoryError`` whose text is the simulator's torch-format message, raised after the observer
was called with the four ints the allocator passes (twice, as the allocator's retry does).
"""

from __future__ import annotations

import copy
import re
import types
from typing import Any

import torch
import torch.cuda
import torch.cuda.memory

MiB = 1024**2
GiB = 1024**3
_current: FakeCuda | None = None


def _scenario(name: str, seed: int) -> tuple[dict[str, Any], str, str]:
    """(snapshot, message, source) from the project's simulator; a minimal built-in one if it is absent."""
    try:
        from triage.simulate.scenarios import run_scenario  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        snap, msg = _builtin_snapshot(name)
        return snap, msg, "builtin"
    res = run_scenario(name, seed=seed)
    return res.snapshot, res.message, "triage.simulate"


def _builtin_snapshot(name: str) -> tuple[dict[str, Any], str]:
    """Used only while triage.simulate is missing: a small but well-formed torch 2.13 snapshot."""
    frames = [
        {"name": "forward", "filename": "/work/train.py", "line": 42},
        {"name": "<module>", "filename": "/work/train.py", "line": 7},
    ]
    blocks = [
        {
            "address": 0x7F0000000000 + i * 20 * MiB,
            "size": 20 * MiB,
            "requested_size": 20 * MiB,
            "state": "active_allocated",
            "frames": frames,
        }
        for i in range(4)
    ]
    segs = [
        {
            "device": 0,
            "address": b["address"],
            "total_size": b["size"],
            "allocated_size": b["size"],
            "active_size": b["size"],
            "requested_size": b["size"],
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": frames,
            "blocks": [b],
        }
        for b in blocks
    ]
    trace = [
        {
            "action": "alloc",
            "addr": b["address"],
            "size": b["size"],
            "stream": 0,
            "time_us": 1_700_000_000_000_000 + i,
            "frames": frames,
        }
        for i, b in enumerate(blocks)
    ]
    trace.append(
        {
            "action": "oom",
            "device_free": 3 * MiB,
            "size": 20 * MiB,
            "stream": 0,
            "time_us": 1_700_000_000_000_100,
            "frames": frames,
        }
    )
    snap = {
        "segments": segs,
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "expandable_segments": False,
        },
    }
    msg = (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 3.00 MiB is free. "
        "Including non-PyTorch memory, this process has 79.09 GiB memory in use. Of the allocated memory 80.00 MiB is "
        "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
        "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    return snap, msg


def _sizes(snap: dict[str, Any]) -> tuple[int, int]:
    reserved = allocated = 0
    for s in snap.get("segments") or []:
        reserved += int(s.get("total_size", 0))
        for b in s.get("blocks") or []:
            if b.get("state") == "active_allocated":
                allocated += int(b.get("size", 0))
    return reserved, allocated


def _last_oom(snap: dict[str, Any]) -> dict[str, Any] | None:
    for tr in snap.get("device_traces") or []:
        for e in reversed(tr or []):
            if e.get("action") == "oom":
                return dict(e)
    return None


def _unwind(snap: dict[str, Any]) -> None:
    """The allocator after the OOM's exception unwound the failing step: the last block allocated before
    the OOM is freed (merged with free neighbours, as the allocator does) and the trace records it."""
    traces = snap.get("device_traces") or []
    if not traces or not traces[0]:
        return
    tr = traces[0]
    oom = max((i for i, e in enumerate(tr) if e.get("action") == "oom"), default=None)
    if oom is None:
        return
    live = {
        b["address"]: (seg, i)
        for seg in snap.get("segments") or []
        for i, b in enumerate(seg.get("blocks") or [])
        if b.get("state") == "active_allocated" and "address" in b
    }
    entry = next(
        (e for e in reversed(tr[:oom]) if e.get("action") == "alloc" and e.get("addr") in live), None
    )
    if entry is None:
        return
    seg, i = live[entry["addr"]]
    blocks = seg["blocks"]
    blk = blocks[i]
    seg["allocated_size"] -= blk["size"]
    seg["active_size"] -= blk["size"]
    seg["requested_size"] -= blk.get("requested_size", blk["size"])
    blk["state"] = "inactive"
    blk["frames"] = []
    if i + 1 < len(blocks) and blocks[i + 1]["state"] == "inactive":
        blk["size"] += blocks.pop(i + 1)["size"]
    if i > 0 and blocks[i - 1]["state"] == "inactive":
        blocks[i - 1]["size"] += blocks.pop(i)["size"]
    for action in ("free_requested", "free_completed"):
        tr.append({**entry, "action": action, "frames": []})


class FakeCuda:
    def __init__(self, scenario: str, seed: int = 0, total: int = 80 * GiB, fraction: float = 1.0) -> None:
        self.scenario = scenario
        self.seed = seed
        self.total = total
        self.fraction = fraction
        self.observers: list[Any] = []
        self.history_calls: list[dict[str, Any]] = []
        self.history_enabled = False
        self.initialized = False
        self.unwound = False  # the OOM was raised: the failing step's tensors are being freed
        self._loaded = False

    def _load(self) -> None:
        """Run the simulator on first use (a process that never initialises CUDA never pays for it)."""
        if self._loaded:
            return
        self._loaded = True
        self.snapshot, self.message, self.source = _scenario(self.scenario, self.seed)
        m = re.search(r"total capacity of ([\d.]+) GiB", self.message)
        if m:
            self.total = int(float(m.group(1)) * GiB)
        self.reserved, self.allocated = _sizes(self.snapshot)
        oom = _last_oom(self.snapshot) or {}
        self.oom_request = int(oom.get("size", 20 * MiB))
        self.free = int(oom.get("device_free", 3 * MiB))
        self.step_allocated = max(1, self.allocated // 2)
        self.peak = self.step_allocated

    # -- the patched calls ------------------------------------------------------------------------
    def _attach(self, cb: Any) -> None:
        self.observers.append(cb)

    def _record(self, enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        self.history_calls.append({"enabled": enabled, "args": args, **kwargs})
        self.history_enabled = enabled is not None and enabled is not False

    def _snapshot(self, device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        self._load()
        snap = copy.deepcopy(self.snapshot)  # a fresh object each call, as the real one
        if self.unwound:
            _unwind(snap)
        return snap

    def _properties(self, device: Any = None) -> Any:
        self._load()
        return types.SimpleNamespace(
            name="NVIDIA H100 80GB HBM3 (stand-in)",
            total_memory=self.total,
            uuid="5f3e0c2a-1111-2222-3333-444455556666",
        )

    def _mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self._load()
        return self.free, self.total

    def _nested(self, device: Any = None) -> dict[str, Any]:
        if not self.initialized:
            return {}

        def stat(cur: int, peak: int) -> dict[str, dict[str, int]]:
            return {"all": {"current": cur, "peak": peak, "allocated": peak, "freed": peak - cur}}

        return {
            "allocated_bytes": stat(self.step_allocated, self.peak),
            "reserved_bytes": stat(self.reserved, self.reserved),
            "num_ooms": 0,
        }

    def _flat(self, device: Any = None) -> dict[str, Any]:
        if not self.initialized:
            return {}
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": max(self.allocated, self.peak),
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.reserved,
            "num_alloc_retries": 1,
            "num_ooms": 1,
        }

    def activate(self) -> FakeCuda:
        global _current
        _current = self
        C = torch._C
        C._cuda_attach_out_of_memory_observer = self._attach  # type: ignore[attr-defined]
        C._cuda_isHistoryEnabled = lambda: self.history_enabled  # type: ignore[attr-defined]
        mem = torch.cuda.memory
        mem._record_memory_history = self._record  # type: ignore[assignment]
        mem._snapshot = self._snapshot  # type: ignore[assignment]
        patches: dict[str, Any] = {
            "is_available": lambda: True,
            "is_initialized": lambda: self.initialized,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "get_device_properties": self._properties,
            "mem_get_info": self._mem_get_info,
            "memory_stats": self._flat,
            "memory_stats_as_nested_dict": self._nested,
            "get_per_process_memory_fraction": lambda device=None: self.fraction,
            "reset_peak_memory_stats": lambda device=None: None,
        }
        for name, fn in patches.items():
            setattr(torch.cuda, name, fn)
            if hasattr(mem, name):
                setattr(mem, name, fn)
        return self

    # -- what a training script would cause on a GPU ----------------------------------------------
    def init(self) -> None:
        """CUDA's lazy initialisation, as ``torch.cuda._lazy_init`` does it: run the queued calls."""
        if self.initialized:
            return
        self._load()
        tc = torch.cuda
        tc._tls.is_initializing = True
        try:
            for call, _tb in list(tc._queued_calls):
                call()
        finally:
            del tc._tls.is_initializing
        self.initialized = True

    def advance(self, step: int) -> None:
        """Memory after ``step`` (leaky scenarios grow step over step; the others stay flat)."""
        grow = "leak" in self.scenario
        self.step_allocated = max(1, self.allocated // 2) + (step * 4 * MiB if grow else 0)
        self.peak = max(self.peak, min(self.reserved, self.step_allocated + self.allocated // 4))

    def oom(self, device: int = 0) -> None:
        """What the caching allocator does when a cudaMalloc fails: call the observers (again after
        its retry), then raise the OOM with its message."""
        if not self.initialized:
            raise RuntimeError("fake CUDA used before init()")
        cap = int(self.total * self.fraction)
        for _ in range(2):
            for cb in self.observers:
                cb(device, self.oom_request, cap, self.free)
        self.unwound = True  # from here on the exception unwinds the step and frees its tensors
        raise torch.OutOfMemoryError(self.message)


def activate(scenario: str, seed: int = 0, fraction: float = 1.0) -> FakeCuda:
    return FakeCuda(scenario, seed=seed, fraction=fraction).activate()


def current() -> FakeCuda:
    assert _current is not None, "fake_cuda.activate() was not called (set OOMT_FAKE_SCENARIO)"
    return _current
