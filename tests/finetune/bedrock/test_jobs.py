"""start_job / get_status / cancel_job against moto's Bedrock, and the job records they leave."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.bedrock.models import bedrock_backends
from moto.core import DEFAULT_ACCOUNT_ID

from multiagenttrainer.errors import BackendError, ConfigError
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.bedrock import bedrock_job_name, client_error
from tests.finetune.bedrock.conftest import BUCKET, REGION, ROLE_ARN, write_corpus


def set_moto_status(job_name: str, status: str) -> None:
    """Drive a moto customization job to `status` (moto never advances jobs by itself)."""
    bedrock_backends[DEFAULT_ACCOUNT_ID][REGION].model_customization_jobs[job_name].status = status


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(
        tmp_path / "corpus",
        [
            {"path": "a.py", "split": "train", "text": "def a():\n    return 1\n"},
            {"path": "b.py", "split": "val", "text": "def b():\n    return 2\n"},
        ],
    )


def started(tuner, corpus, name="nightly run"):
    return tuner.start_job(tuner.prepare_dataset(corpus), name)


def test_start_job_creates_the_job_with_string_hyperparameters(aws, make_tuner, corpus, store):
    tuner = make_tuner(epochs=2, batch_size=1, learning_rate=2e-5, customization_type="FINE_TUNING")
    record = started(tuner, corpus)

    job = boto3.client("bedrock", region_name=REGION).get_model_customization_job(jobIdentifier=record.id)
    assert job["hyperParameters"] == {"epochCount": "2", "batchSize": "1", "learningRate": "2e-05"}
    assert job["jobArn"] == record.external_id
    assert job["roleArn"] == ROLE_ARN
    assert job["baseModelArn"].endswith("foundation-model/amazon.titan-text-lite-v1")
    assert job["customizationType"] == "FINE_TUNING"
    assert job["trainingDataConfig"]["s3Uri"] == record.dataset["train_s3_uri"]
    assert job["validationDataConfig"] == {"validators": [{"s3Uri": record.dataset["validation_s3_uri"]}]}
    assert job["outputDataConfig"]["s3Uri"] == f"s3://{BUCKET}/output"
    assert (record.status, record.backend, record.target, record.name) == (
        "running",
        "bedrock",
        "titan",
        "nightly run",
    )
    assert record.id.startswith("nightly-run-") and len(record.id) <= 63
    saved = json.loads((store.jobs_dir / "titan" / f"{record.id}.json").read_text())
    assert saved["external_id"] == record.external_id and saved["status"] == "running"
    assert saved["dataset"]["train_records"] == 1 and saved["dataset"]["val_records"] == 1


def test_no_validation_split_means_no_validation_config(aws, make_tuner, tmp_path):
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "train", "text": "x = 1\n"}])
    record = started(make_tuner(), corpus)
    job = boto3.client("bedrock", region_name=REGION).get_model_customization_job(jobIdentifier=record.id)
    assert not job.get("validationDataConfig")
    assert job["customizationType"] == "CONTINUED_PRE_TRAINING"


def test_completed_job_records_the_output_model(aws, make_tuner, corpus, store):
    tuner = make_tuner()
    record = started(tuner, corpus)
    set_moto_status(record.id, "Completed")

    done = tuner.get_status(record.external_id)  # the ARN finds the record too
    assert done.status == "completed" and done.finished
    assert done.output_path and done.output_path.startswith("arn:aws:bedrock:us-east-1:")
    assert done.finished_at is not None and done.error is None
    assert store.get(record.id).status == "completed"


def test_failed_job_records_the_failure_message(aws, make_tuner, corpus, store):
    tuner = make_tuner()
    record = started(tuner, corpus)
    set_moto_status(record.id, "Failed")
    failed = tuner.get_status(record.id)
    assert failed.status == "failed"
    assert failed.error == "Failure Message"  # moto's fixed failureMessage
    assert store.get(record.id).error == "Failure Message"


@pytest.mark.parametrize(("bedrock_status", "ours"), [("InProgress", "running"), ("Stopping", "cancelled")])
def test_other_statuses_map(aws, make_tuner, corpus, bedrock_status, ours):
    tuner = make_tuner()
    record = started(tuner, corpus)
    set_moto_status(record.id, bedrock_status)
    assert tuner.get_status(record.id).status == ours


def test_cancel_stops_the_bedrock_job(aws, make_tuner, corpus, store):
    tuner = make_tuner()
    record = started(tuner, corpus)
    cancelled = tuner.cancel_job(record.id)
    job = boto3.client("bedrock", region_name=REGION).get_model_customization_job(jobIdentifier=record.id)
    assert job["status"] == "Stopped"
    assert cancelled.status == "cancelled"
    assert store.get(record.id).status == "cancelled"


def test_cancel_leaves_a_finished_job_alone(aws, make_tuner, corpus):
    tuner = make_tuner()
    record = started(tuner, corpus)
    set_moto_status(record.id, "Completed")
    assert tuner.cancel_job(record.id).status == "completed"
    assert (
        bedrock_backends[DEFAULT_ACCOUNT_ID][REGION].model_customization_jobs[record.id].status == "Completed"
    )


@pytest.mark.parametrize("field", ["role_arn", "output_s3_uri"])
def test_missing_settings_name_the_field(aws, make_tuner, corpus, field):
    tuner = make_tuner(**{field: None})
    dataset = tuner.prepare_dataset(corpus)
    with pytest.raises(ConfigError, match=rf"finetuner\.bedrock\.{field} is not set"):
        tuner.start_job(dataset, "x")
    assert bedrock_backends[DEFAULT_ACCOUNT_ID][REGION].model_customization_jobs == {}


def test_a_job_unknown_to_bedrock_is_a_backend_error(aws, make_tuner, store):
    store.save(JobRecord(id="gone-job", backend="bedrock", target="titan", model="m", status="running"))
    with pytest.raises(BackendError, match="ResourceNotFoundException.*mat finetune list"):
        make_tuner().get_status("gone-job")
    with pytest.raises(BackendError, match="no fine-tuning job 'nope'"):
        make_tuner().get_status("nope")


def test_access_denied_and_validation_errors_carry_the_fix():
    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not allowed"}}, "Create")
    assert "iam:PassRole" in str(client_error("starting Bedrock job 'j'", denied))
    invalid = ClientError({"Error": {"Code": "ValidationException", "Message": "bad epochCount"}}, "Create")
    message = str(client_error("starting Bedrock job 'j'", invalid))
    assert message.startswith("starting Bedrock job 'j': AWS said ValidationException: bad epochCount;")
    assert "finetuner.bedrock" in message


def test_job_names_are_unique_and_within_bedrock_rules():
    names = {bedrock_job_name("my job/with:odd chars" * 5) for _ in range(20)}
    assert len(names) == 20
    assert all(len(n) <= 63 and n[0].isalnum() and all(c.isalnum() or c == "-" for c in n) for n in names)
