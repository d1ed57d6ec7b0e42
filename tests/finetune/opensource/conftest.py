"""The open-source backend's fixtures: a tuner factory on the tiny Llama of tests/support/tiny_model.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import OpenSourceConfig
from multiagenttrainer.finetune.base import JobStore
from multiagenttrainer.finetune.opensource import OpenSourceFineTuner
from tests.support.tiny_model import MAX_LENGTH, corpus_dir, tiny_model_dir

__all__ = ["MAX_LENGTH", "corpus_dir", "tiny_model_dir"]  # session fixtures from tests/support


@pytest.fixture
def make_tuner(tmp_path: Path, tiny_model_dir: Path) -> Callable[..., OpenSourceFineTuner]:
    """Build a tuner on the tiny model with test-sized settings; keyword arguments override the config."""

    def build(**overrides: object) -> OpenSourceFineTuner:
        settings: dict[str, object] = {
            "model_id": str(tiny_model_dir),
            "output_dir": str(tmp_path / "models"),
            "lora_r": 4,
            "lora_alpha": 8,
            "batch_size": 2,
            "max_length": MAX_LENGTH,
            "learning_rate": 5e-3,
            "max_steps": 3,
            "save_steps": 1000,
            "eval_steps": 1000,
        }
        settings.update(overrides)
        return OpenSourceFineTuner(OpenSourceConfig(**settings), JobStore(tmp_path / "jobs"))

    return build
