"""Lightning: ``Trainer(callbacks=[TriageCallback()])`` gives the collector Lightning's own step count
(``trainer.global_step``) and the batch size of each training batch.

Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning`` package. The collector
itself is still activated by ``TRIAGE_URL`` or ``collector.install()``; this callback only feeds it.
"""

from __future__ import annotations

from typing import Any

import collector
from collector import _torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on which package is installed
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef,unused-ignore]

__all__ = ["TriageCallback"]


class TriageCallback(Callback):  # type: ignore[misc,unused-ignore]
    """Feeds ``collector.step(trainer.global_step)`` and ``collector.set_batch_size(…)``."""

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        try:
            n = _torch.leading_dim(batch)
            if n:
                collector.set_batch_size(n)
        except Exception:
            pass

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            collector.step(int(trainer.global_step))
        except Exception:
            pass
