"""How an ingest reports progress; the CLI renders it, tests record it. (Training runs report through
`experiments/progress.py`.)"""

from __future__ import annotations

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
