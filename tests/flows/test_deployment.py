"""The ingest deployment from prefect.yaml, run by a real process worker through `prefect deployment run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deployments.register import DEFAULT_WORK_POOL, load_deployment_specs, register_deployments
from tests.flows.conftest import write_config

pytestmark = pytest.mark.integration

PROJECT_DIR = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240
WORKER_STOP_TIMEOUT_S = 20


def test_prefect_yaml_describes_the_ingest_deployment() -> None:
    document = yaml.safe_load((PROJECT_DIR / "prefect.yaml").read_text())
    (ingest,) = [d for d in document["deployments"] if d["name"] == "ingest"]
    assert ingest["entrypoint"] == "flows/ingest.py:ingest"
    assert ingest["work_pool"]["name"] == DEFAULT_WORK_POOL
    assert set(ingest["parameters"]) == {"config_path", "repos", "corpus_dir"}
    pull = document["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert pull["directory"] == "{{ $MAT_PROJECT_DIR }}"


def test_templates_are_filled_with_the_project_directory(tmp_path: Path) -> None:
    (tmp_path / "prefect.yaml").write_text((PROJECT_DIR / "prefect.yaml").read_text())
    for spec in load_deployment_specs(tmp_path):
        assert spec["work_pool"]["job_variables"]["env"]["MAT_PROJECT_DIR"] == str(tmp_path)


@pytest.fixture
def worker(prefect_api: str, tmp_path: Path) -> Iterator[Path]:
    """A process worker polling mat-local every 2 s; yields its log file."""
    log_path = tmp_path / "worker.log"
    command = [
        sys.executable,
        "-m",
        "prefect",
        "worker",
        "start",
        "--pool",
        DEFAULT_WORK_POOL,
        "--type",
        "process",
    ]
    with log_path.open("wb") as log:
        # The worker turns SIGTERM into SIGINT to itself, so SIGINT must not be inherited as ignored.
        process = subprocess.Popen(
            ["env", "--default-signal=INT", *command],
            env={**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "2"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log_path
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=WORKER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def run_ingest_deployment(config: Path) -> subprocess.CompletedProcess[str]:
    """`prefect deployment run ingest/ingest --watch` with our config; output is stdout and stderr."""
    command = [
        sys.executable, "-m", "prefect", "deployment", "run", "ingest/ingest", "-p", f"config_path={config}",
        "--watch", "--watch-timeout", str(RUN_TIMEOUT_S),
    ]  # fmt: skip
    return subprocess.run(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
        check=False,
    )


def test_a_worker_runs_the_ingest_deployment(worker: Path, tmp_path: Path) -> None:
    source_dir = tmp_path / "notes"
    source_dir.mkdir()
    for index in range(3):
        (source_dir / f"note_{index}.md").write_text(f"# Note {index}\nDEPLOYED_NOTE_{index}\n")
    config = write_config(
        tmp_path / "mat.yaml",
        [{"type": "local_repo", "path": str(source_dir), "name": "notes"}],
        tmp_path / "corpus",
        tmp_path / "staging",
    )
    # Only ingest: the nightly cron must not be served by this worker if the test runs at 02:00.
    assert register_deployments(PROJECT_DIR, only=["ingest"]) == ["ingest/ingest"]
    run = run_ingest_deployment(config)
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + worker.read_text()[-3000:]
    corpus = (tmp_path / "corpus" / "corpus.txt").read_text()
    assert all(f"DEPLOYED_NOTE_{index}" in corpus for index in range(3))
    assert (tmp_path / "corpus" / "stats.json").is_file()
