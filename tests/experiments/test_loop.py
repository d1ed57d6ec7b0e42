"""The experiment loop through the Runner API, with real training runs, real git and real agent processes.

One test trains the built-in template (torch, fixed steps); the others use a trivial train.py whose
val_bpb is a known function of its constants, so every keep/discard/crash is predictable.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from multiagenttrainer.agents.command import CommandAgent
from multiagenttrainer.config import AutoresearchConfig, TrainingConfig
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.experiments.loop import LoopOptions
from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.processes import pid_alive
from multiagenttrainer.render import TrainReporter
from multiagenttrainer.report import render_report_markdown
from multiagenttrainer.workspace import gitops
from tests.support.experiments import (
    REPO_ROOT,
    TRIVIAL_TRAIN_PY,
    ByExperiment,
    CommittingAgent,
    ProtocolAgent,
    ScheduleAgent,
    install_train_py,
    new_trivial_run,
    processes_with,
    trivial_val_bpb,
)

AGENTS = REPO_ROOT / "tests" / "assets" / "agents"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def command_agent(script: str) -> CommandAgent:
    return CommandAgent(str(AGENTS / script), name=script)


def branch_commits(workspace: Path) -> list[str]:
    return git(workspace, "rev-list", "HEAD").split()


def run(runner: Runner, workspace: object, **kwargs: int) -> list[ExperimentResult]:
    return asyncio.run(runner.run_experiments(workspace, **kwargs))  # type: ignore[arg-type]


def test_builtin_template_end_to_end(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    schedule = {
        1: {"WARMUP_STEPS": "1"},  # full learning rate from the first step: learns more in 3 steps
        2: {"LEARNING_RATE": "0.0"},  # learns nothing: worse than the kept change
        3: {"N_HEAD": "4("},  # a syntax error: the run crashes
    }
    seen: list[ExperimentResult] = []
    runner = Runner(
        AutoresearchConfig(train_time=60),
        TrainingConfig(max_experiments=4),
        "e2e",
        output_dir=tmp_path / "runs",
        agent=ScheduleAgent(schedule),
        on_result=seen.append,
    )
    workspace = runner.setup_workspace(tiny_corpus_dir)
    workspace.env["MAT_FIXED_STEPS"] = "3"
    results = run(runner, workspace)

    run_dir = tmp_path / "runs" / str(runner.run_id)
    assert [r.status for r in results] == ["keep", "keep", "discard", "crash"]
    assert seen == results and [r.experiment_id for r in results] == [0, 1, 2, 3]
    baseline, kept, discarded, crashed = results
    assert kept.val_bpb is not None and baseline.val_bpb is not None and kept.val_bpb < baseline.val_bpb
    assert discarded.val_bpb is not None and discarded.val_bpb > kept.val_bpb
    assert crashed.val_bpb is None and "exited with code 1" in (crashed.error or "")
    assert "SyntaxError" in (crashed.error or "")
    assert baseline.summary["num_steps"] == 3 and baseline.memory_gb > 0

    lines = (run_dir / "results.tsv").read_text().splitlines()
    assert lines[0] == "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
    assert (
        lines[1] == f"{baseline.commit[:7]}\t{baseline.val_bpb:.6f}\t{baseline.memory_gb:.1f}\tkeep\tbaseline"
    )
    assert lines[2].endswith("\tkeep\tWARMUP_STEPS -> 1") and lines[3].endswith(
        "\tdiscard\tLEARNING_RATE -> 0.0"
    )
    assert lines[4] == f"{crashed.commit[:7]}\t0.000000\t0.0\tcrash\tN_HEAD -> 4("

    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "completed" and state["current"] == []
    assert [e["status"] for e in state["experiments"]] == ["keep", "keep", "discard", "crash"]
    assert state["best"] == {"experiment_id": 1, "commit": kept.commit, "val_bpb": kept.val_bpb}
    assert state["baseline_val_bpb"] == baseline.val_bpb
    assert state["workspace"]["env"]["MAT_FIXED_STEPS"] == "3"

    for index in range(4):
        assert (run_dir / f"logs/exp-{index:03d}.log").is_file()
    assert "val_bpb:" in (run_dir / "logs/exp-001.log").read_text()
    assert "WARMUP_STEPS -> 1" in (run_dir / "logs/exp-001.agent.log").read_text()

    ws = workspace.path
    assert branch_commits(ws) == [kept.commit, workspace.baseline_commit]  # kept on the branch, the rest gone
    assert git(ws, "log", "-1", "--format=%s") == "WARMUP_STEPS -> 1\n"
    assert git(ws, "cat-file", "-t", discarded.commit) == "commit\n"  # trained, then reset away
    assert "WARMUP_STEPS = 1" in (ws / "train.py").read_text() and gitops.changed_paths(ws) == []


def test_crash_no_change_and_reverted_edits_with_agent_processes(tmp_path: Path, corpus_dir: Path) -> None:
    agents = {
        1: command_agent("break_train.py"),
        2: command_agent("noop.py"),
        3: command_agent("edit_prepare.py"),
        4: command_agent("edit_constant.py"),
    }
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "agents", agent=ByExperiment(agents), max_experiments=5
    )
    prepare_before = (workspace.path / "prepare.py").read_text()
    results = run(runner, workspace)
    run_dir = tmp_path / str(runner.run_id)

    assert [r.status for r in results] == ["keep", "crash", "crash", "keep", "keep"]
    broken, unchanged, one_layer, lowered = results[1:]
    assert broken.description == "break train.py with a syntax error"
    assert "training exited with code 1" in (broken.error or "") and "SyntaxError" in (broken.error or "")
    assert unchanged.error is not None and unchanged.error.startswith("agent made no change to train.py")
    assert unchanged.commit == workspace.baseline_commit and not (run_dir / "logs/exp-002.log").exists()
    assert (
        one_layer.description
        == "one layer, and a smaller evaluation in prepare.py (reverted edits to prepare.py)"
    )
    assert one_layer.notes == ["reverted edits to prepare.py"]
    assert one_layer.val_bpb == trivial_val_bpb(0.004, n_layer=1)
    assert (
        lowered.val_bpb == trivial_val_bpb(0.001, n_layer=1)
        and lowered.description == "set LEARNING_RATE to 1e-3"
    )

    ws = workspace.path
    assert (ws / "prepare.py").read_text() == prepare_before
    assert git(ws, "log", "--format=%s", "-3").splitlines() == [
        "set LEARNING_RATE to 1e-3",
        "one layer, and a smaller evaluation in prepare.py (reverted edits to prepare.py)",
        "baseline (test train.py)",
    ]
    assert git(ws, "show", "--stat", "--format=", "HEAD~1").split()[0] == "train.py"
    rows = read_results(run_dir / "results.tsv")
    assert [(r.status, r.commit) for r in rows] == [(r.status, r.commit[:7]) for r in results]


def test_an_agent_that_hangs_is_killed_with_its_children(tmp_path: Path, corpus_dir: Path) -> None:
    pid_file = tmp_path / "hang.pids"
    agents = {1: command_agent("hang.py"), 2: command_agent("edit_constant.py")}
    autoresearch, training = (
        AutoresearchConfig(train_time=60),
        TrainingConfig(max_experiments=3, agent_timeout=2),
    )
    runner = Runner(autoresearch, training, "hang", output_dir=tmp_path, agent=ByExperiment(agents))
    workspace = runner.setup_workspace(corpus_dir)
    install_train_py(workspace)
    workspace.env["MAT_TEST_PID_FILE"] = str(pid_file)
    started = time.monotonic()
    results = run(runner, workspace)
    assert time.monotonic() - started < 30
    assert [r.status for r in results] == ["keep", "crash", "keep"]
    assert (results[1].error or "").startswith("agent timed out after 2 s")
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2 and not any(map(pid_alive, pids))  # hang.py and its child sleep


def test_training_past_its_timeout_is_killed_and_the_loop_goes_on(tmp_path: Path, corpus_dir: Path) -> None:
    marker = f"mat-test-{uuid.uuid4().hex}"
    schedule = {1: {"SLEEP_S": "3600", "SPAWN_CHILD": "True"}, 2: {"LEARNING_RATE": "0.002"}}
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "timeout", agent=ScheduleAgent(schedule), max_experiments=3,
        options=LoopOptions(timeout_margin_s=1.0),
    )  # fmt: skip
    workspace.train_time_s = 1  # limit: 2 x 1 s + 1 s
    workspace.train_command = [*workspace.train_command, marker]
    started = time.monotonic()
    results = run(runner, workspace)
    assert time.monotonic() - started < 30
    assert [r.status for r in results] == ["keep", "crash", "keep"]
    assert (results[1].error or "").startswith("training timed out after 3 s")
    assert "[mat] killed after 3 s" in (results[1].error or "")
    assert processes_with(marker) == []
    assert results[2].val_bpb == trivial_val_bpb(0.002)
    assert "SLEEP_S = 0.0" in (workspace.path / "train.py").read_text()


def test_an_agent_that_commits_itself_is_reverted_outside_train_py(tmp_path: Path, corpus_dir: Path) -> None:
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "commits", agent=CommittingAgent(), max_experiments=2
    )
    results = run(runner, workspace)
    assert results[1].status == "keep" and results[1].notes == ["reverted edits to prepare.py"]
    ws = workspace.path
    assert git(ws, "log", "--format=%s", "-2").splitlines() == [
        "LEARNING_RATE -> 0.002 (reverted edits to prepare.py)",
        "baseline (test train.py)",
    ]
    assert "the agent was here" not in (ws / "prepare.py").read_text()


def test_hooks_see_every_result_and_a_failing_hook_does_not_stop_the_loop(
    tmp_path: Path, corpus_dir: Path
) -> None:
    seen: list[int] = []

    def failing(result: ExperimentResult) -> None:
        raise RuntimeError("SES is down")

    schedule = {1: {"LEARNING_RATE": "0.003"}, 2: {"LEARNING_RATE": "0.005"}}
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "hooks", agent=ScheduleAgent(schedule), max_experiments=3,
        on_result=[failing, lambda r: seen.append(r.experiment_id)],
    )  # fmt: skip
    results = run(runner, workspace)
    assert seen == [0, 1, 2] and [r.status for r in results] == ["keep", "keep", "discard"]


def test_the_default_agent_is_the_builtin_search(tmp_path: Path, corpus_dir: Path) -> None:
    runner, workspace = new_trivial_run(tmp_path, corpus_dir, "default", max_experiments=3)
    results = run(runner, workspace)
    assert len(results) == 3 and results[0].description == "baseline"
    assert all(r.description and r.description != "baseline" for r in results[1:])
    frame = pd.read_csv(tmp_path / str(runner.run_id) / "results.tsv", sep="\t")
    assert (
        list(frame.columns) == ["commit", "val_bpb", "memory_gb", "status", "description"] and len(frame) == 3
    )


def test_agent_mode_adopts_the_agents_rows_and_keeps_the_best_commit(
    tmp_path: Path, corpus_dir: Path
) -> None:
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "agent-mode", agent=ProtocolAgent({1: "0.002", 2: "0.003"}), max_experiments=3
    )
    runner.training = runner.training.model_copy(update={"mode": "agent"})
    results = run(runner, workspace)
    run_dir = tmp_path / str(runner.run_id)
    assert [(r.status, r.val_bpb) for r in results] == [
        ("keep", trivial_val_bpb(0.004)),
        ("keep", trivial_val_bpb(0.002)),
        ("discard", trivial_val_bpb(0.003)),
    ]
    assert branch_commits(workspace.path)[0] == results[1].commit
    assert "val_bpb:" in (run_dir / "logs/exp-002.log").read_text()
    rows = (run_dir / "results.tsv").read_text().splitlines()
    assert rows[2] == f"{results[1].commit[:7]}\t2.100000\t1.1\tkeep\tLEARNING_RATE -> 0.002"
    assert len(rows) == 4 and (workspace.path / "results.tsv").is_symlink()


def test_agent_mode_reverts_a_kept_commits_other_files_and_records_missing_rows(
    tmp_path: Path, corpus_dir: Path
) -> None:
    agents = {
        1: ProtocolAgent({1: "0.002"}, touch_prepare=True),
        2: ProtocolAgent({2: "0.001"}, skip_row=True),
    }
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "agent-mode-2", agent=ByExperiment(agents), max_experiments=3
    )
    runner.training = runner.training.model_copy(update={"mode": "agent"})
    results = run(runner, workspace)
    assert [r.status for r in results] == ["keep", "keep", "crash"]
    kept = results[1]
    assert kept.notes == ["reverted edits to prepare.py"] and kept.description.endswith(
        "(reverted edits to prepare.py)"
    )
    ws = workspace.path
    assert branch_commits(ws)[:2] == [kept.commit, workspace.baseline_commit]
    assert git(ws, "show", "--stat", "--format=", "HEAD").split()[0] == "train.py"
    assert "EVAL_BYTES = 1\n" not in (ws / "prepare.py").read_text()
    assert (results[2].error or "").startswith("agent left no row in results.tsv")
    assert gitops.head_sha(ws) == kept.commit and "LEARNING_RATE = 0.002" in (ws / "train.py").read_text()


@pytest.mark.parametrize("max_experiments", [1])
def test_a_baseline_only_run_needs_no_agent(tmp_path: Path, corpus_dir: Path, max_experiments: int) -> None:
    training = TrainingConfig(max_experiments=max_experiments, mode="agent")  # make_agent would refuse this
    runner = Runner(AutoresearchConfig(), training, "solo", output_dir=tmp_path)
    workspace = runner.setup_workspace(corpus_dir)
    install_train_py(workspace)
    assert [r.description for r in run(runner, workspace)] == ["baseline"]


MISSING_PACKAGE_TRAIN_PY = "import mat_missing_package_for_tests  # noqa\n"
NO_GPU_TRAIN_PY = 'raise RuntimeError("Found no NVIDIA driver on your system. Please check your GPU")\n'


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (MISSING_PACKAGE_TRAIN_PY, "cannot import 'mat_missing_package_for_tests'; install the packages"),
        (NO_GPU_TRAIN_PY, "train.py needs a CUDA GPU and the machine that trains has none (Found no NVIDIA"),
    ],
)
def test_a_baseline_the_machine_cannot_run_stops_the_run_with_the_fix(
    tmp_path: Path, corpus_dir: Path, source: str, reason: str
) -> None:
    training = TrainingConfig(max_experiments=4)
    agent = ScheduleAgent({1: {"LEARNING_RATE": "0.002"}, 2: {"LEARNING_RATE": "0.003"}})
    runner = Runner(AutoresearchConfig(), training, "nogo", output_dir=tmp_path, agent=agent)
    workspace = runner.setup_workspace(corpus_dir)
    install_train_py(workspace, source)
    with pytest.raises(ExperimentError, match="the baseline crashed: ") as raised:
        run(runner, workspace)
    assert reason in str(raised.value) and "start a new run" in str(raised.value)
    run_dir = tmp_path / str(runner.run_id)
    rows = read_results(run_dir / "results.tsv")
    assert [(row.description, row.status) for row in rows] == [("baseline", "crash")]  # no experiment 1
    assert agent.requests == []
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "failed" and reason in state["error"]


def test_a_baseline_that_crashes_in_train_py_itself_lets_the_agents_fix_it(
    tmp_path: Path, corpus_dir: Path
) -> None:
    """Only the machine's shortcomings stop a run: an ordinary exception in the baseline does not."""
    runner = Runner(
        AutoresearchConfig(),
        TrainingConfig(max_experiments=2),
        "oops",
        output_dir=tmp_path,
        agent=ScheduleAgent({1: {"EXIT_CODE": "0"}}),
    )
    workspace = runner.setup_workspace(corpus_dir)
    install_train_py(workspace, TRIVIAL_TRAIN_PY.replace("EXIT_CODE = 0", "EXIT_CODE = 1"))
    results = run(runner, workspace)
    assert [r.status for r in results] == ["crash", "keep"]


