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
