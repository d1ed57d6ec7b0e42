"""E-mail alerts through Amazon SES when an experiment crashes or a run fails.

Credentials come from boto3's usual chain (environment, profile, instance role) and `AWS_ENDPOINT_URL*`
applies, so a local SES emulator works without code changes. An alert is a convenience: `notify_safely`
turns every delivery problem into a logged warning so it can never break the training pipeline.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multiagenttrainer.config import NotificationsConfig, SesConfig
from multiagenttrainer.errors import NotificationError
from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.history import ExperimentResult

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
LIBRARY_ROOT = Path(__file__).resolve().parent  # frames under it are mat's own
MAX_SUBJECT_CHARS = 200  # SES rejects very long subjects; ours are short, this only guards odd run names


# ---------------------------------------------------------------- alert text


def tail_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


def read_log_tail(log_path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or '' when it cannot be read."""
    if not log_path:
        return ""
    try:
        return tail_lines(Path(log_path).read_text(encoding="utf-8", errors="replace"), lines)
    except OSError:
        return ""


def is_under(filename: str, roots: Sequence[Path]) -> bool:
    """Whether a traceback frame's file lies under one of `roots`."""
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in roots)


def keep_frames(exc: traceback.TracebackException, roots: Sequence[Path]) -> None:
    """Drop every frame outside `roots` from `exc` and the exceptions chained to it (in place)."""
    seen: set[int] = set()
    pending: list[traceback.TracebackException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [f for f in current.stack if is_under(f.filename, roots)]
        )
        pending += [current.__cause__, current.__context__]


def failure_traceback(
    error: BaseException, extra_roots: Sequence[Path] = (), lines: int = LOG_TAIL_LINES
) -> str:
    """The last `lines` of `error`'s traceback, with only mat's frames (the library's and `extra_roots`).

    The frames of the orchestration around it (Prefect's engine, threads, event loops) say nothing about
    what went wrong, and would push the library's frames out of an alert's tail.
    """
    exc = traceback.TracebackException.from_exception(error)
    keep_frames(exc, [LIBRARY_ROOT, *(Path(root).resolve() for root in extra_roots)])
    return tail_lines("".join(exc.format()).rstrip("\n"), lines)


def experiment_crash_alert(
    state: RunState, result: ExperimentResult, flow_run_url: str | None = None
) -> tuple[str, str]:
    """(subject, body) of the alert for a crashed experiment."""
    reason, _, error_rest = (result.error or "no error message was recorded").partition("\n")
    log_tail = read_log_tail(result.log_path) or error_rest.strip("\n")
    subject = f"run {state.name}: experiment {result.experiment_id} crashed"
    lines = [
        f"Experiment {result.experiment_id} of run {state.name} ({state.run_id}) crashed.",
        "",
        f"Error: {reason.strip()}",
        f"Change: {result.description or '(no description)'}",
        f"Commit: {result.commit[:7] or 'none'}",
        f"Machine: {result.machine}",
        f"Log: {result.log_path or 'none'}",
        f"Experiments done: {state.done} of {state.max_experiments}; {what_next(state)}",
    ]
    return subject, _finish_body(lines, log_tail, flow_run_url or state.flow_run_url)


def what_next(state: RunState) -> str:
    """After a crashed experiment: whether the run goes on, or that was its last experiment."""
    if state.done < state.max_experiments:
        return "the run goes on with the next one."
    return "that was the run's last experiment; the run ends with it."


def run_failure_alert(
    run_name: str, error: str, log_tail: str = "", flow_run_url: str | None = None, *, crashed: bool = False
) -> tuple[str, str]:
    """(subject, body) of the alert for a run or flow that failed, or crashed (killed, lost its process)."""
    reason, _, details = (error or "no error message was recorded").partition("\n")
    outcome = "crashed" if crashed else "failed"
    lines = [f"Run {run_name} {outcome}.", "", f"Error: {reason.strip()}"]
    if details.strip():
        lines += ["", details.strip("\n")]
    return f"run {run_name} {outcome}", _finish_body(lines, tail_lines(log_tail), flow_run_url)


def _finish_body(lines: list[str], log_tail: str, flow_run_url: str | None) -> str:
    if flow_run_url:
        lines += ["", f"Flow run: {flow_run_url}"]
    if log_tail.strip():
        lines += ["", "Log tail:", log_tail]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- sending


class SesNotifier:
    """Sends plain-text e-mails from `cfg.from_email` to `cfg.to_emails` through SES."""

    def __init__(self, cfg: SesConfig) -> None:
        self.cfg = cfg
        self._client: Any = None

    def send(self, subject: str, body: str) -> str:
        """Send one alert; returns the SES message id. Raises NotificationError."""
        full_subject = " ".join(f"{self.cfg.subject_prefix} {subject}".split())[:MAX_SUBJECT_CHARS]
        try:
            response = self._ses().send_email(
                Source=self.cfg.from_email,
                Destination={"ToAddresses": list(self.cfg.to_emails)},
                Message={
                    "Subject": {"Data": full_subject, "Charset": "UTF-8"},
                    "Body": {"Text": {"Data": body, "Charset": "UTF-8"}},
                },
            )
        except Exception as exc:  # botocore raises many unrelated types; all mean "not delivered"
            raise self._translate(exc) from exc
        return str(response["MessageId"])

    def _ses(self) -> Any:
        if self._client is None:
            import boto3  # lazy: boto3 takes ~0.3 s to import and most runs send no alert

            self._client = boto3.client("ses", region_name=self.cfg.region)
        return self._client

    def _translate(self, exc: Exception) -> NotificationError:
        from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

        sender = self.cfg.from_email
        if isinstance(exc, NoCredentialsError):
            return NotificationError(
                f"SES alert from {sender} not sent: no AWS credentials found; set AWS_PROFILE or "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or remove notifications.ses"
            )
        if isinstance(exc, NoRegionError):
            return NotificationError(
                f"SES alert from {sender} not sent: no AWS region; set notifications.ses.region or AWS_REGION"
            )
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            reason = f"{error.get('Code', 'error')}: {error.get('Message', '')}"
            return NotificationError(
                f"SES refused the alert from {sender} ({reason}); "
                f"verify {sender} and the recipients in SES{self._region_text()}, or leave the SES sandbox"
            )
        return NotificationError(f"SES alert from {sender} not sent: {type(exc).__name__}: {exc}")

    def _region_text(self) -> str:
        region = self.cfg.region or (self._client.meta.region_name if self._client is not None else None)
        return f" ({region})" if region else ""


def make_notifier(notifications_cfg: NotificationsConfig | None) -> SesNotifier | None:
    """An SES notifier when `notifications.ses` is configured, else None."""
    if notifications_cfg is None or notifications_cfg.ses is None:
        return None
    return SesNotifier(notifications_cfg.ses)


def notify_safely(notifier: SesNotifier | None, subject: str, body: str) -> str | None:
    """Send an alert if a notifier is configured; log a warning instead of raising. Returns the message id."""
    if notifier is None:
        return None
    try:
        return notifier.send(subject, body)
    except NotificationError as exc:
        log.warning("%s", exc)
    except Exception as exc:  # an alert must never take the pipeline down with it
        log.warning("SES alert %r not sent: %s: %s", subject, type(exc).__name__, exc)
    return None
