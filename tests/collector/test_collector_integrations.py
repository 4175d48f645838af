"""The Lightning and Hugging Face callbacks feed the collector the framework's own step and batch size.

Skipped where the framework is not installed (neither is in the dev extras: the collector never needs them).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector._state import STATE


@pytest.fixture
def fresh_state() -> Iterator[None]:
    saved = (STATE.step, STATE.manual_steps, STATE.explicit_batch_size)
    STATE.step, STATE.manual_steps, STATE.explicit_batch_size = 0, False, None
    yield
    STATE.step, STATE.manual_steps, STATE.explicit_batch_size = saved


def test_lightning_callback(fresh_state: None) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from collector.integrations.lightning import TriageCallback

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            return self.lin(x).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(
            max_steps=4,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[TriageCallback()],
        )
        trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 3)), batch_size=6))
    assert STATE.step == 4 and STATE.manual_steps
    assert STATE.explicit_batch_size == 6


def test_huggingface_callback(fresh_state: None, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it on PyTorch
    import torch

    from collector.integrations.huggingface import TriageCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            out = self.lin(x).squeeze(-1)
            return {"loss": (out - labels).pow(2).mean() if labels is not None else out.sum(), "logits": out}

    data = [{"x": torch.randn(3), "labels": torch.tensor(1.0)} for _ in range(40)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=3,
            per_device_train_batch_size=5,
            gradient_accumulation_steps=2,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=Tiny(), args=args, train_dataset=data, callbacks=[TriageCallback()]
        )
        trainer.train()
    assert STATE.step == 3 and STATE.manual_steps
    assert STATE.explicit_batch_size == 5
