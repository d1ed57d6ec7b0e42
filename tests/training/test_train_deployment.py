"""The train deployment as its users run it: `mat train --deployment` followed in the terminal, what the UI
shows of each experiment, Ctrl-C (cancel or leave running), Retry resuming the same run, one run at a time
per output directory for train and nightly, and the experiments-on-machine deployment.

One worker (`mat worker start`) serves the mat-local pool for the module; training runs the built-in
template for MAT_FIXED_STEPS=3 steps, about ten seconds per experiment here.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterName
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment

from deployments.register import register_deployments
from multiagenttrainer.experiments.run_state import load_run
from multiagenttrainer.progress import PROGRESS_LOGGER
from tests.support.prefect_runs import (
    mat_workers,
    pause_schedules,
    read_flow_run,
    task_runs_of,
    wait_for_flow_run,
    wait_until_worker_done,
)
from tests.training.conftest import AGENTS, MAT, ROOT, mat_env, results_rows, wait_until, write_config

pytestmark = pytest.mark.integration
FOLLOW_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def worker(prefect_api: str) -> Iterator[None]:
    """The deployments this module runs, and a worker for mat-local (no cron: nightly's schedule is off)."""
    register_deployments(ROOT, only=["train", "nightly", "experiments-on-machine"])
    pause_schedules("nightly/nightly")
    with mat_workers(mat_env()):
        yield


def mat_train(*args: str, timeout: float = FOLLOW_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MAT, "train", "--deployment", *args], cwd=ROOT, env=mat_env(), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def flow_run_id_in(text: str) -> str:
    match = re.search(r"flow run \S+ \(([0-9a-f-]{36})\) submitted", text)
    assert match, text
    return match.group(1)


def test_a_followed_run_prints_the_in_process_lines_and_the_ui_shows_each_experiment(
    worker: None, tiny_source: Path, tmp_path: Path
) -> None:
    agent = f"{sys.executable} {AGENTS / 'break_train.py'}"
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 2, "agent_command": agent})

    followed = mat_train("--config", str(config), "--name", "shown")

    assert followed.returncode == 0, followed.stdout + followed.stderr
    lines = followed.stdout.splitlines()
    run_dir = (tmp_path / "runs").resolve()
    (run_id,) = [p.name for p in run_dir.iterdir()]
    assert lines[0] == f"corpus: {(tmp_path / 'corpus').resolve()} (built)"
    assert lines[1] == f"run {run_id}: 2 experiments in {run_dir / run_id}"
    assert re.fullmatch(r"\[1/2\] keep val_bpb \d\.\d{6} \d+\.\ds  baseline", lines[2]), lines[2]
    assert re.fullmatch(r"\[2/2\] crash \d+\.\ds  break train.py with a syntax error \(.*\)", lines[3]), (
        lines[3]
    )
    assert lines[4:] == [
        f"run {run_id} completed: {run_dir / run_id}",
        f"report: {run_dir / run_id / 'report.md'}",
    ]

    flow_run_id = flow_run_id_in(followed.stderr)
    experiments = [t for t in task_runs_of(flow_run_id) if t.name.startswith("experiment-")]
    assert [t.name for t in experiments] == [
        "experiment-0: baseline",
        "experiment-1: break train.py with a syntax error",
    ]
    baseline, crashed = (t.state for t in experiments)
    assert baseline is not None and (baseline.type.value, baseline.name) == ("COMPLETED", "Keep")
    assert crashed is not None and (crashed.type.value, crashed.name) == ("FAILED", "Crash")
    assert crashed.message and "training exited with code 1" in crashed.message
    assert read_flow_run(flow_run_id).state.type.value == "COMPLETED"  # a crash is a result, not a failure
    with get_client(sync_client=True) as client:
        of_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)]))
        logs = client.read_logs(of_run, limit=200)
    crash_lines = [log.message for log in logs if "failed with state: Crash(" in log.message]
    assert crash_lines and not [line for line in crash_lines if "NoneType: None" in line], crash_lines
    with get_client(sync_client=True) as client:
        (report,) = [a for a in client.read_artifacts() if a.key == "mat-report-shown"][:1]
    assert "![val_bpb per experiment](data:image/png;base64,iVBOR" in str(report.data)  # the plot, inline


def test_ctrl_c_without_a_terminal_leaves_the_run_going_and_says_how_to_cancel(
    worker: None, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 2})
    log = tmp_path / "follow.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [*MAT, "train", "--deployment", "--config", str(config), "--name", "left"], cwd=ROOT,
            env=mat_env(), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wait_until(lambda: "experiments in" in log.read_text(), 300, "the run to start")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, log.read_text()

    flow_run_id = flow_run_id_in(log.read_text())
    assert f"cancel it with `prefect flow-run cancel {flow_run_id}`" in log.read_text()
    assert read_flow_run(flow_run_id).state.type.value == "RUNNING"  # left running, as asked
    wait_for_flow_run(flow_run_id, {"COMPLETED"})
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert len(results_rows(run_dir / "results.tsv")) == 2


