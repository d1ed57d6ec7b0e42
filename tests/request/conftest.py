"""Fixtures for `mat request`: two tiny local Llamas of different sizes, small repositories under MIT and
GPL licenses, configs, the scripted planner (a real executable) and the `mat` CLI in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tiny_model import MAX_LENGTH, build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets" / "requests"
PLANNER = ASSETS / "planner.py"
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
COMMAND_TIMEOUT_S = 420


# --------------------------------------------------------------------------- models


def parameter_count(folder: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """name -> (local folder, parameter count): `tiny` (hidden 32) and the larger `wide` (hidden 64)."""
    import torch

    torch.set_num_threads(1)
    small = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, layers=2)
    wide = build_tiny_model(tmp_path_factory.mktemp("wide"), hidden_size=64, layers=2, seed=1)
    return {"tiny": (small, parameter_count(small)), "wide": (wide, parameter_count(wide))}


def catalog(models: dict[str, tuple[Path, int]]) -> list[dict[str, Any]]:
    """The `models:` section for the tiny models."""
    return [
        {"name": name, "model_id": str(folder), "params": params} for name, (folder, params) in models.items()
    ]


# --------------------------------------------------------------------------- repositories


def function_file(module: int) -> str:
    """A Python module of documented functions (the code-completion pairs)."""
    parts = []
    for index in range(3):
        parts.append(
            f"def load_items_{module}_{index}(request, limit={index + 1}):\n"
            f'    """Return the items of `request` smaller than {index + 1}."""\n'
            "    items = request.items()\n"
            "    return [item for item in items if item.size < limit]\n"
        )
    return "\n\n".join(parts)


def write_repo(folder: Path, license_file: str) -> Path:
    """A small repository: a license, four Python modules and a README with sections."""
    (folder / "src").mkdir(parents=True)
    (folder / "LICENSE").write_text((ASSETS / license_file).read_text(encoding="utf-8"), encoding="utf-8")
    for module in range(4):
        (folder / "src" / f"module_{module}.py").write_text(function_file(module), encoding="utf-8")
    readme = "# Widgets\n\nList widgets.\n\n## Install\n\npip install widgets\n\n## Use\n\nCall load_items.\n"
    (folder / "README.md").write_text(readme, encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def widgets_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository under the MIT license (the full text)."""
    return write_repo(tmp_path_factory.mktemp("widgets"), "MIT.txt")


@pytest.fixture(scope="session")
def gpl_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose LICENSE is the GNU GPL v3 (its opening lines)."""
    return write_repo(tmp_path_factory.mktemp("gadgets"), "GPL-3.0-opening.txt")


# --------------------------------------------------------------------------- configs and requests


def tiny_opensource() -> dict[str, Any]:
    """Test-sized LoRA settings (the request's trials and final training override lr, rank and steps)."""
    return {
        "lora_r": 4,
        "lora_alpha": 8,
        "batch_size": 2,
        "max_length": MAX_LENGTH,
        "learning_rate": 5e-3,
        "save_steps": 1000,
        "eval_steps": 1000,
    }


def write_config(
    folder: Path, models: list[dict[str, Any]], sources: dict[str, Path], **request: Any
) -> Path:
    """mat.yaml in `folder`: local sources by name, the catalog, test-sized trials; requests in `folder`."""
    section = {
        "output_dir": str(folder),
        "trials": {"learning_rates": [5e-3], "lora_ranks": [4], "steps": 2, "parallel": 2},
        "full_steps": 3,
        "latency_probe_runs": 2,
        "measure_requests": 4,
        **request,
    }
    document = {
        "sources": [
            {"type": "local_repo", "path": str(path), "name": name} for name, path in sources.items()
        ],
        "corpus": {"dir": str(folder / "corpus"), "staging_dir": str(folder / "staging")},
        "finetuner": {"jobs_dir": str(folder / "jobs"), "opensource": tiny_opensource()},
        "models": models,
        "request": section,
    }
    path = folder / "mat.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def write_request(folder: Path, document: dict[str, Any], name: str = "request.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def planner_command() -> str:
    return f"{sys.executable} {PLANNER} {{prompt_file}}"


# --------------------------------------------------------------------------- the CLI


def mat_env(**extra: str) -> dict[str, str]:
    """A `mat` subprocess's environment: the session's Prefect server, offline hub, plain output."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "COLUMNS": "200",
        "NO_COLOR": "1",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def mat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `mat ARGS` to completion from the repository root."""
    return subprocess.run(
        [*MAT, *args],
        cwd=ROOT,
        env=env or mat_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def request_folder(config_dir: Path) -> Path:
    """The one request folder written under `config_dir/requests`."""
    (folder,) = (config_dir / "requests").iterdir()
    return folder
