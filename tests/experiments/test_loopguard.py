"""The experiment loop cannot be gamed by the agent it runs (issue 9).

Each attack is a real agent executable in tests/assets/agents. The built-in template's tests train for
MAT_FIXED_STEPS=3 steps and are scored independently (a second process per experiment); the git-trap
and data tests use the trivial train.py, whose val_bpb is a known function of its constants.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from multiagenttrainer.config import AutoresearchConfig, TrainingConfig
from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.report import render_report_markdown
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.setup import Workspace
from tests.support.experiments import (
    REPO_ROOT,
    ByExperiment,
    ScheduleAgent,
    install_train_py,
    trivial_val_bpb,
)

AGENTS = REPO_ROOT / "tests" / "assets" / "agents"


def command_agent(script: str) -> object:
    from multiagenttrainer.agents.command import CommandAgent

    return CommandAgent(str(AGENTS / script), name=script)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def run(runner: Runner, workspace: Workspace, **kwargs: int) -> list[ExperimentResult]:
    return asyncio.run(runner.run_experiments(workspace, **kwargs))


def builtin_run(
    tmp_path: Path, corpus: Path, agents: dict[int, object], name: str
) -> tuple[Runner, Workspace]:
    runner = Runner(
        AutoresearchConfig(train_time=60),
        TrainingConfig(max_experiments=len(agents) + 1),
        name,
        output_dir=tmp_path,
        agent=ByExperiment(agents),
    )
    workspace = runner.setup_workspace(corpus)
    workspace.env["MAT_FIXED_STEPS"] = "3"
    return runner, workspace


def reverted(result: ExperimentResult) -> set[tuple[str, str, str]]:
    return {(item["path"], item["change"], item["by"]) for item in result.reverted}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_evaluator_edits_hidden_from_git_and_faked_numbers_never_count(
    tmp_path: Path, tiny_corpus_dir: Path
) -> None:
    agents = {
        1: command_agent("skip_worktree_prepare.py"),
        2: command_agent("fake_val_bpb.py"),
        3: command_agent("import_own_module.py"),
    }
    runner, workspace = builtin_run(tmp_path, tiny_corpus_dir, agents, "hidden")
    prepare_before = (workspace.path / "prepare.py").read_bytes()
    results = run(runner, workspace)
    run_dir = tmp_path / str(runner.run_id)
    baseline, hidden, faked, own_module = results

    # skip-worktree edit of evaluate_bpb (`return 0.123`): found by content, reverted, noted; honest score
    assert hidden.status == "keep" and hidden.val_bpb is not None and hidden.val_bpb > 1.0
    assert hidden.notes == ["reverted edits to prepare.py"]
    assert ("prepare.py", "modified", "agent") in reverted(hidden)
    printed = hidden.evaluation["printed_val_bpb"]
    assert printed > 1.0 and hidden.evaluation["rescored_val_bpb"] == pytest.approx(printed, abs=1e-6)
    assert "S prepare.py" not in git(workspace.path, "ls-files", "-v")  # the index bit is gone too
    assert (workspace.path / "prepare.py").read_bytes() == prepare_before

    # train.py printing a constant: the independent evaluation does not reproduce it
    assert faked.status == "crash" and faked.val_bpb is None
    assert (faked.error or "").startswith("val_bpb printed by train.py (0.123000) does not match the ")
    assert f"({faked.evaluation['rescored_val_bpb']:.6f})" in (faked.error or "")

    # its own module, hidden through .git/info/exclude: removed before training, which then fails
    assert own_module.status == "crash" and "No module named 'helpers'" in (own_module.error or "")
    assert ("helpers.py", "added", "agent") in reverted(own_module)
    assert not (workspace.path / "helpers.py").exists()

    # the recorded number is the held-out score of the checkpoint; every experiment has its fingerprint
    state = json.loads((run_dir / "run.json").read_text())
    assert [e["val_bpb"] for e in state["experiments"][:2]] == [baseline.val_bpb, hidden.val_bpb]
    assert baseline.evaluation["val_bpb"] == baseline.val_bpb != baseline.evaluation["rescored_val_bpb"]
    assert {e["evaluator_hash"] for e in state["experiments"] if e["status"] != "crash"} == {
        state["evaluator"]["hash"]
    }
    assert (run_dir / "results.tsv").read_text().splitlines()[2].startswith(f"{hidden.commit[:7]}\t")
    rows = read_results(run_dir / "results.tsv")
    recorded = [None if r.val_bpb is None else round(r.val_bpb, 6) for r in results]
    assert [row.val_bpb for row in rows] == recorded


def test_training_that_changes_the_evaluator_cheats_causally_or_saves_nothing_crashes(
    tmp_path: Path, tiny_corpus_dir: Path
) -> None:
    agents = {
        1: command_agent("tamper_during_training.py"),
        2: command_agent("peek_ahead.py"),
        3: command_agent("drop_checkpoint.py"),
    }
    runner, workspace = builtin_run(tmp_path, tiny_corpus_dir, agents, "tamper")
    ws = workspace.path
    data_before = {name: sha256(ws / "data" / name) for name in ("train.bin", "val.bin")}
    results = run(runner, workspace)
    _, tampered, peeking, no_checkpoint = results

    assert [r.status for r in results] == ["keep", "crash", "crash", "crash"]
    assert (tampered.error or "").startswith(
        "the training run changed the evaluator (data/val.bin, prepare.py)"
    )
    assert {("data/val.bin", "modified", "training"), ("prepare.py", "modified", "training")} <= reverted(
        tampered
    )
    assert {name: sha256(ws / "data" / name) for name in data_before} == data_before
    assert "changed while training" not in (ws / "prepare.py").read_text()

    assert "depend on later bytes of its input" in (peeking.error or "")
    assert peeking.evaluation["causality"]["passed"] is False

    assert (no_checkpoint.error or "").startswith("train.py saved no checkpoint")

    report = render_report_markdown(runner.state)  # type: ignore[arg-type]
    assert "## Changes mat reverted" in report
    assert "- Experiment 1, by the training run: " in report and "data/val.bin (modified)" in report


def test_git_traps_planted_by_the_agent_never_run_in_mats_git_calls_nor_on_resume(
    tmp_path: Path, corpus_dir: Path
) -> None:
    trap_dir = tmp_path / "traps"
    agents = {
        1: command_agent("plant_git_traps.py"),
        2: command_agent("edit_data.py"),
    }
    runner = Runner(
        AutoresearchConfig(train_time=60),
        TrainingConfig(max_experiments=3),
        "traps",
        output_dir=tmp_path / "runs",
        agent=ByExperiment(agents),
    )
    workspace = runner.setup_workspace(corpus_dir)
    install_train_py(workspace)
    workspace.env["MAT_TEST_TRAP_DIR"] = str(trap_dir)
    run_dir = tmp_path / "runs" / str(runner.run_id)
    val_sha = sha256(workspace.path / "data" / "val.bin")
    results = run(runner, workspace)

    assert (trap_dir / "armed").is_file(), "the traps should fire for a git that reads the agent's config"
    prompt = (run_dir / "prompts" / "exp-001.md").read_text()  # what the command agent was given
    assert f"mat runs `{shlex.join(workspace.train_command)}`" in prompt
    assert {"included-fsmonitor", "filter", "external-diff"} <= set((trap_dir / "armed").read_text().split())
    assert not (trap_dir / "fired").exists(), (trap_dir / "fired").read_text()
    planted = results[1]
    assert planted.status == "keep" and planted.val_bpb == trivial_val_bpb(0.002)
    assert {(".git/config", "modified", "agent"), (".gitattributes", "added", "agent")} <= reverted(planted)
    assert (".git/info/attributes", "added", "agent") in reverted(planted)
    assert (".git/hooks/post-commit", "added", "agent") in reverted(planted)
    ws_git = workspace.path / ".git"
    assert (ws_git / "config").read_bytes() == (run_dir / "evaluator" / "git" / "config").read_bytes()
    assert not (ws_git / "info" / "attributes").exists() and list((ws_git / "hooks").iterdir()) == []

    edited = results[2]  # data/val.bin appended to, data/extra.bin added: both undone before training
    assert edited.val_bpb == trivial_val_bpb(0.003)
    assert {("data/val.bin", "modified", "agent"), ("data/extra.bin", "added", "agent")} <= reverted(edited)
    assert sha256(workspace.path / "data" / "val.bin") == val_sha
    assert not (workspace.path / "data" / "extra.bin").exists()

    # A run killed right after an agent planted its traps: resuming runs none of them either.
    subprocess.run(
        [str(AGENTS / "plant_git_traps.py")],
        cwd=workspace.path,
        env={"PATH": "/usr/bin:/bin", "MAT_TEST_TRAP_DIR": str(trap_dir)},
        check=True,
        capture_output=True,
    )
    runner, workspace = Runner.resume(str(run_dir), agent=ScheduleAgent({3: {"LEARNING_RATE": "0.001"}}))
    more = run(runner, workspace, max_experiments=4)
    assert more[3].status == "keep" and more[3].val_bpb == trivial_val_bpb(0.001)
    assert not (trap_dir / "fired").exists(), (trap_dir / "fired").read_text()
    assert gitops.changed_paths(workspace.path) == []


def test_agent_mode_rows_are_rescored_from_the_checkpoint(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    runner, workspace = builtin_run(
        tmp_path, tiny_corpus_dir, {1: command_agent("agent_mode_fake_row.py")}, "agent-mode"
    )
    runner.training = runner.training.model_copy(update={"mode": "agent"})
    workspace.env["MAT_TEST_PYTHON"] = sys.executable
    results = run(runner, workspace)
    faked = results[1]
    assert faked.status == "crash" and faked.val_bpb is None
    assert (faked.error or "").startswith("val_bpb printed by train.py (0.100000) does not match the ")
    assert faked.notes[-1] == "the agent recorded keep with val_bpb 0.1"
    assert gitops.head_sha(workspace.path) == workspace.baseline_commit
