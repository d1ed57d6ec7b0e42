"""build_prompt: program.md, the results so far, and the instructions for one experiment."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from multiagenttrainer.agents import build_prompt
from multiagenttrainer.errors import ConfigError
from tests.agents.helpers import result

HISTORY = [
    result(0, "keep", 2.5, "baseline"),
    result(1, "keep", 2.4, "LEARNING_RATE 3e-3 -> 6e-3"),
    result(2, "discard", 2.45, "N_LAYER 2 -> 3"),
    result(3, "crash", None, "remove the layer norm"),
]


def test_prompt_starts_with_program_md_and_lists_results_and_the_best(workspace: Path) -> None:
    prompt = build_prompt(workspace, 4, HISTORY, "harness")
    program = (workspace / "program.md").read_text().strip()
    assert prompt.startswith(program)
    assert "| 1 | keep | 2.400000 | LEARNING_RATE 3e-3 -> 6e-3 |" in prompt
    assert "| 3 | crash | - | remove the layer norm |" in prompt
    assert "Best so far: val_bpb 2.400000 (experiment 1, commit 0000001)" in prompt
    assert "experiment 4" in prompt


def test_harness_mode_asks_for_one_change_to_train_py_only_and_a_description_file(workspace: Path) -> None:
    prompt = build_prompt(workspace, 4, HISTORY, "harness")
    assert "exactly one change to `train.py`" in prompt
    assert "Do not run training" in prompt
    assert "Do not touch any other file" in prompt
    assert "`.mat-description`" in prompt
    assert "results.tsv" not in prompt.split("---")[-1]


def test_agent_mode_asks_for_one_whole_experiment_then_stop(workspace: Path) -> None:
    prompt = build_prompt(workspace, 4, HISTORY, "agent")
    task = prompt.split("## Your task")[-1]
    for step in (
        "git commit",
        "python train.py > run.log 2>&1",
        "results.tsv",
        "2.400000",
        ".mat-description",
    ):
        assert step in task
    assert "Do not start another experiment" in task


def test_agent_mode_baseline_runs_train_py_unchanged(workspace: Path) -> None:
    prompt = build_prompt(workspace, 0, [], "agent")
    assert "None yet: this is the first experiment." in prompt
    assert "This is the baseline: do not edit `train.py`" in prompt


def test_a_long_history_keeps_baseline_keeps_and_recent_rows(workspace: Path) -> None:
    history = [result(0, "keep", 3.0, "baseline")]
    history += [result(i, "discard", 3.1, f"try {i}") for i in range(1, 100)]
    history[50] = result(50, "keep", 2.9, "the only win")
    prompt = build_prompt(workspace, 100, history, "harness")
    assert "| 0 | keep |" in prompt and "| 50 | keep |" in prompt and "| 99 | discard |" in prompt
    assert "| 5 | discard |" not in prompt
    assert "older discarded or crashed experiments not shown" in prompt
    assert len(prompt) < len((workspace / "program.md").read_text()) + 4000


def test_an_unknown_mode_is_a_config_error(workspace: Path) -> None:
    with pytest.raises(ConfigError, match="training.mode"):
        build_prompt(workspace, 1, [], "solo")


@pytest.mark.parametrize("kind", ["builtin", "autoresearch"])
def test_the_prompt_names_the_exact_training_command_of_the_workspace(workspace: Path, kind: str) -> None:
    """The command is the one mat derives for the workspace (train_command_for), never a bare `python`."""
    from multiagenttrainer.workspace.setup import train_command_for

    command = train_command_for(kind, workspace)  # type: ignore[arg-type]
    assert command[0] != "python"
    agent_task = build_prompt(workspace, 4, HISTORY, "agent", command).split("## Your task")[-1]
    assert f"Run `{shlex.join(command)} > run.log 2>&1` in this directory" in agent_task
    assert "`python train.py" not in agent_task
    harness_task = build_prompt(workspace, 4, HISTORY, "harness", command).split("## Your task")[-1]
    assert f"mat runs `{shlex.join(command)}`" in harness_task


def test_a_uv_workspace_prompt_says_uv_run(workspace: Path) -> None:
    task = build_prompt(workspace, 2, HISTORY, "agent", ["uv", "run", "train.py"]).split("## Your task")[-1]
    assert "Run `uv run train.py > run.log 2>&1`" in task
