"""`mat finetune` end to end: real CLI subprocesses, the session Prefect server, the tiny Llama on CPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.finetune.conftest import mat, mat_env, mat_json, opensource_section, start_mat, write_config
from tests.support.aws import moto_server

pytestmark = pytest.mark.integration

JOB_WAIT_S = 120


def test_two_opensource_targets_train_at_once_in_their_own_processes(
    prefect_api: str, tmp_path: Path, tiny_model_dir: Path, corpus_dir: Path
) -> None:
    finetuner = {
        "opensource": opensource_section(tiny_model_dir, tmp_path / "models", max_steps=2),
        "targets": [{"name": "small"}, {"name": "wide", "lora_r": 8}],
    }
    config = write_config(tmp_path, finetuner, corpus=corpus_dir)

    cli = start_mat("finetune", "start", "--config", str(config), "--name", "pair", log=tmp_path / "cli.log")
    assert cli.wait(timeout=180) == 0, (tmp_path / "cli.log").read_text()
    output = (tmp_path / "cli.log").read_text()

    jobs = mat_json("finetune", "list", "--config", str(config))
    assert sorted(j["target"] for j in jobs) == ["small", "wide"]
    assert {j["status"] for j in jobs} == {"completed"}
    assert all(f"job {j['id']} completed" in output for j in jobs)
    assert {p.name for p in (tmp_path / "jobs").iterdir()} == {"small", "wide"}
    adapters = {Path(j["output_path"]) for j in jobs}
    assert len(adapters) == 2 and all((a / "adapter_config.json").is_file() for a in adapters)
    pids = {j["metrics"]["worker_pid"] for j in jobs}
    assert len(pids) == 2 and cli.pid not in pids
    assert all(j["progress"]["step"] == 2 and j["metrics"]["eval_loss_after"] > 0 for j in jobs)

    detail = mat_json("finetune", "status", jobs[0]["id"], "--config", str(config))
    assert detail["id"] == jobs[0]["id"] and detail["status"] == "completed"
    table = mat("finetune", "list", "--config", str(config))
    assert table.returncode == 0 and jobs[1]["id"] in table.stdout and "completed" in table.stdout


def wait_for_running_job(config: Path, deadline_s: float) -> dict[str, object]:
    """The first job that has reached a training step, polled through `mat finetune list --json`."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for job in mat_json("finetune", "list", "--config", str(config)):
            if job["status"] == "running" and (job.get("progress") or {}).get("step", 0) >= 1:
                return dict(job)
        time.sleep(0.5)
    raise AssertionError("no job started training in time")


def test_cancel_stops_a_running_local_job(
    prefect_api: str, tmp_path: Path, tiny_model_dir: Path, corpus_dir: Path
) -> None:
    finetuner = {"opensource": opensource_section(tiny_model_dir, tmp_path / "models", max_steps=5000)}
    config = write_config(tmp_path, finetuner, corpus=corpus_dir)
    cli = start_mat("finetune", "start", "--config", str(config), "--name", "long", log=tmp_path / "cli.log")
    try:
        job = wait_for_running_job(config, JOB_WAIT_S)
        cancelled = mat("finetune", "cancel", str(job["id"]), "--config", str(config))
        assert cancelled.returncode == 0, cancelled.stderr
        assert cli.wait(timeout=JOB_WAIT_S) == 0, (tmp_path / "cli.log").read_text()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=30)
    final = mat_json("finetune", "status", str(job["id"]), "--config", str(config))
    assert final["status"] == "cancelled"
    assert final["progress"]["step"] < 5000


def test_cancel_of_a_completed_job_says_it_has_already_ended(finished_job: tuple[Path, Any]) -> None:
    config, record = finished_job
    before = mat_json("finetune", "status", record.id, "--config", str(config))

    result = mat("finetune", "cancel", record.id, "--config", str(config))

    assert result.returncode == 0, result.stderr  # the job is not running: what cancelling asks for
    assert result.stdout.splitlines() == [
        f"job {record.id} already ended (completed at {before['finished_at']}); nothing to cancel"
    ]
    assert "stopping" not in result.stdout + result.stderr
    after = mat_json("finetune", "status", record.id, "--config", str(config))
    assert (after["status"], after["finished_at"]) == ("completed", before["finished_at"])


