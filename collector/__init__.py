"""oom-triage's in-pod collector: captures a training process's CUDA OOM (and shm / host-memory
crashes) with the allocator's evidence and sends it to the triage service.

Zero code changes: ``TRIAGE_URL=http://… python train.py`` (the package ships an auto-activation
``.pth`` that is inert unless ``TRIAGE_URL`` is set), or ``triage-run -- python train.py``. From code::

    import collector
    collector.install("http://oom-triage.platform:8080")
    collector.set_batch_size(32)   # optional: otherwise taken from the DataLoader
    collector.step()               # optional: otherwise counted by a global optimizer hook

Standard library and torch only; never imports the service. See collector/README.md.
"""

from __future__ import annotations

from collector._core import flush, install, set_batch_size, step

__version__ = "0.1.0"
__all__ = ["flush", "install", "set_batch_size", "step"]
