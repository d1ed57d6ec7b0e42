"""How an ingest reports progress; the CLI renders it, tests record it. (Training runs report through
`experiments/progress.py`.)

Every progress line is also logged to the `multiagenttrainer.progress` logger (`LoggedIngestProgress`
here, `training.LoggedTrainProgress` for runs), so a flow run that a worker runs carries the same lines
in its logs as the terminal of an in-process `mat` command.
"""

from __future__ import annotations

import logging
from typing import Protocol


class IngestProgress(Protocol):
    """Receives ingest events; implement every method, doing nothing where an event is not needed."""

    def source_started(self, source: str) -> None:
        """Fetching `source` began."""

    def source_finished(self, source: str, error: str | None, cached: bool) -> None:
        """Fetching `source` ended; `error` is the user-facing message when it failed."""

    def corpus_started(self, total_files: int | None) -> None:
        """Corpus building began; `total_files` is known for some sources only."""

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        """`files` more files (of `nbytes` bytes) were read since the last call."""

    def corpus_finished(self, reused: bool) -> None:
        """Corpus building ended; `reused` when an identical earlier corpus was kept."""


class NullProgress:
    """Ignores every event."""

    def source_started(self, source: str) -> None:
        pass

    def source_finished(self, source: str, error: str | None, cached: bool) -> None:
        pass

    def corpus_started(self, total_files: int | None) -> None:
        pass

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        pass

    def corpus_finished(self, reused: bool) -> None:
        pass


# --------------------------------------------------------------------------- progress as log lines

PROGRESS_LOGGER = "multiagenttrainer.progress"
"""The logger of the lines `mat ingest` and `mat train` print. In a Prefect flow run these records reach
the flow run's logs, where `mat ingest|train --deployment` reads them back and prints them."""

progress_log = logging.getLogger(PROGRESS_LOGGER)


def source_outcome(error: str | None, cached: bool) -> str:
    """fetched, unchanged or failed."""
    return "failed" if error else ("unchanged" if cached else "fetched")


def source_line(source: str, error: str | None, cached: bool) -> str:
    """`notes: fetched` (or unchanged, failed) for a source that finished."""
    return f"{source}: {source_outcome(error, cached)}"


def corpus_finished_line(reused: bool) -> str:
    """What happened to the corpus once it was built."""
    return "corpus unchanged, kept the existing one" if reused else "corpus written"


CORPUS_STARTED_LINE = "building corpus"


class LoggedIngestProgress:
    """Logs each ingest event as the line `mat ingest` prints for it, and passes every event on."""

    def __init__(self, inner: IngestProgress) -> None:
        self.inner = inner

    def source_started(self, source: str) -> None:
        self.inner.source_started(source)

    def source_finished(self, source: str, error: str | None, cached: bool) -> None:
        progress_log.info("%s", source_line(source, error, cached))
        self.inner.source_finished(source, error, cached)

    def corpus_started(self, total_files: int | None) -> None:
        progress_log.info("%s", CORPUS_STARTED_LINE)
        self.inner.corpus_started(total_files)

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        self.inner.corpus_advanced(files, nbytes)

    def corpus_finished(self, reused: bool) -> None:
        progress_log.info("%s", corpus_finished_line(reused))
        self.inner.corpus_finished(reused)
