"""The built-in template's train.py, run as the harness runs it: a subprocess in a rendered workspace.

Runs are CPU-only (CUDA hidden) with one thread, in fixed-step mode unless a test checks the time budget.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multiagenttrainer.workspace.builtin import render_template, write_builtin_data
from multiagenttrainer.workspace.summary import parse_run_summary

RUN_TIMEOUT_S = 120
SUMMARY_KEYS = {
    "val_bpb",
    "training_seconds",
    "total_seconds",
    "peak_vram_mb",
    "mfu_percent",
    "total_tokens_M",
    "num_steps",
    "num_params_M",
    "depth",
}


def run_train(workspace: Path, steps: int | None) -> subprocess.CompletedProcess[str]:
    """`python train.py` in `workspace`, stdout and stderr together as in `> run.log 2>&1`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MAT_FIXED_STEPS", None)
    if steps is not None:
        env["MAT_FIXED_STEPS"] = str(steps)
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def summary_of(run: subprocess.CompletedProcess[str]) -> dict[str, int | float]:
    assert run.returncode == 0, run.stdout[-3000:]
    summary = parse_run_summary(run.stdout)
    assert summary is not None, run.stdout[-3000:]
    return summary


def train_constant(workspace: Path, name: str) -> str:
    match = re.search(rf"^{name} = (\S+)", (workspace / "train.py").read_text(), re.MULTILINE)
    assert match is not None
    return match.group(1)


def copy_workspace(workspace: Path, destination: Path) -> Path:
    shutil.copytree(workspace, destination, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


@pytest.fixture(scope="module")
def workspace(library_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rendered workspace with data from the library's own sources and a 60 s budget."""
    root = tmp_path_factory.mktemp("workspace")
    write_builtin_data(library_corpus, root / "data")
    render_template(root, 60, None)
    return root


@pytest.fixture(scope="module")
def five_step_runs(workspace: Path) -> list[subprocess.CompletedProcess[str]]:
    return [run_train(workspace, 5), run_train(workspace, 5)]


def test_a_five_step_run_prints_the_whole_summary_block(
    workspace: Path, five_step_runs: list[subprocess.CompletedProcess[str]]
) -> None:
    summary = summary_of(five_step_runs[0])
    assert set(summary) == SUMMARY_KEYS
    assert summary["num_steps"] == 5
    assert summary["depth"] == int(train_constant(workspace, "N_LAYER"))
    tokens = 5 * int(train_constant(workspace, "BATCH_SIZE")) * int(train_constant(workspace, "SEQ_LEN"))
    assert summary["total_tokens_M"] == round(tokens / 1e6, 1)
    assert 0 < summary["training_seconds"] <= summary["total_seconds"] < RUN_TIMEOUT_S
    assert summary["peak_vram_mb"] > 10  # peak resident memory on CPU
    assert summary["mfu_percent"] == 0.0
    assert summary["num_params_M"] > 0


def test_fixed_step_runs_print_identical_val_bpb(
    five_step_runs: list[subprocess.CompletedProcess[str]],
) -> None:
    first, second = (re.search(r"^val_bpb:.*$", run.stdout, re.MULTILINE) for run in five_step_runs)
    assert first is not None and second is not None
    assert first.group(0) == second.group(0)


def test_training_clearly_beats_the_untrained_model(workspace: Path) -> None:
    untrained = summary_of(run_train(workspace, 0))
    assert untrained["num_steps"] == 0 and untrained["training_seconds"] == 0.0
    assert 7.5 < untrained["val_bpb"] < 8.5  # near-uniform over 256 bytes: 8 bits per byte
    trained = summary_of(run_train(workspace, 30))
    assert trained["num_steps"] == 30
    assert trained["val_bpb"] < untrained["val_bpb"] - 1.0


def test_without_fixed_steps_training_stops_at_the_time_budget(workspace: Path, tmp_path: Path) -> None:
    short = copy_workspace(workspace, tmp_path / "ws")
    render_template(short, 2, None)
    summary = summary_of(run_train(short, None))
    assert 2.0 <= summary["training_seconds"] < 10.0
    assert summary["num_steps"] >= 1


def test_a_diverging_loss_fails_fast(workspace: Path, tmp_path: Path) -> None:
    broken = copy_workspace(workspace, tmp_path / "ws")
    train = broken / "train.py"
    source, count = re.subn(
        r"^LEARNING_RATE = \S+", "LEARNING_RATE = 1e6", train.read_text(), flags=re.MULTILINE
    )
    assert count == 1
    train.write_text(source)
    run = run_train(broken, 50)
    assert run.returncode == 1, run.stdout[-3000:]
    assert re.search(r"^FAIL: loss is \S+ at step \d+$", run.stdout, re.MULTILINE), run.stdout[-3000:]
    assert parse_run_summary(run.stdout) is None
