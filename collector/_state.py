"""The collector's process-wide state: one instance, owned by the process that installed it."""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from collector._config import Config

if TYPE_CHECKING:
    from collector._send import Sender

# (step, allocated, reserved, peak, time_us, batch_size)
Sample = tuple[int, int | None, int | None, int | None, int, int | None, int | None]


class State:
    def __init__(self) -> None:
        self.installed = False
        self.active = False  # hooks do work only while True (and only in ``pid``)
        self.pid = -1
        self.config: Config | None = None
        self.mp_child = False  # a multiprocessing spawn child (maybe a DataLoader worker)
        self.torch_seen = False
        self.cuda_ready = False  # our queued call ran inside torch.cuda's lazy init
        self.history_max_entries: int | None = None  # what we set, when we set it
        self.history_by_user = False
        self.observer_attached = False
        self.lock = threading.RLock()
        # progress
        self.step = 0
        self.manual_steps = False
        self.opt_steps: dict[int, int] = {}
        self.explicit_batch_size: int | None = None
        self.loader_batch_size: int | None = None
        self.leading_dim_batch_size: int | None = None
        self.batch_code: tuple[str, str, int] | None = None  # the function whose locals gave it
        self.dataloader_workers: int | None = None
        # who called set_per_process_memory_fraction: {"fraction", "device", "filename", "line", "function"}
        self.fraction_set_by: dict[str, Any] | None = None
        self.timeline: deque[Sample] = deque(maxlen=4096)
        self.peak_reset = False
        # OOM observer events: dicts with device, alloc_size, device_total_or_cap, device_free, time, mono, calls
        self.oom_events: deque[dict[str, Any]] = deque(maxlen=32)
        self.last_oom_by_device: dict[int, dict[str, Any]] = {}
        self.oom_snapshots = 0  # snapshots taken inside the observer
        self.last_oom_snapshot_mono = float("-inf")
        self.oom_snapshot_event: dict[str, Any] | None = None  # the event that holds a snapshot
        # captures
        self.captured_ids: set[int] = set()
        self.captures = 0
        self.crash_deadline = 0.0
        self.sender: Sender | None = None
        # chained hooks
        self.prev_excepthook: Any = None
        self.prev_threading_excepthook: Any = None
        self.our_excepthook: Any = None
        self.our_threading_excepthook: Any = None

    def owns_process(self) -> bool:
        return self.active and os.getpid() == self.pid

    def batch_size(self) -> int | None:
        if self.explicit_batch_size is not None:
            return self.explicit_batch_size
        if self.loader_batch_size is not None:
            return self.loader_batch_size
        return self.leading_dim_batch_size


STATE = State()
