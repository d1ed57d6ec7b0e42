"""`mat serve` refusing to start: one red line naming the fix, exit 2 for config and 1 for the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multiagenttrainer.finetune.base import JobRecord, JobStore
from tests.support.mat_serve import ROOT, serve_env

pytestmark = pytest.mark.e2e


def mat_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `mat serve ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "multiagenttrainer.cli", "serve", *args],
        cwd=ROOT,
        env=env or serve_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """mat.yaml with jobs in tmp_path/jobs: a failed open-source job and a completed Bedrock job."""
    store = JobStore(tmp_path / "jobs")
    store.save(JobRecord(id="broken", backend="opensource", target="default", model="m", status="failed"))
    store.save(JobRecord(id="titan", backend="bedrock", target="default", model="t", status="completed"))
    path = tmp_path / "mat.yaml"
    path.write_text(f"finetuner:\n  jobs_dir: {tmp_path / 'jobs'}\nserve:\n  port: 0\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((), 2, "give either --job JOB_ID or --model PATH"),
        (("--job", "nope"), 1, "no fine-tuning job 'nope'"),
        (("--job", "broken"), 1, "job broken is failed, not completed; `mat finetune status broken`"),
        (("--job", "titan"), 1, "job titan ran on bedrock"),
        (("--model", "./no/such/folder"), 1, "--model: no model folder at ./no/such/folder"),
        (("--model", "m", "--name", "two words"), 2, "--name: 'two words' is not a usable model name"),
    ],
)
def test_what_cannot_be_served_is_refused(
    config: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    result = mat_serve(*args, "--config", str(config))
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")


def test_a_key_variable_that_is_not_set_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "mat.yaml"
    config.write_text("serve:\n  api_key_env: SERVE_KEY_NOT_SET\n", encoding="utf-8")
    result = mat_serve("--model", str(tmp_path), "--config", str(config))
    assert result.returncode == 2
    assert "serve.api_key_env: the variable SERVE_KEY_NOT_SET is not set" in result.stderr


def test_serve_settings_are_checked_with_their_line(tmp_path: Path) -> None:
    config = tmp_path / "mat.yaml"
    config.write_text("serve:\n  max_tokens: 0\n  max_concurrent_requests: 100000\n", encoding="utf-8")
    result = mat_serve("--model", str(tmp_path), "--config", str(config))
    assert result.returncode == 2
    assert f"serve.max_tokens: input should be greater than or equal to 1 ({config}:2)" in result.stderr
    assert "serve.max_concurrent_requests" in result.stderr
