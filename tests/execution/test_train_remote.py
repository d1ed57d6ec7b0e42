"""`mat train` end to end with `training.execution` set to ssh (127.0.0.1, and a host in a network namespace
whose link goes down mid-experiment) and docker: the built-in template trains on the target for
MAT_FIXED_STEPS=3 steps (forwarded there by `forward_env`), the log and results come back to the run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from multiagenttrainer.experiments.results import read_results
from tests.support.experiments import wait_for
from tests.support.netns import Netns
from tests.support.sshd import KeyPair, Sshd, SshUser, pids_of_user

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
MAT_TIMEOUT_S = 300
TRAINING_ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}  # on the target, one core each


def write_config(directory: Path, source: Path, execution: dict[str, Any], max_experiments: int) -> Path:
    document = {
        "sources": [{"type": "local_repo", "path": str(source), "name": "tiny"}],
        "corpus": {"dir": str(directory / "corpus"), "staging_dir": str(directory / "staging")},
        "autoresearch": {"train_time": 30},
        "training": {
            "max_experiments": max_experiments,
            "output_dir": str(directory / "runs"),
            "execution": execution,
        },
    }
    path = directory / "mat.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def start_mat(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MAT_FIXED_STEPS": "3", "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "multiagenttrainer.cli", "train", "--config", str(config)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def run_mat(config: Path, log: Path) -> int:
    proc = start_mat(config, log)
    try:
        return proc.wait(timeout=MAT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def only_run_dir(runs: Path) -> Path:
    (run_dir,) = [p for p in runs.iterdir() if (p / "run.json").is_file()]
    return run_dir


def ssh_execution(user: SshUser, server: Sshd, key: Path, tmp_path: Path, **fields: Any) -> dict[str, Any]:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(server.known_hosts_line)
    return {
        "type": "ssh",
        "ssh_host": f"{user.name}@{server.address}:{server.port}",
        "ssh_key": str(key),
        "known_hosts": str(known_hosts),
        "remote_dir": str(user.owned_dir("mat-train-")),
        "python": sys.executable,
        "env": TRAINING_ENV,
        **fields,
    }


def training_processes(user: SshUser) -> list[int]:
    """The test user's processes that run a train.py."""
    found = []
    for pid in pids_of_user(user.uid):
        try:
            if b"train.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def check_completed(run_dir: Path, machine: str, experiments: int) -> dict[str, Any]:
    """The run completed with `experiments` rows, each trained on `machine`; returns run.json."""
    state: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "completed"
    assert len(read_results(run_dir / "results.tsv")) == experiments
    assert {e["machine"] for e in state["experiments"]} == {machine}
    baseline = state["experiments"][0]
    assert baseline["status"] == "keep" and baseline["summary"]["num_steps"] == 3  # MAT_FIXED_STEPS arrived
    assert "val_bpb:" in (run_dir / "logs" / "exp-000.log").read_text()
    return state


def test_mat_train_over_ssh_on_loopback(
    prefect_api: str,
    tiny_source: Path,
    sshd: Sshd,
    ssh_user: SshUser,
    client_key: tuple[KeyPair, Path],
    tmp_path: Path,
) -> None:
    execution = ssh_execution(ssh_user, sshd, client_key[1], tmp_path)
    config = write_config(tmp_path, tiny_source, execution, max_experiments=2)
    log = tmp_path / "mat.log"
    assert run_mat(config, log) == 0, log.read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    state = check_completed(run_dir, "ssh", 2)
    copy = Path(execution["remote_dir"]) / run_dir.name / "ssh" / "workspace"
    assert (copy / "data" / "train.bin").is_file() and not (copy / ".git").exists()
    last = state["experiments"][-1]["commit"]  # each experiment's train.py was sent before it trained
    shown = subprocess.run(
        ["git", "show", f"{last}:train.py"], cwd=run_dir / "workspace", capture_output=True
    )
    assert (copy / "train.py").read_bytes() == shown.stdout
    assert (copy / "train.py").stat().st_uid == ssh_user.uid
    assert training_processes(ssh_user) == []


def test_mat_train_records_a_dropped_link_as_a_crash_and_goes_on(
    prefect_api: str,
    tiny_source: Path,
    netns_host: tuple[Netns, Sshd],
    ssh_user: SshUser,
    client_key: tuple[KeyPair, Path],
    tmp_path: Path,
) -> None:
    ns, server = netns_host
    execution = ssh_execution(ssh_user, server, client_key[1], tmp_path, alive_timeout=3, connect_timeout=3)
    config = write_config(tmp_path, tiny_source, execution, max_experiments=3)
    log = tmp_path / "mat.log"
    proc = start_mat(config, log)
    try:
        runs = tmp_path / "runs"
        wait_for(lambda: any(runs.glob("*/logs/exp-001.log")), 240, "experiment 1 to start training")
        ns.link_down()
        try:
            wait_for(lambda: len(read_results(next(runs.glob("*/results.tsv")))) >= 2, 60, "the crash row")
        finally:
            ns.link_up()
        assert proc.wait(timeout=MAT_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run_dir = only_run_dir(runs)
    state = check_completed(run_dir, "ssh", 3)
    crashed = state["experiments"][1]
    assert crashed["status"] == "crash"
    assert crashed["error"].startswith(f"lost the connection to ssh host {ssh_user.name}@{server.address}")
    assert "no answer for 3 s" in crashed["error"]
    assert read_results(run_dir / "results.tsv")[1].status == "crash"
    assert state["experiments"][2]["status"] in ("keep", "discard")  # reconnected and trained
    assert "[mat] lost the connection" in (run_dir / "logs" / "exp-001.log").read_text()
    assert "Traceback" not in log.read_text()
    wait_for(lambda: not training_processes(ssh_user), 10, "no training left on the namespace host")
    assert not [pid for pid in ns.pids() if pid in training_processes(ssh_user)]


def test_mat_train_in_a_container(
    prefect_api: str, tiny_source: Path, dockerd: Any, container: Any, tmp_path: Path
) -> None:
    execution = {
        "type": "docker",
        "container": container.name,
        "container_dir": f"/tmp/mat-train-{tmp_path.name}",
        "docker_host": dockerd.url,
        "python": sys.executable,
        "env": TRAINING_ENV,
    }
    config = write_config(tmp_path, tiny_source, execution, max_experiments=2)
    log = tmp_path / "mat.log"
    started = time.monotonic()
    assert run_mat(config, log) == 0, log.read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    check_completed(run_dir, "docker", 2)
    listing = container.exec_run(["ls", f"{execution['container_dir']}/{run_dir.name}/docker/workspace"])
    assert b"train.py" in listing.output and b"data" in listing.output
    assert time.monotonic() - started < MAT_TIMEOUT_S


def test_mat_train_refuses_an_unknown_host_in_one_line(
    prefect_api: str,
    tiny_source: Path,
    sshd: Sshd,
    ssh_user: SshUser,
    client_key: tuple[KeyPair, Path],
    tmp_path: Path,
) -> None:
    execution = ssh_execution(ssh_user, sshd, client_key[1], tmp_path)
    Path(execution["known_hosts"]).write_text("")
    config = write_config(tmp_path, tiny_source, execution, max_experiments=2)
    log = tmp_path / "mat.log"
    assert run_mat(config, log) == 1
    output = log.read_text()
    assert f"`ssh-keyscan -p {sshd.port} 127.0.0.1 >> {execution['known_hosts']}`" in output
    assert "Traceback" not in output
    state = json.loads((only_run_dir(tmp_path / "runs") / "run.json").read_text())
    assert state["status"] == "failed" and "is not in known_hosts" in state["error"]
