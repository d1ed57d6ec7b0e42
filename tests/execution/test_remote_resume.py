"""Resuming a run whose target is an SSH host: what the killed mat left training there is stopped first."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.experiments.runner import Runner
from tests.execution.helpers import SshConfig, new_marker
from tests.support.experiments import (
    REPO_ROOT,
    ScheduleAgent,
    library_records,
    processes_with,
    wait_for,
    write_corpus_dir,
)
from tests.support.sshd import Sshd, SshUser, pids_of_user

pytestmark = pytest.mark.integration


def test_resume_stops_the_training_a_killed_mat_left_on_the_host(
    sshd: Sshd, ssh_user: SshUser, ssh_config: SshConfig, tmp_path: Path
) -> None:
    corpus = write_corpus_dir(tmp_path / "corpus", library_records(limit=20))
    marker = new_marker()
    execution = ssh_config(sshd).model_dump_json()
    code = (
        "from tests.execution.helpers import slow_remote_run_main; "
        f"slow_remote_run_main({str(tmp_path)!r}, {str(corpus)!r}, {execution!r}, {marker!r})"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    try:
        on_host = lambda: [p for p in processes_with(marker) if p in pids_of_user(ssh_user.uid)]  # noqa: E731
        wait_for(lambda: bool(on_host()), 60, "experiment 1 training on the host")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert on_host()  # the host knows nothing of the kill: its training goes on
        agent = ScheduleAgent({1: {"LEARNING_RATE": "0.003"}, 2: {"LEARNING_RATE": "0.002"}})
        runner, workspace = Runner.resume(run_id, tmp_path, agent=agent)
        assert processes_with(marker) == []  # stopped through the ssh executor before anything else
        results = asyncio.run(runner.run_experiments(workspace))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert [r.status for r in results] == ["keep", "keep", "keep"]
    assert [r.machine for r in results] == ["ssh"] * 3
    assert len(read_results(tmp_path / run_id / "results.tsv")) == 3
