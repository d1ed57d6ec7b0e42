"""Resuming after a kill (SIGKILL included), stopping on SIGTERM, and several runs in one output dir."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.experiments.loop import LoopOptions
from multiagenttrainer.experiments.results import RESULTS_HEADER, read_results
from multiagenttrainer.experiments.run_state import load_run
from multiagenttrainer.experiments.runner import RECOVERED_NOTE, Runner, claim_run_dir
from multiagenttrainer.workspace import gitops
from tests.support.experiments import REPO_ROOT, ScheduleAgent, new_trivial_run, processes_with, wait_for

SCHEDULE = {i: {"LEARNING_RATE": str(0.004 - 0.0005 * i)} for i in range(1, 10)}  # every change is a keep


def start_slow_run(output_dir: Path, corpus: Path, marker: str) -> tuple[subprocess.Popen[str], str]:
    """A `python -c` running 5 experiments, the third training for 300 s; returns (process, run id)."""
    code = (
        "from tests.support.experiments import slow_run_main; "
        f"slow_run_main({str(output_dir)!r}, {str(corpus)!r}, 2, {marker!r})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.stderr.read() if proc.stderr else ""
    return proc, run_id


def wait_until_training(run_dir: Path, experiment_id: int, marker: str) -> None:
    def training() -> bool:
        try:
            state = load_run(run_dir)
        except (OSError, ValueError):
            return False
        current = [(c.experiment_id, c.phase) for c in state.current]
        return current == [(experiment_id, "training")] and bool(processes_with(marker))

    wait_for(training, 60, f"experiment {experiment_id} to be training")


def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path: Path, corpus_dir: Path) -> None:
    marker = f"mat-test-{uuid.uuid4().hex}"
    proc, run_id = start_slow_run(tmp_path, corpus_dir, marker)
    run_dir = tmp_path / run_id
    try:
        wait_until_training(run_dir, 2, marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10  # nothing mat starts outlives it: the training process dies too
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == [], "the killed run's training process should die with it"
        assert load_run(run_dir).effective_status() == "interrupted"

        runner, workspace = Runner.resume(run_id, tmp_path, agent=ScheduleAgent(SCHEDULE))
        assert processes_with(marker) == []  # resume stopped what the dead run left running
        state = load_run(run_dir)
        assert state.status == "running" and state.pid == os.getpid() and state.current == []
        assert [e.experiment_id for e in state.experiments] == [0, 1]
        assert gitops.head_sha(workspace.path) == state.experiments[1].commit  # the best kept commit
        assert gitops.changed_paths(workspace.path) == []

        results = asyncio.run(runner.run_experiments(workspace))
    finally:
        proc.kill()
        proc.wait()
    assert [r.experiment_id for r in results] == [0, 1, 2, 3, 4]
    assert [r.description for r in results[1:]] == [
        f"LEARNING_RATE -> {0.004 - 0.0005 * i}" for i in range(1, 5)
    ]
    assert all(r.status == "keep" for r in results)
    text = (run_dir / "results.tsv").read_text()
    assert text.startswith(RESULTS_HEADER + "\n") and text.endswith("\n")
    assert [row.commit for row in read_results(run_dir / "results.tsv")] == [r.commit[:7] for r in results]
    final = load_run(run_dir)
    assert final.status == "completed" and len(final.experiments) == 5
    assert git_log(workspace.path)[:5] == [r.commit for r in reversed(results[1:])] + [
        workspace.baseline_commit
    ]


def git_log(workspace: Path) -> list[str]:
    return gitops.run_git(workspace, "rev-list", "HEAD").split()


def test_sigterm_stops_the_run_kills_training_and_marks_it_interrupted(
    tmp_path: Path, corpus_dir: Path
) -> None:
    marker = f"mat-test-{uuid.uuid4().hex}"
    proc, run_id = start_slow_run(tmp_path, corpus_dir, marker)
    try:
        wait_until_training(tmp_path / run_id, 2, marker)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0 and "mat train --resume" in stderr
    assert processes_with(marker) == []
    state = load_run(tmp_path / run_id)
    assert state.status == "interrupted" and state.current == []
    assert len(state.experiments) == 2 and len(read_results(tmp_path / run_id / "results.tsv")) == 2


def test_resume_reconciles_run_json_with_results_tsv(tmp_path: Path, corpus_dir: Path) -> None:
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "reconcile", agent=ScheduleAgent(SCHEDULE), max_experiments=3
    )
    results = asyncio.run(runner.run_experiments(workspace))
    run_dir = tmp_path / str(runner.run_id)
    # A kill after the row was appended but before run.json was rewritten, and a torn line after it.
    state = json.loads((run_dir / "run.json").read_text())
    state["experiments"] = state["experiments"][:2]
    state["status"], state["pid"] = "running", 0
    (run_dir / "run.json").write_text(json.dumps(state))
    with (run_dir / "results.tsv").open("a") as handle:
        handle.write("deadbee\t2.1")

    runner, workspace = Runner.resume(str(run_dir), agent=ScheduleAgent(SCHEDULE))  # a path works too
    recovered = runner.state.experiments[2] if runner.state else None
    assert recovered is not None and recovered.notes == [RECOVERED_NOTE]
    assert (recovered.commit, recovered.val_bpb, recovered.status) == (
        results[2].commit,
        results[2].val_bpb,
        "keep",
    )
    assert (run_dir / "results.tsv").read_text().endswith("\tkeep\tLEARNING_RATE -> 0.003\n")
    assert gitops.head_sha(workspace.path) == results[2].commit

    more = asyncio.run(runner.run_experiments(workspace, max_experiments=4))
    assert [r.experiment_id for r in more] == [0, 1, 2, 3]
    assert more[3].description == "LEARNING_RATE -> 0.0025"


def test_resume_restores_rows_that_results_tsv_lost_from_run_json(tmp_path: Path, corpus_dir: Path) -> None:
    """results.tsv is written before run.json, so a row run.json knows and the table lacks was lost from the
    table (damage, an edit): it is written back, never dropped, and the experiment is not run again."""
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "trim", agent=ScheduleAgent(SCHEDULE), max_experiments=3
    )
    results = asyncio.run(runner.run_experiments(workspace))
    run_dir = tmp_path / str(runner.run_id)
    lines = (run_dir / "results.tsv").read_text().splitlines(keepends=True)
    (run_dir / "results.tsv").write_text("".join(lines[:-1]))
    runner, workspace = Runner.resume(runner.run_id or "", tmp_path, agent=ScheduleAgent(SCHEDULE))
    assert [e.experiment_id for e in runner.state.experiments] == [0, 1, 2] if runner.state else False
    assert (run_dir / "results.tsv").read_text().splitlines(keepends=True) == lines
    assert gitops.head_sha(workspace.path) == results[2].commit
    again = asyncio.run(runner.run_experiments(workspace))
    assert [r.description for r in again] == [r.description for r in results]


def test_resume_refuses_a_run_that_is_still_running_and_unknown_runs(
    tmp_path: Path, corpus_dir: Path
) -> None:
    runner, _ = new_trivial_run(tmp_path, corpus_dir, "busy", agent=ScheduleAgent(SCHEDULE))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = tmp_path / str(runner.run_id)
        state = json.loads((run_dir / "run.json").read_text())
        state["pid"] = owner.pid
        (run_dir / "run.json").write_text(json.dumps(state))
        with pytest.raises(ExperimentError, match=f"still running \\(pid {owner.pid}\\)"):
            Runner.resume(str(runner.run_id), tmp_path)
    finally:
        owner.kill()
        owner.wait()
    with pytest.raises(ExperimentError, match="no run 'nope'"):
        Runner.resume("nope", tmp_path)


def test_two_runners_with_different_names_share_an_output_dir(tmp_path: Path, corpus_dir: Path) -> None:
    alpha, alpha_ws = new_trivial_run(
        tmp_path, corpus_dir, "alpha", agent=ScheduleAgent(SCHEDULE), max_experiments=3
    )
    beta, beta_ws = new_trivial_run(
        tmp_path, corpus_dir, "beta", agent=ScheduleAgent(SCHEDULE), max_experiments=3
    )

    async def both() -> list[list[object]]:
        return await asyncio.gather(alpha.run_experiments(alpha_ws), beta.run_experiments(beta_ws))  # type: ignore[return-value]

    results = asyncio.run(both())
    assert [len(r) for r in results] == [3, 3]
    assert alpha.run_id != beta.run_id and {alpha.run_id.split("-")[-1], beta.run_id.split("-")[-1]} == {
        "alpha",
        "beta",
    }  # type: ignore[union-attr]
    for runner, ws in ((alpha, alpha_ws), (beta, beta_ws)):
        run_dir = tmp_path / str(runner.run_id)
        assert len(read_results(run_dir / "results.tsv")) == 3
        assert load_run(run_dir).status == "completed"
        assert ws.path.parent == run_dir and gitops.current_branch(ws.path) == f"autoresearch/{runner.run_id}"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the shared handler was put back


def test_run_ids_are_unique_and_safe(tmp_path: Path) -> None:
    now = datetime(2025, 1, 2, 3, 4, 5)
    first = claim_run_dir(tmp_path, "my run/1", now)
    second = claim_run_dir(tmp_path, "my run/1", now)
    assert (first.name, second.name) == ("20250102-030405-my-run-1", "20250102-030405-my-run-1-2")
    assert claim_run_dir(tmp_path, "../..", now).name == "20250102-030405-run"


def test_cancelling_run_experiments_kills_training_and_marks_the_run_interrupted(
    tmp_path: Path, corpus_dir: Path
) -> None:
    marker = f"mat-test-{uuid.uuid4().hex}"
    runner, workspace = new_trivial_run(
        tmp_path, corpus_dir, "cancel", agent=ScheduleAgent({1: {"SLEEP_S": "300"}}), max_experiments=3,
        options=LoopOptions(timeout_margin_s=600),
    )  # fmt: skip
    workspace.train_command = [*workspace.train_command, marker]
    run_dir = tmp_path / str(runner.run_id)

    async def cancel_while_training() -> None:
        task = asyncio.create_task(runner.run_experiments(workspace))
        while not (
            [(c.experiment_id, c.phase) for c in load_run(run_dir).current] == [(1, "training")]
            and processes_with(marker)
        ):
            assert not task.done()
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_while_training(), 60))
    assert processes_with(marker) == []
    state = load_run(run_dir)
    assert state.status == "interrupted" and state.current == [] and len(state.experiments) == 1
    assert len(read_results(run_dir / "results.tsv")) == 1
