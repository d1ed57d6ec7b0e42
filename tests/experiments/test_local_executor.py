"""LocalExecutor: output to the log, exit codes, and no process left behind whatever happens."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from multiagenttrainer.config import DockerExecution, LocalExecution, SshExecution
from multiagenttrainer.errors import ConfigError, ExperimentError
from multiagenttrainer.execution import make_executor
from multiagenttrainer.execution.docker import DockerExecutor
from multiagenttrainer.execution.local import LocalExecutor
from multiagenttrainer.execution.registry import executor_class
from multiagenttrainer.execution.ssh import SshExecutor
from multiagenttrainer.processes import terminate_processes_in
from tests.support.experiments import processes_with, wait_for

PY = sys.executable
SLEEPER = "import time; time.sleep(3600)"
# Children that say when they are set up (argv[2] is created), so a kill never races their start.
READY = "import pathlib, sys; pathlib.Path(sys.argv[2]).touch(); "
PLAIN_CHILD = READY + "import time; time.sleep(3600)"
DEAF_CHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + READY + "time.sleep(3600)"
)
NEW_GROUP_CHILD = "import os, time; os.setpgid(0, 0); " + READY + "time.sleep(3600)"


@pytest.fixture
def marker() -> str:
    """A unique argument that marks this test's processes in /proc."""
    return f"mat-test-{uuid.uuid4().hex}"


def family_script(marker: str, then: str) -> list[str]:
    """bash starting three marked children (plain, SIGTERM-deaf, own group), waiting until all three are
    set up, then running `then`."""
    script = (
        f"{PY} -c '{PLAIN_CHILD}' {marker} ready.1 & "
        f"{PY} -c '{DEAF_CHILD}' {marker} ready.2 & "
        f"{PY} -c '{NEW_GROUP_CHILD}' {marker} ready.3 & "
        "until [ -e ready.1 ] && [ -e ready.2 ] && [ -e ready.3 ]; do sleep 0.02; done; "
        f"{then}"
    )
    return ["bash", "-c", script]


def test_output_exit_code_and_environment(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "exp-000.log"
    command = [
        PY,
        "-c",
        "import os, sys; print('out', os.environ['MAT_X']); print('err', file=sys.stderr); sys.exit(3)",
    ]
    outcome = LocalExecutor().run(tmp_path, command, 30, log, {"MAT_X": "42"})
    assert (outcome.exit_code, outcome.timed_out) == (3, False)
    assert log.read_text().split() == ["out", "42", "err"]
    assert 0 < outcome.duration_s < 30


def test_timeout_kills_the_whole_group_and_session(tmp_path: Path, marker: str) -> None:
    log = tmp_path / "run.log"
    command = family_script(marker, f"{PY} -c '{SLEEPER}' {marker}")
    outcome = LocalExecutor(grace_s=0.5).run(tmp_path, command, 3.0, log, {})
    assert outcome.timed_out and outcome.exit_code is None
    assert 3.5 <= outcome.duration_s < 15  # the SIGTERM-deaf child needed SIGKILL after the grace period
    assert processes_with(marker) == []
    assert "[mat] killed after 3 s" in log.read_text()


def test_children_left_after_a_normal_exit_are_killed(tmp_path: Path, marker: str) -> None:
    command = family_script(marker, "echo done")
    outcome = LocalExecutor(grace_s=0.5).run(tmp_path, command, 30, tmp_path / "run.log", {})
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert outcome.duration_s >= 0.5  # the deaf child outlived SIGTERM
    assert processes_with(marker) == []
    assert "done" in (tmp_path / "run.log").read_text()


def test_an_interrupt_while_waiting_kills_the_group_and_propagates(tmp_path: Path, marker: str) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            LocalExecutor(grace_s=0.5).run(
                tmp_path, family_script(marker, "wait"), 60, tmp_path / "run.log", {}
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert processes_with(marker) == []


def test_stop_ends_a_run_from_another_thread(tmp_path: Path, marker: str) -> None:
    executor = LocalExecutor()
    killer = threading.Timer(1.0, executor.stop, [tmp_path / "elsewhere"])
    killer.start()
    outcome = executor.run(tmp_path, [PY, "-c", SLEEPER, marker], 60, tmp_path / "run.log", {})
    killer.join()
    assert outcome.exit_code == -signal.SIGTERM and not outcome.timed_out
    assert outcome.duration_s < 30
    assert processes_with(marker) == []


def test_terminate_processes_in_spares_our_own_session(tmp_path: Path, marker: str) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "sub").mkdir(parents=True)
    orphan = subprocess.Popen(
        [PY, "-c", SLEEPER, marker, "orphan"], cwd=workspace / "sub", start_new_session=True
    )
    ours = subprocess.Popen([PY, "-c", SLEEPER, marker, "ours"], cwd=workspace)
    elsewhere = subprocess.Popen(
        [PY, "-c", SLEEPER, marker, "elsewhere"], cwd=tmp_path, start_new_session=True
    )
    try:
        wait_for(lambda: len(processes_with(marker)) == 3, 10, "three sleepers")
        assert terminate_processes_in(workspace, grace_s=5) == [orphan.pid]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert ours.poll() is None and elsewhere.poll() is None
    finally:
        for proc in (orphan, ours, elsewhere):
            proc.kill()
            proc.wait()


def test_a_missing_command_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="cannot start training command 'no-such-trainer'"):
        LocalExecutor().run(tmp_path, ["no-such-trainer"], 5, tmp_path / "run.log", {})


def test_registry_builds_every_type_and_lists_valid_types() -> None:
    executor = make_executor(LocalExecution(), "gpu-box")
    assert isinstance(executor, LocalExecutor) and executor.name == "gpu-box"
    ssh = make_executor(SshExecution(type="ssh", ssh_host="gpu@10.0.0.2"))  # connects on first use
    assert isinstance(ssh, SshExecutor) and ssh.name == "ssh"
    docker = make_executor(DockerExecution(type="docker", container="trainer"), "box")
    assert isinstance(docker, DockerExecutor) and docker.name == "box"
    with pytest.raises(ConfigError, match="'podman' is not available; valid types: local, ssh, docker"):
        executor_class("podman")