def read_until(fd: int, pattern: str, timeout_s: float) -> str:
    """Read a pseudo-terminal until `pattern` (a regex) shows up; what was read."""
    text, deadline = "", time.monotonic() + timeout_s
    while not re.search(pattern, text):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {pattern!r} within {timeout_s} s in:\n{text}")
        if select.select([fd], [], [], min(remaining, 1.0))[0]:
            try:
                text += os.read(fd, 4096).decode("utf-8", "replace")
            except OSError:  # the other side closed
                break
    return text


def test_ctrl_c_on_a_terminal_can_cancel_and_a_machine_can_finish_the_run(
    worker: None, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 3})
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [*MAT, "train", "--deployment", "--config", str(config), "--name", "cancelled"], cwd=ROOT,
        env=mat_env(), stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    try:
        seen = read_until(master, r"\[1/3\] keep", 300)
        process.send_signal(signal.SIGINT)
        seen += read_until(master, r"Cancel the flow run \(c\) or leave it running \(l\)\?", 30)
        os.write(master, b"c\n")
        seen += read_until(master, r"flow run \S+: Cancel", 120)
        assert process.wait(timeout=30) == 130, seen
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)

    flow_run_id = flow_run_id_in(seen)
    assert read_flow_run(flow_run_id).state.type.value == "CANCELLED"
    (run_dir,) = (tmp_path / "runs").iterdir()
    wait_until(lambda: load_run(run_dir).status != "running", 30, "the run to record how it ended")
    done = len(results_rows(run_dir / "results.tsv"))
    assert load_run(run_dir).status == "interrupted" and 1 <= done < 3

    # The rest of the run, on a machine, through the experiments-on-machine deployment.
    parameters = {
        "run_id": run_dir.name,
        "machine": "local",
        "output_dir": str(run_dir.parent),
        "config_path": str(config),
    }
    child = run_deployment("experiments-on-machine/experiments-on-machine", parameters=parameters, timeout=0)
    assert wait_for_flow_run(child.id, {"COMPLETED", "FAILED", "CRASHED"}).state.type.value == "COMPLETED"
    state = load_run(run_dir)
    assert state.status == "completed" and [e.experiment_id for e in state.experiments] == [0, 1, 2]
    assert len(results_rows(run_dir / "results.tsv")) == 3 and list((tmp_path / "runs").iterdir()) == [
        run_dir
    ]


def test_retry_of_a_killed_train_flow_run_resumes_the_same_run(
    worker: None, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 3})
    flow_run = run_deployment(
        "train/train", parameters={"config_path": str(config), "name": "retried"}, timeout=0
    )
    runs = tmp_path / "runs"
    wait_until(
        lambda: any(len(results_rows(p / "results.tsv")) == 1 for p in runs.glob("*")), 300, "experiment 0"
    )
    (run_dir,) = runs.iterdir()
    os.kill(load_run(run_dir).pid, signal.SIGKILL)  # the flow process, in the middle of experiment 1
    wait_for_flow_run(flow_run.id, {"CRASHED", "FAILED"})
    wait_until_worker_done(flow_run.id)  # as a user clicking Retry would, after the worker reported it

    retried = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run.id)],
        env=mat_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert wait_for_flow_run(flow_run.id, {"COMPLETED", "FAILED", "CRASHED"}).state.type.value == "COMPLETED"

    assert list(runs.iterdir()) == [run_dir]  # the same run, not a new one
    state = load_run(run_dir)
    assert state.status == "completed" and state.flow_run_id == str(flow_run.id)
    assert [e.experiment_id for e in state.experiments] == [0, 1, 2]  # nothing repeated
    assert len(results_rows(run_dir / "results.tsv")) == 3


def test_train_and_nightly_deployment_runs_on_one_output_do_not_overlap(
    worker: None, tiny_source: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"  # the agent of whichever run goes first waits for it: the runs overlap
    agent = f"{sys.executable} {AGENTS / 'wait_for_gate.py'} {gate}"
    # two experiments each: the baseline, then one the agent is asked for (and holds until the gate opens)
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 2, "agent_command": agent})
    started = [
        run_deployment("train/train", parameters={"config_path": str(config), "name": "daytime"}, timeout=0),
        run_deployment(
            "nightly/nightly", parameters={"config_path": str(config), "max_experiments": 2}, timeout=0
        ),
    ]
    runs_dir = (tmp_path / "runs").resolve()
    waiting: list[Any] = []

    def one_is_waiting() -> bool:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(  # the newest: the session's earlier runs logged hundreds of lines
                LogFilter(name=LogFilterName(any_=[PROGRESS_LOGGER])), limit=200, sort=LogSort.TIMESTAMP_DESC
            )
        waiting[:] = [
            log for log in logs if f"writes into {runs_dir}; waiting for it to finish" in log.message
        ]
        return bool(waiting)

    wait_until(one_is_waiting, FOLLOW_TIMEOUT_S, "one run to wait for the other", interval_s=1)
    gate.touch()
    for flow_run in started:
        assert (
            wait_for_flow_run(flow_run.id, {"COMPLETED", "FAILED", "CRASHED"}).state.type.value == "COMPLETED"
        )

    first, second = sorted((load_run(p) for p in (tmp_path / "runs").iterdir()), key=lambda s: s.created_at)
    assert {first.name, second.name} == {"daytime", "nightly"}
    assert first.finished_at is not None and first.finished_at <= second.created_at  # one after the other
    one_is_waiting()
    assert len(waiting) == 1 and UUID(str(waiting[0].flow_run_id))
