"""SshExecutor against a real sshd (127.0.0.1 and a network namespace): copying, streaming, timeouts,
stopping, copying back, host keys, and a link that goes down in the middle of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from multiagenttrainer.config import SshExecution
from multiagenttrainer.errors import ExperimentError, MachineError
from multiagenttrainer.execution import make_executor
from multiagenttrainer.execution.ssh import SshExecutor
from tests.execution.helpers import (
    DETACHER,
    FAMILY,
    PY,
    TALKER,
    TICKER,
    SshConfig,
    elapsed,
    new_marker,
    start_run,
    wait_for_text,
    wait_gone,
    write_workspace,
)
from tests.support.experiments import processes_with, wait_for
from tests.support.netns import Netns
from tests.support.sshd import KeyPair, Sshd, SshUser, pids_of_user

pytestmark = pytest.mark.integration


def remote_workspace(cfg: SshExecution, workspace: Path, machine: str = "ssh") -> Path:
    """Where the host keeps its copy (the test host shares this machine's files)."""
    return Path(cfg.remote_dir) / workspace.parent.name / machine / "workspace"


def test_output_streams_into_the_log_line_by_line_with_exit_code_and_environment(
    sshd: Sshd,
    ssh_config: SshConfig,
    ssh_user: SshUser,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAT_TEST_FORWARDED", "yes")
    cfg = ssh_config(sshd, env={"X": "42"}, forward_env=["MAT_TEST_FORWARDED"])
    executor = make_executor(cfg)
    assert isinstance(executor, SshExecutor) and executor.name == "ssh"
    write_workspace(workspace, {"train.py": TALKER})
    executor.prepare(workspace)
    log = tmp_path / "logs" / "exp-000.log"
    run = start_run(executor, workspace, [], log)
    wait_for_text(log, "line 0")
    assert "line 2" not in log.read_text()  # the first line arrived while the run went on
    outcome = run.result(30)
    executor.cleanup()
    assert (outcome.exit_code, outcome.timed_out, outcome.error) == (3, False, None)
    lines = log.read_text().splitlines()
    assert lines[:3] == ["line 0", "line 1", "line 2"]
    assert "on stderr" in lines and "X=42 FWD=yes" in lines
    assert f"HOME={ssh_user.home}" in lines  # the login's environment, not mat's
    assert not any(
        "alive" in line or "exit_code" in line for line in lines
    )  # the helper's protocol stays out


def test_the_workspace_is_copied_once_then_only_what_differs(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path
) -> None:
    cfg = ssh_config(sshd)
    write_workspace(
        workspace, {"train.py": "print(1)\n", "prepare.py": "EVAL = 1\n", "data/train.bin": "x" * 4096}
    )
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (workspace / "results.tsv").symlink_to("../results.tsv")
    executor = SshExecutor(cfg)
    executor.prepare(workspace)
    remote = remote_workspace(cfg, workspace)
    assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()) == [
        "data/train.bin", "prepare.py", "train.py"
    ]  # fmt: skip  # no .git, no links
    assert remote.stat().st_uid != 0  # written as the login, not as root
    data_ctime = (remote / "data" / "train.bin").stat().st_ctime_ns
    (workspace / "train.py").write_text("print(2)\n")
    executor.sync(workspace, ["train.py"])
    assert (remote / "train.py").read_text() == "print(2)\n"
    # A run on the host edits the evaluator and puts its mtime back: the next sync restores it anyway.
    stamp = (remote / "prepare.py").stat()
    (remote / "prepare.py").write_text("EVAL = 0\n")
    os.utime(remote / "prepare.py", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    executor.sync(workspace, ["train.py"])
    executor.cleanup()
    assert (remote / "prepare.py").read_text() == "EVAL = 1\n"
    assert (remote / "data" / "train.bin").stat().st_ctime_ns == data_ctime  # never sent again


def test_the_timeout_kills_the_whole_remote_session_and_checks_it_is_gone(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    marker = new_marker()
    executor = SshExecutor(ssh_config(sshd), grace_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    executor.prepare(workspace)
    log = tmp_path / "exp.log"
    started = time.monotonic()
    outcome = executor.run(workspace, [PY, "train.py", marker, "600"], 3, log, {})
    executor.cleanup()
    assert outcome.timed_out and outcome.exit_code is None and outcome.error is None
    assert 3 <= elapsed(started) < 20
    assert processes_with(marker) == []  # the host's processes are this machine's (same kernel)
    text = log.read_text()
    assert "family started" in text and "[mat] killed after 3 s" in text


def test_children_left_behind_after_a_normal_exit_are_killed(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    marker = new_marker()
    executor = SshExecutor(ssh_config(sshd), grace_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    executor.prepare(workspace)
    outcome = executor.run(workspace, [PY, "train.py", marker, "0"], 60, tmp_path / "exp.log", {})
    executor.cleanup()
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert processes_with(marker) == []


def test_a_silent_run_on_a_healthy_connection_is_kept_alive_by_heartbeats(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    executor = SshExecutor(ssh_config(sshd, alive_timeout=1.5))
    write_workspace(workspace, {"train.py": "import time; time.sleep(4); print('done')\n"})
    executor.prepare(workspace)
    outcome = executor.run(workspace, [PY, "train.py"], 60, tmp_path / "exp.log", {})
    executor.cleanup()
    assert (outcome.exit_code, outcome.error) == (0, None)
    assert (tmp_path / "exp.log").read_text() == "done\n"


def test_stop_from_a_new_executor_kills_what_an_earlier_one_left_running(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    """What `mat train --resume` does after a SIGKILLed mat, and what Ctrl-C does from another thread."""
    marker = new_marker()
    cfg = ssh_config(sshd)
    first = SshExecutor(cfg, grace_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    first.prepare(workspace)
    log = tmp_path / "exp.log"
    run = start_run(first, workspace, [marker, "600"], log)
    wait_for_text(log, "family started")
    started = time.monotonic()
    SshExecutor(cfg, grace_s=0.5).stop(workspace)
    outcome = run.result(30)
    first.cleanup()
    assert (
        outcome.exit_code is not None and outcome.exit_code < 0 and not outcome.timed_out
    )  # killed by a signal
    assert elapsed(started) < 15
    assert processes_with(marker) == []


def test_copying_back_checks_every_path(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    executor = SshExecutor(ssh_config(sshd))
    write_workspace(workspace, {"train.py": TICKER})
    executor.prepare(workspace)
    assert executor.run(workspace, [PY, "train.py", "0"], 60, tmp_path / "exp.log", {}).exit_code == 0
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (workspace / "out.txt").symlink_to(outside)  # a link planted in the local workspace is replaced
    executor.fetch(workspace, ["out.txt", "not-there.txt"])
    assert (workspace / "out.txt").read_text() == "result" and not (workspace / "out.txt").is_symlink()
    assert outside.read_text() == "untouched"
    remote = remote_workspace(executor.cfg, workspace)
    (remote / "link.txt").symlink_to("/etc/passwd")
    with pytest.raises(ExperimentError, match="refused to copy back 'link.txt'.*not a regular file"):
        executor.fetch(workspace, ["link.txt"])
    for bad in ("../outside.txt", "/etc/passwd"):
        with pytest.raises(ExperimentError, match="only paths inside the workspace"):
            executor.fetch(workspace, [bad])
    executor.cleanup()
    assert not (workspace / "link.txt").exists()


def test_an_unknown_host_is_refused_with_the_keyscan_line_that_fixes_it(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    cfg = ssh_config(sshd, known="")
    with pytest.raises(MachineError) as refused:
        SshExecutor(cfg).prepare(workspace)
    known_hosts = cfg.known_hosts
    line = f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known_hosts}"
    assert f"run `{line}`" in str(refused.value)
    assert "is not in known_hosts" in str(refused.value) and "accept_new" in str(refused.value)
    subprocess.run(["bash", "-c", line], check=True, capture_output=True, timeout=30)
    executor = SshExecutor(cfg)
    executor.prepare(workspace)  # the line the message gave is all it took
    executor.cleanup()


def test_a_changed_host_key_is_refused_even_with_accept_new(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path
) -> None:
    impostor = KeyPair.generate()
    known = f"{sshd.host_name} {impostor.public}\n"
    for policy in ("strict", "accept_new"):
        cfg = ssh_config(sshd, known=known, host_key_policy=policy)
        with pytest.raises(
            MachineError, match=r"host key of .* has CHANGED: it offers ssh-ed25519 SHA256:\S+, "
        ):
            SshExecutor(cfg).prepare(workspace)
        assert Path(str(cfg.known_hosts)).read_text() == known  # nothing recorded


def test_accept_new_records_the_key_of_a_new_host(sshd: Sshd, ssh_config: SshConfig, workspace: Path) -> None:
    cfg = ssh_config(sshd, known="", host_key_policy="accept_new")
    executor = SshExecutor(cfg)
    executor.prepare(workspace)
    executor.cleanup()
    recorded = Path(str(cfg.known_hosts)).read_text()
    assert recorded == f"{sshd.host_name} {sshd.host_key.public}\n"
    strict = cfg.model_copy(update={"host_key_policy": "strict"})
    SshExecutor(strict).prepare(workspace)  # now known


def test_a_refused_key_and_an_unreachable_host_are_clear_errors(
    sshd: Sshd, ssh_config: SshConfig, ssh_user: SshUser, workspace: Path, tmp_path: Path
) -> None:
    stranger = KeyPair.generate().write(tmp_path / "stranger")
    with pytest.raises(
        MachineError, match=rf"refused the keys offered .*~{ssh_user.name}/.ssh/authorized_keys"
    ):
        SshExecutor(ssh_config(sshd, ssh_key=str(stranger))).prepare(workspace)
    with pytest.raises(MachineError, match="ssh_key .* is not a file"):
        SshExecutor(ssh_config(sshd, ssh_key=str(tmp_path / "nope"))).prepare(workspace)
    closed = ssh_config(sshd, ssh_host=f"{ssh_user.name}@127.0.0.1:1", connect_attempts=2)
    started = time.monotonic()
    with pytest.raises(MachineError, match=r"cannot reach ssh host .*127.0.0.1\]:1: .*\(2 attempts\)"):
        SshExecutor(closed, backoff_s=0.2).prepare(workspace)
    assert elapsed(started) < 10


def test_a_host_without_the_configured_python_says_how_to_fix_it(
    sshd: Sshd, ssh_config: SshConfig, workspace: Path
) -> None:
    with pytest.raises(MachineError, match="could not run mat's session helper .* set execution.python"):
        SshExecutor(ssh_config(sshd, python="/nonexistent/python3")).prepare(workspace)


def test_over_a_namespace_host_a_dropped_link_is_a_crash_and_the_next_run_reconnects(
    netns_host: tuple[Netns, Sshd], ssh_config: SshConfig, workspace: Path, tmp_path: Path
) -> None:
    ns, server = netns_host
    marker = new_marker()
    executor = SshExecutor(ssh_config(server, alive_timeout=3, connect_timeout=3), grace_s=0.5, backoff_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    executor.prepare(workspace)
    first_log = tmp_path / "exp-001.log"
    run = start_run(executor, workspace, [marker, "600"], first_log)
    wait_for_text(first_log, "family started")
    training = set(processes_with(marker))
    assert training and training <= set(ns.pids())  # the training runs on the other host
    ns.link_down()
    try:
        started = time.monotonic()
        outcome = run.result(30)
        assert elapsed(started) < 15
    finally:
        ns.link_up()
    assert outcome.error is not None and "lost the connection to ssh host" in outcome.error
    assert "no answer for 3 s" in outcome.error
    assert outcome.exit_code is None and not outcome.timed_out
    assert "[mat] lost the connection" in first_log.read_text()
    # The next run reconnects, and the helper first stops the session the lost connection left behind.
    second = executor.run(workspace, [PY, "train.py", new_marker(), "0"], 60, tmp_path / "exp-002.log", {})
    executor.cleanup()
    assert (second.exit_code, second.error) == (0, None)
    wait_gone(marker)


def test_without_ssh_key_the_agent_and_the_default_keys_are_used(
    sshd: Sshd,
    ssh_config: SshConfig,
    client_key: tuple[KeyPair, Path],
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    cfg = ssh_config(sshd, ssh_key=None)
    with pytest.raises(MachineError, match="no SSH key to offer .*: set execution.ssh_key, add a key to"):
        SshExecutor(cfg).prepare(workspace)  # no key anywhere
    client_key[0].write(home / ".ssh" / "id_ed25519")
    SshExecutor(cfg).prepare(workspace)  # ~/.ssh/id_ed25519, as ssh would
    (home / ".ssh" / "id_ed25519").unlink()
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        wait_for(socket_path.exists, 10, "ssh-agent's socket")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        subprocess.run(["ssh-add", "-q", str(client_key[1])], check=True, capture_output=True, timeout=30)
        SshExecutor(cfg).prepare(workspace)  # the agent's key
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_what_a_run_detached_is_stopped_by_the_next_run_when_its_helper_died(
    sshd: Sshd, ssh_config: SshConfig, ssh_user: SshUser, workspace: Path, tmp_path: Path
) -> None:
    """The helper's process scope (processes.py) holds what left the session; a dead helper's is stopped."""
    marker = new_marker()
    executor = SshExecutor(ssh_config(sshd), grace_s=0.5)
    write_workspace(workspace, {"train.py": DETACHER})
    executor.prepare(workspace)
    log = tmp_path / "exp-001.log"
    run = start_run(executor, workspace, [marker], log)
    wait_for_text(log, "detached")
    wait_for(lambda: bool(processes_with(marker)), 10, "the detached child")
    (helper,) = [
        p
        for p in pids_of_user(ssh_user.uid)
        if b"session.pyz\0run" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    os.kill(helper, signal.SIGKILL)
    outcome = run.result(30)
    assert outcome.error is not None and "session helper on ssh host" in outcome.error
    assert "stopped answering while the connection is up" in outcome.error
    assert processes_with(marker)  # the child that left the session outlived its helper
    (workspace / "train.py").write_text("print('next')\n")
    executor.sync(workspace, ["train.py"])
    assert executor.run(workspace, [PY, "train.py"], 60, tmp_path / "exp-002.log", {}).exit_code == 0
    executor.cleanup()
    wait_gone(marker)