def test_set_up_facts_and_how_often_the_corpus_repeats_reach_run_json_the_report_and_mat_train(
    tmp_path: Path, corpus_dir: Path
) -> None:
    """The baseline trains 10000 steps x BATCH_SIZE x SEQ_LEN tokens (the template's constants) over a corpus
    of far fewer tokens: the repeat count is recorded, and a warning shown, in every place a user looks."""
    printed = io.StringIO()
    reporter = TrainReporter(Console(file=printed, width=300))
    runner = Runner(AutoresearchConfig(), TrainingConfig(max_experiments=1), "repeats", output_dir=tmp_path)
    runner.hooks.append(lambda result: reporter.experiment_finished(result, runner.state))  # type: ignore[arg-type]
    workspace = runner.setup_workspace(corpus_dir)
    facts = dict(workspace.facts)
    assert facts["tokens_per_step"] == 16 * 128 and facts["train_tokens"] > 0
    held_out = runner.run_dir / "evaluator" / "holdout" / "val.bin" if runner.run_dir else None
    assert held_out is not None and facts["val_tokens"] == held_out.stat().st_size > 0  # what mat scores on
    install_train_py(workspace, TRIVIAL_TRAIN_PY.replace("num_steps:        1", "num_steps:        10000"))
    assert runner.state is not None and runner.run_dir is not None
    reporter.run_started(runner.run_dir, runner.state)
    run(runner, workspace)

    repeats = round(10000 * 16 * 128 / facts["train_tokens"], 2)
    assert repeats > 10
    state = json.loads((runner.run_dir / "run.json").read_text())
    recorded = state["workspace"]["facts"]
    assert recorded["corpus_repeats"] == repeats
    assert recorded["corpus_repeats_how"].startswith(
        "the baseline trained 10000 steps x 2,048 tokens per step"
    )
    assert recorded["warning"].startswith(f"the corpus repeats about {repeats:.0f} times within one training")
    report = render_report_markdown(runner.state)  # what report.md holds
    assert "## Set-up" in report and f"- **Warning:** the corpus repeats about {repeats:.0f} times" in report
    assert f"- tokens: {facts['train_tokens']:,} to train on" in report
    lines = printed.getvalue().splitlines()
    assert f"  tokens: {facts['train_tokens']:,} to train on, {facts['val_tokens']:,} to validate on" in lines
    assert f"  the corpus repeats {repeats} times within one training budget" in lines
    assert (
        f"the corpus repeats {repeats} times within one training budget (the baseline trained 10000" in report
    )
    assert any(line.startswith(f"warning: the corpus repeats about {repeats:.0f} times") for line in lines)
