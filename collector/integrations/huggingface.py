"""Hugging Face Transformers: ``Trainer(..., callbacks=[TriageCallback()])`` gives the collector the
Trainer's step (``state.global_step``) and its per-device batch size.

The batch size reported is ``per_device_train_batch_size``: what one forward/backward holds on the GPU
(gradient accumulation repeats it, it does not enlarge it). The collector itself is still activated by
``TRIAGE_URL`` or ``collector.install()``; this callback only feeds it.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

import collector

__all__ = ["TriageCallback"]


class TriageCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Feeds ``collector.set_batch_size`` at the start of training and ``collector.step`` after each step."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            collector.set_batch_size(int(args.per_device_train_batch_size))
        except Exception:
            pass

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            collector.step(int(state.global_step))
        except Exception:
            pass
