"""Fine-tune targets on their machine: `machine:` naming an ssh machine trains the target there (the test sshd
logs in as a user of its own), the adapter and record come back, status and cancel reach the job there."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.config import Config, load_config
from multiagenttrainer.finetune.base import JobRecord, JobStore
from multiagenttrainer.finetune.runner import start_targets, status
from tests.finetune.remote.conftest import HOST_ENV, mat
from tests.support.dockerd import Dockerd
from tests.support.experiments import processes_with, wait_for
from tests.support.sshd import SshUser
from tests.support.tiny_model import tiny_opensource_section

pytestmark = [pytest.mark.integration]

RemoteConfig = Callable[..., Path]


def test_a_target_on_an_ssh_machine_trains_there_and_its_adapter_comes_back(
    prefect_api: str, remote_config: RemoteConfig, ssh_user: SshUser, tmp_path: Path
) -> None:
    config = remote_config([{"name": "remote", "machine": "box"}, {"name": "lost", "machine": "gone"}])

    started = mat("finetune", "start", "--config", str(config), "--name", "nightly")

    assert started.returncode == 1, started.stderr  # one target failed: the unreachable machine's
    records = {r.target: r for r in JobStore(tmp_path / "jobs").all()}
    remote = records["remote"]
    printed = " ".join(started.stdout.split())  # long lines wrap in the terminal width
    assert f"remote: job {remote.id} completed {tmp_path / 'models' / remote.id}" in printed
    lost_line = f"lost: job {records['lost'].id} failed {tmp_path / 'models' / records['lost'].id} ("
    assert f"{lost_line}cannot reach ssh host" in printed
    assert "Traceback" not in started.stderr
    assert remote.status == "completed", remote.error
    adapter = tmp_path / "models" / remote.id
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    assert not (adapter / "checkpoints").exists()  # checkpoints stay on the machine
    assert (remote.machine, remote.output_path, remote.pid) == ("box", str(adapter), None)
    assert remote.remote_dir is not None and remote.remote_dir.startswith("/tmp/mat-finetune-")
    trained = Path(remote.remote_dir) / "output" / remote.id / "adapter_model.safetensors"
    assert trained.stat().st_uid == ssh_user.uid  # written by the SSH login, on the host
    assert remote.remote_pid is not None and remote.remote_pid != os.getpid()
    assert remote.metrics.get("eval_loss_after") is not None or remote.metrics.get("eval")
    copied_record = (
        tmp_path / "jobs" / "remote" / remote.id / "workspace" / "jobs" / "remote" / f"{remote.id}.json"
    )
    assert json.loads(copied_record.read_text())["status"] == "completed"

    lost = records["lost"]
    assert lost.status == "failed" and lost.machine == "gone"
    assert "cannot reach ssh host" in str(lost.error) and "Unable to connect to port" in str(lost.error)

    shown = mat("finetune", "status", remote.id, "--config", str(config), "--json")
    assert shown.returncode == 0, shown.stderr
    assert {k: json.loads(shown.stdout)[k] for k in ("status", "machine")} == {
        "status": "completed",
        "machine": "box",
    }
    listed = mat("finetune", "status", remote.id, "--config", str(config))
    assert "machine: box" in listed.stdout and f"remote dir: {remote.remote_dir}" in listed.stdout


def test_status_follows_a_job_on_its_machine_and_cancel_stops_it_there(
    remote_config: RemoteConfig, corpus_dir: Path, tmp_path: Path
) -> None:
    config = remote_config([{"name": "long", "machine": "box"}], max_steps=100_000)
    cfg = load_config(config)
    finished: list[JobRecord] = []
    driver = threading.Thread(
        target=lambda: finished.extend(start_targets(cfg, corpus_dir, "long")), daemon=True
    )
    driver.start()
    store = JobStore(tmp_path / "jobs")
    wait_for(lambda: any(r.remote_dir for r in store.all()), 120, "the job to start on its machine")
    (job_id,) = [r.id for r in store.all()]

    def stepped() -> bool:
        return (store.get(job_id).progress.get("step") or 0) >= 1

    wait_for(stepped, 180, "the host's progress in the local record (what the progress bars show)")
    assert status(cfg, job_id).progress["step"] >= 1  # re-read from the machine's record
    shown = json.loads(mat("finetune", "status", job_id, "--config", str(config), "--json").stdout)
    assert (shown["status"], shown["machine"]) == ("running", "box")
    assert shown["remote_pid"] and shown["remote_pid"] != os.getpid()
    assert processes_with(job_id)  # the worker runs (on the host: the same machine here)

    cancelled = mat("finetune", "cancel", job_id, "--config", str(config))

    assert cancelled.returncode == 0, cancelled.stderr
    assert f"job {job_id}: cancelled" in cancelled.stdout
    driver.join(60)
    assert not driver.is_alive()
    assert [r.status for r in finished] == ["cancelled"]
    wait_for(lambda: not processes_with(job_id), 10, "the job's processes on the host to be gone")
    assert status(cfg, job_id).status == "cancelled"


def test_a_machine_without_mat_fails_its_target_with_the_workers_complaint(
    remote_config: RemoteConfig, corpus_dir: Path
) -> None:
    config = remote_config([{"name": "bare", "machine": "box"}], python="/usr/bin/python3")  # no mat there

    [record] = start_targets(load_config(config), corpus_dir, "bare")

    assert record.status == "failed" and record.machine == "box"
    assert "the training process on machine 'box' exited with code 1" in str(record.error)
    assert "No module named" in str(record.error)  # the worker's own words, from its log


def test_status_and_cancel_of_a_job_on_an_unreachable_machine_say_so(
    remote_config: RemoteConfig, tmp_path: Path
) -> None:
    config = remote_config([{"name": "t", "machine": "gone"}])
    store = JobStore(tmp_path / "jobs")
    store.save(JobRecord(id="nightly-t-1", backend="opensource", target="t", model="m", status="running",
                         machine="gone", remote_dir="/tmp/mat-runs/nightly-t-1/gone/workspace"))  # fmt: skip

    for command in ("status", "cancel"):
        result = mat("finetune", command, "nightly-t-1", "--config", str(config))
        assert result.returncode == 1
        assert "job nightly-t-1 runs on machine 'gone', which cannot be reached" in result.stderr
        assert "its last known state is running" in result.stderr and "Traceback" not in result.stderr
    assert store.get("nightly-t-1").status == "running"


def test_a_target_on_a_docker_machine_trains_in_the_container(
    dockerd: Dockerd, trainer_container: Any, tiny_model_dir: Path, corpus_dir: Path, tmp_path: Path
) -> None:
    execution = {
        "type": "docker",
        "container": trainer_container.name,
        "docker_host": dockerd.url,
        "container_dir": f"/tmp/mat-finetune-{tmp_path.name}",
        "python": sys.executable,
        "env": HOST_ENV,
    }
    finetuner = {
        "jobs_dir": str(tmp_path / "jobs"),
        "targets": [{"name": "boxed", "machine": "box"}],
        "opensource": tiny_opensource_section(tiny_model_dir, tmp_path / "models", max_steps=2),
    }
    machines = [{"name": "box", "execution": execution}]
    cfg = Config.model_validate({"machines": machines, "finetuner": finetuner})

    [record] = start_targets(cfg, corpus_dir, "docker")

    assert record.status == "completed", record.error
    assert (tmp_path / "models" / record.id / "adapter_model.safetensors").is_file()
    assert record.remote_dir == f"/tmp/mat-finetune-{tmp_path.name}/{record.id}/box/workspace"
    assert not Path(record.remote_dir).exists()  # not on this machine's filesystem: inside the container
    code, listing = trainer_container.exec_run(["ls", f"{record.remote_dir}/output/{record.id}"])
    assert code == 0 and "adapter_model.safetensors" in listing.decode()
