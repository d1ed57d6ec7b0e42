"""SES alerts from the train flow, sent to moto running as a server on 127.0.0.1 and read back from it.

The flow runs in this process (run_train, as the CLI calls it) against the session's Prefect server, so
the alerts carry a link to the flow run. boto3 finds moto through AWS_ENDPOINT_URL_SES.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from flows.train import run_train
from multiagenttrainer.errors import CorpusError
from tests.support.aws import isolate_aws, moto_server, sent_messages
from tests.training.conftest import AGENTS, FIXED_STEPS, only_run_dir, write_config

pytestmark = pytest.mark.integration

REGION = "eu-west-1"
SENDER = "mat@example.com"
RECIPIENTS = ["ops@example.com", "lead@example.com"]
SECRET = "moto-secret-not-for-mail"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server on a free port of 127.0.0.1, shared by this module's tests."""
    with moto_server() as url:
        yield url


@pytest.fixture
def ses(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Fake credentials, SES pointed at moto, the sender verified there; yields moto's URL."""
    isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SES", moto_url)
    monkeypatch.setenv("MAT_FIXED_STEPS", FIXED_STEPS)  # reaches train.py through the executor's environment
    boto3.client("ses", region_name=REGION).verify_email_identity(EmailAddress=SENDER)
    return moto_url


def messages_about(moto_url: str, run_name: str) -> list[dict[str, Any]]:
    return [m for m in sent_messages(moto_url) if f"run {run_name}" in m["subject"]]


def notifications() -> dict[str, Any]:
    return {
        "ses": {
            "from_email": SENDER,
            "to_emails": RECIPIENTS,
            "region": REGION,
            "subject_prefix": "[mat-test]",
        }
    }


def test_a_crashed_experiment_sends_an_email_with_the_error_and_a_link(
    prefect_api: str, ses: str, tiny_source: Path, tmp_path: Path
) -> None:
    name = f"broken-{uuid.uuid4().hex[:6]}"
    agent = f"{sys.executable} {AGENTS / 'break_train.py'}"
    config = write_config(
        tmp_path,
        tiny_source,
        training={"max_experiments": 2, "agent_command": agent},
        notifications=notifications(),
    )
    summary = run_train(config, name=name)

    assert summary["status"] == "completed" and summary["experiments"] == 2
    run_dir = only_run_dir(tmp_path / "runs")
    state = json.loads((run_dir / "run.json").read_text())
    assert [e["status"] for e in state["experiments"]] == ["keep", "crash"]
    (message,) = messages_about(ses, name)
    assert message["subject"] == f"[mat-test] run {name}: experiment 1 crashed"
    assert message["source"] == SENDER
    assert message["destinations"]["ToAddresses"] == RECIPIENTS
    body = message["body"]
    assert f"Experiment 1 of run {name} ({run_dir.name}) crashed." in body
    assert "Error: training exited with code 1" in body
    assert "Change: break train.py with a syntax error" in body
    assert f"Log: {run_dir / 'logs' / 'exp-001.log'}" in body
    assert "SyntaxError" in body.split("Log tail:", 1)[1]  # the tail of the training log
    assert f"Flow run: {state['flow_run_url']}" in body
    assert state["flow_run_url"].startswith(prefect_api.removesuffix("/api") + "/runs/flow-run/")
    assert SECRET not in json.dumps(sent_messages(ses))


def test_a_failed_run_sends_an_email_from_the_flow_hook(prefect_api: str, ses: str, tmp_path: Path) -> None:
    name = f"nocorpus-{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path, None, notifications=notifications())  # no sources, no corpus on disk

    with pytest.raises(CorpusError, match="no corpus at"):
        run_train(config, name=name)

    (message,) = messages_about(ses, name)
    assert message["subject"] == f"[mat-test] run {name} failed"
    assert message["destinations"]["ToAddresses"] == RECIPIENTS
    body = message["body"]
    assert body.startswith(f"Run {name} failed.\n\nError: no corpus at {tmp_path / 'corpus'}")
    flow_link = prefect_api.removesuffix("/api") + "/runs/flow-run/"
    tail = body.split("Log tail:", 1)[1]
    assert f"Flow run: {flow_link}" in body and "CorpusError" in tail
    assert "multiagenttrainer/training.py" in tail and "flows/train.py" in tail  # mat's frames
    assert "site-packages/prefect/" not in tail and "flow_engine.py" not in tail  # not the engine's
    state = json.loads((only_run_dir(tmp_path / "runs") / "run.json").read_text())
    assert state["status"] == "failed" and "no corpus at" in state["error"]


def test_without_notifications_nothing_is_sent(prefect_api: str, ses: str, tmp_path: Path) -> None:
    name = f"quiet-{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path, None)

    with pytest.raises(CorpusError):
        run_train(config, name=name)
    assert messages_about(ses, name) == []


def test_a_crashed_flow_run_sends_a_crashed_alert(ses: str, tmp_path: Path) -> None:
    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Crashed

    from flows.train import alert_run_failure, train

    name = f"killed-{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path, None, notifications=notifications())
    flow_run = FlowRun(flow_id=uuid.uuid4(), name=name, parameters={"config_path": str(config), "name": name})
    alert_run_failure(train, flow_run, Crashed(message="Execution was aborted by a termination signal."))

    (message,) = messages_about(ses, name)
    assert message["subject"] == f"[mat-test] run {name} crashed"
    assert message["body"].startswith(
        f"Run {name} crashed.\n\nError: Execution was aborted by a termination signal."
    )


def test_ses_settings_kept_in_a_block_send_the_alerts(
    prefect_api: str, ses: str, tiny_source: Path, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    from blocks.settings import SesAlertSettings, register_block_types

    register_block_types()
    SesAlertSettings(
        from_email=SENDER, to_emails=RECIPIENTS, region=REGION, subject_prefix="[mat-block]"
    ).save("default", overwrite=True)
    name = f"blocked-{uuid.uuid4().hex[:6]}"
    agent = f"{sys.executable} {AGENTS / 'break_train.py'}"
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 2, "agent_command": agent})
    try:
        summary = run_train(config, name=name)  # the config has no notifications: section
    finally:
        with get_client(sync_client=True) as client:
            client.delete_block_document(client.read_block_document_by_name("default", "mat-ses-alerts").id)

    assert summary["status"] == "completed"
    (message,) = messages_about(ses, name)
    assert message["subject"] == f"[mat-block] run {name}: experiment 1 crashed"
    assert message["destinations"]["ToAddresses"] == RECIPIENTS
    assert "that was the run's last experiment" in message["body"]
