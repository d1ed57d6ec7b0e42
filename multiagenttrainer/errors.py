"""The exceptions mat raises on purpose.

    MatError                      anything the user can act on; the CLI prints one line, no traceback
    ├── ConfigError               the YAML or the command line is wrong          -> exit code 2
    ├── SourceError               one data source could not be fetched           -> exit code 1
    │   └── TransientSourceError  ...for a reason that may pass (network, 5xx, rate limit); retried
    ├── IngestIncomplete          sources failed or came in part; corpus of the rest -> exit code 1
    ├── CorpusError               the corpus could not be built or read          -> exit code 1
    ├── ServerError               the local Prefect server could not be started  -> exit code 1
    ├── MachineError              an execution target is unreachable or broken   -> exit code 1
    ├── ExperimentError           a training experiment could not be run         -> exit code 1
    ├── DiskFullError             a disk filled up; free space and run the command again -> exit code 1
    ├── BackendError              a fine-tuning backend refused or failed a job  -> exit code 1
    │   ├── TargetFailed          one target's job ended `failed` (carries its record)
    │   └── TargetsFailed         some targets of `mat finetune start` failed; the others ran
    ├── ServeError                a model could not be loaded or served          -> exit code 1
    ├── RequestRefused            `mat request` refused a request, with reasons   -> exit code 3
    ├── PlannerError              the planner LLM failed, or its answer could not be read -> exit code 1
    └── NotificationError         an alert could not be sent (SES); logged, never fatal

Third-party exceptions are translated into these at the adapter boundary (`raise ... from exc`),
and messages never contain credentials.
"""

from __future__ import annotations

import errno
import os
from typing import Any


class MatError(Exception):
    """Base class: a failure with a message that tells the user what to do."""

    exit_code = 1


class ConfigError(MatError):
    """The configuration is invalid; `problems` lists every issue found."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SourceError(MatError):
    """A source failed; the message names the source and the fix."""

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        self.reason = message
        super().__init__(f"source {source!r}: {message}")


class TransientSourceError(SourceError):
    """A source failed for a reason that may go away on retry (network, 5xx, rate limit)."""


class IngestIncomplete(MatError):
    """Some sources failed or came only in part; the corpus holds the rest. `summary`: the ingest's."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        failures = summary.get("failures", [])
        total = len(summary.get("sources", [])) or len(failures)
        partial = sum(1 for failure in failures if failure.get("partial"))
        counts = [f"{len(failures) - partial} of {total} sources failed"] if len(failures) > partial else []
        counts += [f"{partial} of {total} sources were fetched only in part"] if partial else []
        lines = ["; ".join(counts) + ":"]
        lines += [f"  {failure['source']}: {failure['error']}" for failure in failures]
        if summary.get("stats") is not None:
            lines.append(f"The corpus in {summary.get('corpus_dir')} was built from what could be fetched.")
        else:
            lines.append("No corpus was written.")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[type[IngestIncomplete], tuple[dict[str, Any]]]:
        return (type(self), (self.summary,))  # Prefect pickles a failed flow's exception


class CorpusError(MatError):
    """The corpus could not be built or read."""


class ServerError(MatError):
    """The local Prefect server could not be started, found or stopped."""


class MachineError(MatError):
    """An execution target could not be reached or used."""


class ExperimentError(MatError):
    """A training experiment could not be run."""


class BackendError(MatError):
    """A fine-tuning backend failed or refused a request."""


class TargetFailed(BackendError):
    """One fine-tuning target's job ended `failed`; `record` is that job's record (JSON form)."""

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        self.record = record
        super().__init__(message)

    def __reduce__(self) -> tuple[type[TargetFailed], tuple[str, dict[str, Any]]]:
        return (type(self), (str(self), self.record))


class TargetsFailed(BackendError):
    """Some fine-tuning targets failed; the others ran. `summary` holds every job's record."""

    def __init__(self, summary: dict[str, Any], failures: list[str]) -> None:
        self.summary = summary
        self.failures = list(failures)
        super().__init__("; ".join(self.failures))

    def __reduce__(self) -> tuple[type[TargetsFailed], tuple[dict[str, Any], list[str]]]:
        return (type(self), (self.summary, self.failures))  # Prefect pickles a failed flow's exception


class ServeError(MatError):
    """A model could not be loaded or served (`mat serve`, `mat finetune export`)."""


class RequestRefused(MatError):
    """A model request that cannot be met, or that the policy refuses; `reasons`: one line each."""

    exit_code = 3

    def __init__(self, request_id: str, reasons: list[str]) -> None:
        self.request_id = request_id
        self.reasons = list(reasons)
        super().__init__(f"request {request_id} refused: " + "; ".join(self.reasons))

    def __reduce__(self) -> tuple[type[RequestRefused], tuple[str, list[str]]]:
        return (type(self), (self.request_id, self.reasons))  # Prefect pickles a failed flow's exception


class PlannerError(MatError):
    """The planner LLM command failed or answered something that is not what was asked for."""


class NotificationError(MatError):
    """An alert could not be delivered; callers log it and carry on."""


class DiskFullError(MatError):
    """A write failed because its file system is full (ENOSPC, or a quota: EDQUOT)."""


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
MIN_FREE_BYTES = 64 << 20


def is_disk_full(error: BaseException) -> bool:
    """Whether an error is a full file system (or an exhausted quota)."""
    return isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS


def disk_full_error(
    error: OSError, where: str | os.PathLike[str], needed_bytes: int, then: str
) -> DiskFullError:
    """One line: which path, how much is free there, how much to free, and the command to run after."""
    path = str(error.filename or where)
    try:
        usage = os.statvfs(where)
        free = f"{usage.f_bavail * usage.f_frsize / 1e6:.0f} MB free"
    except OSError:
        free = "free space unknown"
    needed = max(needed_bytes, MIN_FREE_BYTES)
    return DiskFullError(
        f"no space left on the device of {path} ({free}): free at least {needed / 1e6:.0f} MB there, "
        f"then {then}"
    )


INTERRUPTED_MESSAGE = "interrupted; run the command again to go on (what was finished is kept)"  # Ctrl-C
