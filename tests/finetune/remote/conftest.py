"""Fixtures for fine-tune targets on their machine: the session's sshd and login (tests/support), the tiny
Llama copied where that login can read it, and `remote_config(...)`, a mat.yaml with ssh machines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.docker_fixtures import busybox_image, dockerd
from tests.support.dockerd import Dockerd
from tests.support.ssh_fixtures import PYTHON_DIRS, client_key, ssh_user, sshd
from tests.support.sshd import KeyPair, Sshd, SshUser, free_port
from tests.support.tiny_model import corpus_dir, tiny_model_dir, tiny_opensource_section

# session fixtures from tests/support
__all__ = ["busybox_image", "client_key", "corpus_dir", "dockerd", "ssh_user", "sshd", "tiny_model_dir"]

ROOT = Path(__file__).resolve().parents[3]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
COMMAND_TIMEOUT_S = 180
# What the worker on the host gets: no hub, one core without spinning (the host is this busy machine).
HOST_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}  # fmt: skip


@pytest.fixture(scope="session")
def host_model_dir(ssh_user: SshUser, tiny_model_dir: Path) -> Path:
    """The tiny Llama in a folder the SSH login can read (model_id names a folder on the host)."""
    folder = ssh_user.owned_dir("tiny-llama-") / "model"
    shutil.copytree(tiny_model_dir, folder)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


@pytest.fixture(scope="session")
def trainer_container(dockerd: Dockerd, busybox_image: str, tiny_model_dir: Path) -> Any:
    """A running container that mounts /usr, this machine's Python with mat, and the tiny Llama, read-only."""
    python = [d for d in PYTHON_DIRS if not d.is_relative_to(ROOT)]
    return dockerd.run_container(busybox_image, [Path("/usr"), ROOT, *python, tiny_model_dir])


def ssh_machine(user: SshUser, server: Sshd, key: Path, known_hosts: Path, **fields: Any) -> dict[str, Any]:
    """An ssh `execution` section for the test server, with a new remote_dir the login owns."""
    known_hosts.write_text(server.known_hosts_line)
    return {"type": "ssh", "ssh_host": f"{user.name}@{server.address}:{server.port}", "ssh_key": str(key),
            "known_hosts": str(known_hosts), "remote_dir": str(user.owned_dir("mat-finetune-")),
            "python": sys.executable, "connect_timeout": 5, "alive_timeout": 10, "env": HOST_ENV,
            **fields}  # fmt: skip


@pytest.fixture
def remote_config(
    tmp_path: Path,
    ssh_user: SshUser,
    sshd: Sshd,
    client_key: tuple[KeyPair, Path],
    host_model_dir: Path,
    corpus_dir: Path,
) -> Callable[..., Path]:
    """`remote_config(targets, max_steps=2, **execution)`: mat.yaml with machine `box` (the test sshd; its
    execution fields overridden by `execution`) and `gone` (a port where nothing listens), targets on the tiny
    model, jobs in tmp_path/jobs, adapters in tmp_path/models."""

    def make(targets: list[dict[str, Any]], max_steps: int = 2, **execution: Any) -> Path:
        box = ssh_machine(ssh_user, sshd, client_key[1], tmp_path / "known_hosts", **execution)
        gone = {**box, "ssh_host": f"{ssh_user.name}@127.0.0.1:{free_port()}", "connect_attempts": 1}
        section = tiny_opensource_section(host_model_dir, tmp_path / "models", max_steps)
        document = {
            "machines": [{"name": "box", "execution": box}, {"name": "gone", "execution": gone}],
            "finetuner": {"jobs_dir": str(tmp_path / "jobs"), "targets": targets, "opensource": section},
            "corpus": {"dir": str(corpus_dir), "staging_dir": str(tmp_path / "staging")},
        }  # fmt: skip
        path = tmp_path / "mat.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return path

    return make


def mat(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `mat ARGS` to completion from the repository root."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [*MAT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
        check=False,
    )  # fmt: skip
