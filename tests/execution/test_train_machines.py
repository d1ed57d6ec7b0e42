"""`mat train` on several machines at once (`machines:`): ssh in a network namespace, a container and this
machine, with the built-in agent and template (MAT_FIXED_STEPS=3 steps per experiment)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from multiagenttrainer.experiments.results import read_results
from tests.execution.test_train_remote import (
    MAT_TIMEOUT_S,
    TRAINING_ENV,
    only_run_dir,
    run_mat,
    ssh_execution,
    start_mat,
    training_processes,
    write_config,
)
from tests.support.experiments import wait_for
from tests.support.netns import Netns
from tests.support.sshd import KeyPair, Sshd, SshUser

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def with_machines(config: Path, machines: list[dict[str, Any]], **training: Any) -> Path:
    document = yaml.safe_load(config.read_text())
    document["machines"] = machines
    document["training"].update(training)
    config.write_text(yaml.safe_dump(document))
    return config


def run_state(run_dir: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return state


def ran_on(runs: Path, machine: str) -> bool:
    """Whether the run under `runs` has recorded an experiment on `machine` yet."""
    for run_file in runs.glob("*/run.json"):
        try:
            experiments = json.loads(run_file.read_text()).get("experiments", [])
        except ValueError:  # caught between a write and a rename: try again
            return False
        return any(e.get("machine") == machine for e in experiments)
    return False


def test_a_machine_that_goes_away_is_dropped_and_the_run_completes(
    prefect_api: str,
    tiny_source: Path,
    netns_host: tuple[Netns, Sshd],
    ssh_user: SshUser,
    client_key: tuple[KeyPair, Path],
    tmp_path: Path,
) -> None:
    ns, server = netns_host
    remote = ssh_execution(ssh_user, server, client_key[1], tmp_path, alive_timeout=3, connect_timeout=3)
    config = write_config(tmp_path, tiny_source, {"type": "local"}, max_experiments=4)
    with_machines(
        config,
        [{"name": "far", "execution": remote}, {"name": "here", "execution": {"type": "local"}}],
        max_machine_failures=2,
    )
    log = tmp_path / "mat.log"
    proc = start_mat(config, log)
    runs = tmp_path / "runs"
    try:
        wait_for(lambda: ran_on(runs, "far"), 240, "an experiment on the far machine")
        ns.link_down()  # for good: the far machine is gone for the rest of the run
        assert proc.wait(timeout=MAT_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        ns.link_up()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run_dir = only_run_dir(runs)
    state = run_state(run_dir)
    assert state["status"] == "completed" and len(read_results(run_dir / "results.tsv")) == 4
    far = next(m for m in state["machines"] if m["name"] == "far")
    assert far["status"] == "dropped" and far["consecutive_failures"] == 2
    assert {e["machine"] for e in state["experiments"]} == {"far", "here"}
    report = (run_dir / "report.md").read_text()
    assert "| far | ssh |" in report and "dropped" in report
    output = log.read_text()
    assert "machine far dropped after 2 failures in a row" in output and "Traceback" not in output
    wait_for(lambda: not training_processes(ssh_user), 15, "no training left on the namespace host")


def test_an_ssh_host_and_a_container_share_one_run(
    prefect_api: str,
    tiny_source: Path,
    sshd: Sshd,
    ssh_user: SshUser,
    client_key: tuple[KeyPair, Path],
    dockerd: Any,
    container: Any,
    tmp_path: Path,
) -> None:
    remote = ssh_execution(ssh_user, sshd, client_key[1], tmp_path)
    boxed = {
        "type": "docker",
        "container": container.name,
        "container_dir": f"/tmp/mat-machines-{tmp_path.name}",
        "docker_host": dockerd.url,
        "python": sys.executable,
        "env": TRAINING_ENV,
    }
    config = write_config(tmp_path, tiny_source, {"type": "local"}, max_experiments=3)
    with_machines(config, [{"name": "gpu-a", "execution": remote}, {"name": "box", "execution": boxed}])
    log = tmp_path / "mat.log"
    assert run_mat(config, log) == 0, log.read_text()[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    state = run_state(run_dir)
    assert state["status"] == "completed" and len(read_results(run_dir / "results.tsv")) == 3
    assert {e["machine"] for e in state["experiments"]} == {"gpu-a", "box"}
    assert [m["status"] for m in state["machines"]] == ["active", "active"]
    assert (run_dir / "workspace-gpu-a" / "train.py").is_file() and (run_dir / "workspace-box").is_dir()
    output = log.read_text()
    assert "on 2 machines at once: gpu-a, box" in output and " on box]" in output
    assert training_processes(ssh_user) == []