def test_qlora_on_a_cpu_machine_exits_2_before_anything_starts(
    tmp_path: Path, tiny_model_dir: Path, corpus_dir: Path
) -> None:
    section = {**opensource_section(tiny_model_dir, tmp_path / "models", max_steps=2), "use_4bit": True}
    config = write_config(tmp_path, {"opensource": section}, corpus=corpus_dir)

    result = mat("finetune", "start", "--config", str(config))

    assert result.returncode == 2
    assert "use_4bit" in result.stderr and "QLoRA" in result.stderr
    assert not (tmp_path / "jobs").exists() and not (tmp_path / "models").exists()


def test_missing_corpus_names_mat_ingest(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = write_config(tmp_path, {"opensource": opensource_section(tiny_model_dir, tmp_path / "m", 2)})

    result = mat("finetune", "start", "--config", str(config))

    assert result.returncode == 1
    assert "run `mat ingest` first or pass --corpus" in result.stderr
    assert not (tmp_path / "jobs").exists()


def plain_text() -> str:
    """Repository-like text of a few KB: enough chunks for a validation share."""
    return "".join(
        f"def handler_{i}(request, limit={i}):\n    return [x for x in load(request) if x.size < limit]\n"
        for i in range(120)
    )


def test_a_plain_text_corpus_trains(prefect_api: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    """The product description's `mat finetune start --corpus /path/to/corpus.txt`, no corpus.jsonl near."""
    corpus = tmp_path / "text" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text(plain_text(), encoding="utf-8")
    config = write_config(
        tmp_path, {"opensource": opensource_section(tiny_model_dir, tmp_path / "models", 2)}
    )

    result = mat("finetune", "start", "--config", str(config), "--corpus", str(corpus), "--name", "plain")

    assert result.returncode == 0, result.stdout + result.stderr
    (job,) = mat_json("finetune", "list", "--config", str(config))
    assert job["status"] == "completed" and job["error"] is None
    assert job["dataset"]["train_records"] > job["dataset"]["val_records"] >= 1
    assert job["metrics"]["eval_loss_after"] > 0
    assert f"default: job {job['id']} completed" in result.stdout


def test_a_broken_corpus_fails_the_job_with_its_message(
    prefect_api: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("déjà vu\n".encode("latin-1"))
    config = write_config(
        tmp_path, {"opensource": opensource_section(tiny_model_dir, tmp_path / "models", 2)}
    )

    result = mat("finetune", "start", "--config", str(config), "--corpus", str(corpus), "--name", "broken")

    message = f"{corpus} is not UTF-8 text (byte 1 is 0xe9); convert it to UTF-8"
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr and "failed: None" not in result.stderr
    assert message in result.stderr
    (job,) = mat_json("finetune", "list", "--config", str(config))
    assert job["status"] == "failed" and job["error"].startswith(message)
    status = mat("finetune", "status", job["id"], "--config", str(config))
    assert status.returncode == 0 and message in status.stdout


REGION = "us-east-1"
BUCKET = "mat-finetune-cli"
ROLE_ARN = "arn:aws:iam::123456789012:role/mat-bedrock"


@pytest.fixture
def moto_endpoint(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A moto server on 127.0.0.1 with the training bucket, and the environment that points `mat` at it."""
    with moto_server() as url:
        env = {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "AKIAFAKEFINETUNECLI1",
            "AWS_SECRET_ACCESS_KEY": "fake-secret-finetune-cli",
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_MAX_ATTEMPTS": "1",
        }
        s3 = boto3.client("s3", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        yield env


def test_bedrock_target_returns_at_once_with_its_arn_and_status_shows_it_running(
    prefect_api: str, tmp_path: Path, corpus_dir: Path, moto_endpoint: dict[str, str]
) -> None:
    bedrock = {
        "region": REGION,
        "role_arn": ROLE_ARN,
        "training_data_s3_uri": f"s3://{BUCKET}/data",
        "output_s3_uri": f"s3://{BUCKET}/output",
    }
    config = write_config(tmp_path, {"backend": "bedrock", "bedrock": bedrock}, corpus=corpus_dir)
    env = mat_env(**moto_endpoint)

    started = time.monotonic()
    result = mat("finetune", "start", "--config", str(config), "--name", "cloud", env=env)
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    assert elapsed < 60  # submission only: nothing waits for the job to train
    (job,) = mat_json("finetune", "list", "--config", str(config), env=env)
    assert job["backend"] == "bedrock" and job["external_id"].startswith("arn:aws:bedrock:")
    assert job["external_id"] in result.stdout
    status = mat_json("finetune", "status", job["external_id"], "--config", str(config), env=env)
    assert status["id"] == job["id"] and status["status"] == "running"
    assert moto_endpoint["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr
