"""Fixtures for the Bedrock backend: an isolated AWS environment under moto, a bucket and a corpus."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from multiagenttrainer.config import BedrockConfig
from multiagenttrainer.finetune.base import JobStore
from multiagenttrainer.finetune.bedrock import BedrockFineTuner
from tests.support.aws import isolate_aws

REGION = "us-east-1"
BUCKET = "mat-training"
ROLE_ARN = "arn:aws:iam::123456789012:role/mat-bedrock"
ACCESS_KEY = "AKIAFAKEFINETUNE0001"
SECRET_KEY = "fake/secret+finetune/never-printed-42"


@pytest.fixture
def clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS settings from the machine: no credentials, no profile files, no instance metadata."""
    isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return monkeypatch


@pytest.fixture
def aws(clean_aws_env: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake credentials and moto's in-process AWS with the training bucket created."""
    clean_aws_env.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    clean_aws_env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield


def bedrock_config(**fields: Any) -> BedrockConfig:
    """A complete Bedrock config pointing at the moto bucket; `fields` override it."""
    values: dict[str, Any] = {
        "region": REGION,
        "role_arn": ROLE_ARN,
        "training_data_s3_uri": f"s3://{BUCKET}/data",
        "output_s3_uri": f"s3://{BUCKET}/output",
        **fields,
    }
    return BedrockConfig(**values)


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs")


@pytest.fixture
def make_tuner(store: JobStore) -> Callable[..., BedrockFineTuner]:
    def build(target: str = "titan", **fields: Any) -> BedrockFineTuner:
        return BedrockFineTuner(bedrock_config(**fields), store, target)

    return build


def write_corpus(directory: Path, records: list[dict[str, str]]) -> Path:
    """corpus.jsonl (and an empty corpus.txt beside it) in `directory`; the corpus.txt path."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"source": "local", "repo": "acme/app", **record}) for record in records]
    (directory / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (directory / "corpus.txt").write_text("", encoding="utf-8")
    return directory / "corpus.txt"


def read_jsonl(uri: str) -> list[dict[str, str]]:
    """The records of a JSONL object in moto's S3."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read()
    return [json.loads(line) for line in body.decode("utf-8").splitlines()]
