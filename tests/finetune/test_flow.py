"""The finetune flow in this process (as `mat finetune start` runs it): a failed target fails the flow,
the other target finishes, and an SES alert (moto server on 127.0.0.1) names the failed target."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml

from flows.finetune import run_finetune
from multiagenttrainer.errors import BackendError
from multiagenttrainer.finetune.base import JobRecord, JobStore
from tests.finetune.conftest import opensource_section
from tests.support.aws import isolate_aws, moto_server, sent_messages

pytestmark = pytest.mark.integration

REGION = "eu-west-1"
SENDER = "mat@example.com"
RECIPIENTS = ["ops@example.com"]
SECRET = "moto-secret-finetune-flow"


@pytest.fixture
def ses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """moto's server with SES, the sender verified, fake credentials; yields its URL."""
    with moto_server() as url:
        isolate_aws(monkeypatch, tmp_path)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SES", url)
        boto3.client("ses", region_name=REGION).verify_email_identity(EmailAddress=SENDER)
        yield url


def test_a_failed_target_fails_the_flow_and_alerts_while_the_other_finishes(
    prefect_api: str, ses: str, tmp_path: Path, tiny_model_dir: Path, corpus_dir: Path
) -> None:
    name = f"mixed-{uuid.uuid4().hex[:6]}"
    document = {
        "finetuner": {
            "jobs_dir": str(tmp_path / "jobs"),
            "opensource": opensource_section(tiny_model_dir, tmp_path / "models", max_steps=2),
            "targets": [{"name": "local"}, {"name": "cloud", "backend": "bedrock"}],
        },
        "corpus": {"dir": str(corpus_dir)},
        "notifications": {"ses": {"from_email": SENDER, "to_emails": RECIPIENTS, "region": REGION}},
    }
    config = tmp_path / "mat.yaml"
    config.write_text(yaml.safe_dump(document), encoding="utf-8")
    seen: list[list[JobRecord]] = []

    with pytest.raises(BackendError, match="target 'cloud'.*training_data_s3_uri is not set"):
        run_finetune(config, name=name, on_progress=seen.append)

    records = {r.target: r for r in JobStore(tmp_path / "jobs").all()}
    assert records["local"].status == "completed" and records["cloud"].status == "failed"
    assert any(batch and batch[0].target == "local" for batch in seen)
    (message,) = [m for m in sent_messages(ses) if f"finetune {name}" in m["subject"]]
    assert "target 'cloud'" in message["body"] and "Flow run:" in message["body"]
    assert SECRET not in json.dumps(message)
