"""Fixtures for `mat finetune`: the tiny Llama and corpus of tests/support/tiny_model.py, configs, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tiny_model import MAX_LENGTH, corpus_dir, tiny_model_dir, train_tiny_job

__all__ = ["corpus_dir", "tiny_model_dir"]  # session fixtures shared with the open-source backend tests

ROOT = Path(__file__).resolve().parents[2]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
COMMAND_TIMEOUT_S = 180


def opensource_section(model_dir: Path, output_dir: Path, max_steps: int) -> dict[str, Any]:
    """Test-sized LoRA settings on the tiny model."""
    return {
        "model_id": str(model_dir),
        "output_dir": str(output_dir),
        "lora_r": 4,
        "lora_alpha": 8,
        "batch_size": 2,
        "max_length": MAX_LENGTH,
        "learning_rate": 5e-3,
        "max_steps": max_steps,
        "save_steps": 1000,
        "eval_steps": 1000,
    }


def write_config(directory: Path, finetuner: dict[str, Any], corpus: Path | None = None) -> Path:
    """mat.yaml in `directory` with this finetuner section; jobs under `directory/jobs`."""
    document: dict[str, Any] = {
        "finetuner": {"jobs_dir": str(directory / "jobs"), **finetuner},
        "corpus": {"dir": str(corpus or directory / "corpus"), "staging_dir": str(directory / "staging")},
    }
    path = directory / "mat.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def mat_env(**extra: str) -> dict[str, str]:
    """The environment of a `mat` subprocess: the session's Prefect server (when started), offline hub."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200",
            "NO_COLOR": "1", **extra}  # fmt: skip


def mat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `mat ARGS` to completion from the repository root."""
    return subprocess.run(
        [*MAT, *args], cwd=ROOT, env=env or mat_env(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip


def start_mat(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `mat ARGS` in the background, output to `log`."""
    with log.open("wb") as handle:
        return subprocess.Popen(
            [*MAT, *args], cwd=ROOT, env=env or mat_env(), stdin=subprocess.DEVNULL,
            stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip


def mat_json(*args: str, env: dict[str, str] | None = None) -> Any:
    """Run `mat ARGS --json` and parse its output; fails the test with stderr on a non-zero exit."""
    result = mat(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="session")
def finished_job(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, corpus_dir: Path
) -> tuple[Path, Any]:
    """A completed open-source job (3 LoRA steps on the tiny Llama) and the mat.yaml that finds it."""
    return train_tiny_job(tmp_path_factory.mktemp("finished-job"), tiny_model_dir, corpus_dir)
