"""SES alerts against moto: the sent messages are read back from moto's SES backend."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

from multiagenttrainer.config import NotificationsConfig, SesConfig, load_config
from multiagenttrainer.errors import NotificationError
from multiagenttrainer.notify import (
    SesNotifier,
    experiment_crash_alert,
    failure_traceback,
    make_notifier,
    notify_safely,
    run_failure_alert,
)
from tests.support.aws import isolate_aws
from tests.support.run_states import CRASH_ERROR, make_state, result

REGION = "eu-west-1"
SENDER = "mat@example.com"
RECIPIENTS = ["ops@example.com", "lead@example.com"]
SECRET = "moto-secret-key-not-for-messages"


@pytest.fixture
def clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials, profiles or endpoints from the developer's machine; no instance metadata lookups."""
    isolate_aws(monkeypatch, tmp_path)


@pytest.fixture
def ses(clean_aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's SES with the sender verified; yields moto's backend for the region."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    with mock_aws():
        boto3.client("ses", region_name=REGION).verify_email_identity(EmailAddress=SENDER)
        yield ses_backends[DEFAULT_ACCOUNT_ID][REGION]


def ses_config(sender: str = SENDER) -> SesConfig:
    return SesConfig(from_email=sender, to_emails=RECIPIENTS, region=REGION, subject_prefix="[mat-test]")


def test_crash_alert_is_delivered_with_run_experiment_error_log_tail_and_link(
    ses: Any, tmp_path: Path
) -> None:
    log = tmp_path / "exp-003.log"
    log.write_text(
        "".join(f"step {i}\n" for i in range(100)) + "RuntimeError: shape mismatch\n", encoding="utf-8"
    )
    crashed = result(
        3, "crash", None, "break the model", 12.0, machine="gpu-b", error=CRASH_ERROR, log_path=str(log)
    )
    subject, body = experiment_crash_alert(make_state(), crashed, "http://127.0.0.1:4200/runs/flow-run/abc")
    message_id = SesNotifier(ses_config()).send(subject, body)

    [message] = ses.sent_messages
    assert message.id == message_id
    assert message.source == SENDER
    assert message.subject == "[mat-test] run nightly: experiment 3 crashed"
    assert message.destinations["ToAddresses"] == RECIPIENTS
    assert "Experiment 3 of run nightly (20250308-020000-nightly) crashed." in message.body
    assert "Error: RuntimeError: shape mismatch in attention" in message.body
    assert "Change: break the model" in message.body
    assert "Machine: gpu-b" in message.body
    assert "Flow run: http://127.0.0.1:4200/runs/flow-run/abc" in message.body
    assert "Log tail:\n" in message.body and "step 99\nRuntimeError: shape mismatch" in message.body
    assert "step 59\n" not in message.body  # only the tail of the log


def test_crash_alert_without_a_log_file_uses_the_recorded_log_lines() -> None:
    state = make_state()
    state.flow_run_url = "http://prefect.example/runs/flow-run/42"
    crashed = result(
        3, "crash", None, "break the model", 12.0, error=CRASH_ERROR, log_path="/nonexistent/exp.log"
    )
    _, body = experiment_crash_alert(state, crashed)
    assert "Log tail:\nTraceback (most recent call last):\n  File train.py" in body
    assert "Flow run: http://prefect.example/runs/flow-run/42" in body


def test_run_failure_alert_is_delivered(ses: Any) -> None:
    subject, body = run_failure_alert(
        "nightly",
        "ExperimentError: workspace is gone\ndetails here",
        log_tail="a\nb\nlast line",
        flow_run_url="http://127.0.0.1:4200/runs/flow-run/def",
    )
    SesNotifier(ses_config()).send(subject, body)
    [message] = ses.sent_messages
    assert message.subject == "[mat-test] run nightly failed"
    assert message.body.startswith("Run nightly failed.\n\nError: ExperimentError: workspace is gone\n")
    assert "details here" in message.body
    assert "Flow run: http://127.0.0.1:4200/runs/flow-run/def" in message.body
    assert message.body.endswith("Log tail:\na\nb\nlast line\n")


def test_unverified_sender_is_a_warning_not_an_exception(ses: Any, caplog: pytest.LogCaptureFixture) -> None:
    notifier = SesNotifier(ses_config("stranger@example.com"))
    with pytest.raises(NotificationError, match="verify stranger@example.com"):
        notifier.send("subject", "body")
    with caplog.at_level(logging.WARNING, logger="multiagenttrainer.notify"):
        assert notify_safely(notifier, "subject", "body") is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "SES refused the alert from stranger@example.com (MessageRejected" in record.getMessage()
    assert SECRET not in record.getMessage()
    assert ses.sent_messages == []


def test_missing_credentials_are_reported_and_swallowed(
    clean_aws_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SesNotifier(ses_config())
    with pytest.raises(NotificationError, match="no AWS credentials found; set AWS_PROFILE"):
        notifier.send("subject", "body")
    with caplog.at_level(logging.WARNING, logger="multiagenttrainer.notify"):
        assert notify_safely(notifier, "subject", "body") is None
    assert "no AWS credentials" in caplog.text


def test_make_notifier_only_when_ses_is_configured(ses: Any) -> None:
    assert make_notifier(NotificationsConfig()) is None
    assert make_notifier(None) is None
    assert notify_safely(None, "subject", "body") is None
    notifier = make_notifier(NotificationsConfig(ses=ses_config()))
    assert isinstance(notifier, SesNotifier)
    assert notify_safely(notifier, "multi\nline   subject", "body")
    assert ses.sent_messages[0].subject == "[mat-test] multi line subject"


# ---------------------------------------------------------------- wording, subjects, traceback tails


def test_a_crash_before_the_last_experiment_says_the_run_goes_on() -> None:
    state = make_state(max_experiments=8)  # six experiments recorded, two to go
    _, body = experiment_crash_alert(state, state.experiments[3])
    assert "Experiments done: 6 of 8; the run goes on with the next one." in body


def test_a_crash_in_the_last_experiment_says_the_run_ends_with_it() -> None:
    state = make_state(max_experiments=6)
    crashed = result(5, "crash", None, "break it at the end", 3.0, error=CRASH_ERROR)
    state.experiments[5] = crashed
    subject, body = experiment_crash_alert(state, crashed)
    assert subject == "run nightly: experiment 5 crashed"
    assert "Experiments done: 6 of 6; that was the run's last experiment; the run ends with it." in body
    assert "goes on" not in body


def test_a_crashed_run_says_crashed_and_a_failed_run_says_failed() -> None:
    crashed_subject, crashed_body = run_failure_alert(
        "nightly", "Execution was aborted by a termination signal.", crashed=True
    )
    failed_subject, failed_body = run_failure_alert("nightly", "ExperimentError: workspace is gone")
    assert crashed_subject == "run nightly crashed" and crashed_body.startswith("Run nightly crashed.\n")
    assert failed_subject == "run nightly failed" and failed_body.startswith("Run nightly failed.\n")


def raise_through(outer: Callable[[Callable[[], None]], object], inner: Callable[[], None]) -> BaseException:
    """The exception `inner` raises when it is called by code outside mat (`outer`)."""
    try:
        outer(inner)
    except Exception as exc:
        return exc
    raise AssertionError("nothing was raised")


def test_the_traceback_tail_keeps_mat_frames_and_drops_the_callers() -> None:
    def load_missing_config() -> None:
        load_config("/nonexistent/mat.yaml")

    # A thread pool stands in for an orchestrator: its frames (concurrent/futures) are not mat's.
    error = raise_through(lambda fn: ThreadPoolExecutor(1).submit(fn).result(), load_missing_config)
    tail = failure_traceback(error, extra_roots=[Path(__file__).parent])
    assert "multiagenttrainer/config/__init__.py" in tail and "in load_config" in tail
    assert "test_notify.py" in tail and "in load_missing_config" in tail  # an extra root
    assert "concurrent/futures" not in tail and "threading.py" not in tail
    assert tail.rstrip().endswith(
        "ConfigError: /nonexistent/mat.yaml: config file not found; copy "
        "configs/config.example.yaml to multiagenttrainer.yaml or pass --config PATH"
    )
    assert "concurrent/futures" in "".join(traceback.format_exception(error))  # they were there
