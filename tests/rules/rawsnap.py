"""Raw snapshot pieces for the rules' tests: the dict layout ``torch.cuda.memory._snapshot()`` writes."""

from __future__ import annotations

from typing import Any


def one_block_segment(device: int, address: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """A segment holding exactly one allocated block of ``size`` bytes, allocated from ``frames``."""
    block = {
        "address": address,
        "size": size,
        "requested_size": size,
        "state": "active_allocated",
        "frames": frames,
    }
    return {
        "device": device,
        "address": address,
        "total_size": size,
        "allocated_size": size,
        "active_size": size,
        "requested_size": size,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [block],
    }


def segment_with_hole(
    device: int, address: int, size: int, hole: int, frames: list[dict[str, Any]]
) -> dict[str, Any]:
    """A segment holding one allocated block of ``size`` bytes and, after it, a free block of ``hole``."""
    seg = one_block_segment(device, address, size, frames)
    seg["total_size"] = size + hole
    seg["blocks"].append(
        {"address": address + size, "size": hole, "requested_size": 0, "state": "inactive", "frames": []}
    )
    return seg


def free_segment(device: int, address: int, size: int) -> dict[str, Any]:
    """A cached segment with nothing allocated in it: one free (inactive) block of ``size`` bytes."""
    seg = one_block_segment(device, address, size, [])
    seg.update(allocated_size=0, active_size=0, requested_size=0)
    seg["blocks"][0].update(state="inactive", requested_size=0)
    return seg


MiB = 1 << 20
ACT = [{"filename": "/w/model.py", "line": 12, "name": "forward"}]
KEEP = [{"filename": "/w/train.py", "line": 99, "name": "train_step"}]


class Trace:
    """Raw trace entries and live blocks of one device."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.entries: list[dict[str, Any]] = []
        self.live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        self.addr = (device + 1) << 40

    def alloc(self, size: int, frames: list[dict[str, Any]]) -> int:
        self.addr += 1 << 30
        self.entries.append(
            {"action": "alloc", "addr": self.addr, "size": size, "stream": 0, "frames": frames}
        )
        self.live[self.addr] = (size, frames)
        return self.addr

    def free(self, addr: int) -> None:
        size, frames = self.live.pop(addr)
        for action in ("free_requested", "free_completed"):
            self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames})

    def step(self, acts: int, keep: int | None) -> int | None:
        """One step: ``acts`` activations of 256 MiB made and freed; ``keep`` bytes kept from user code."""
        made = [self.alloc(256 * MiB, ACT) for _ in range(acts)]
        kept = self.alloc(keep, KEEP) if keep else None
        for a in reversed(made):
            self.free(a)
        return kept

    def oom(self, size: int, frames: list[dict[str, Any]], device_free: int = 0) -> None:
        """The allocator's ``oom`` entry for a request of ``size`` bytes it could not serve."""
        self.entries.append(
            {
                "action": "oom",
                "addr": 0,
                "size": size,
                "stream": 0,
                "device_free": device_free,
                "frames": frames,
            }
        )

    def segments(self) -> list[dict[str, Any]]:
        return [one_block_segment(self.device, a, size, fr) for a, (size, fr) in self.live.items()]


def bundle(
    raw: dict[str, Any], *, step: int, timeline: list[dict[str, Any]], batch_size: int = 64
) -> dict[str, Any]:
    """A collector bundle around ``raw``: the job (pid 7) alone on an A10 sized to what the snapshot holds
    plus its CUDA context, nearly full, with its per-step samples."""
    held = sum(seg["allocated_size"] for seg in raw["segments"])
    return {
        "schema": "oom-triage/incident@1",
        "incident_id": "00000000-0000-0000-0000-00000000b0f1",
        "occurred_at": "2026-11-30T12:00:00Z",
        "kind": "cuda_oom",
        "workload": {"step": step, "batch_size": batch_size, "pid": 7, "pids": [7]},
        "device": {
            "index": 0,
            "name": "NVIDIA A10",
            "total_bytes": held + 600 * MiB,
            "free_bytes": 100 * MiB,
            "processes": [{"pid": 7, "used_bytes": held + 500 * MiB, "name": "python"}],
        },
        "timeline": timeline,
        "snapshot": raw,
    }
