"""How long-running library calls report progress; the CLI renders it, tests record it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from multiagenttrainer.experiments.model import ExperimentResult
    from multiagenttrainer.experiments.run_state import RunState


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


class TrainProgress(Protocol):
    """Receives the events of a training run (`mat train`); implement every method."""

    def corpus_ready(self, corpus_dir: str, status: str) -> None:
        """The corpus to train on is in `corpus_dir`; `status` says how (built, reused, cached, existing)."""

    def run_started(self, run_dir: Path, state: RunState) -> None:
        """The run exists (new or resumed) and its experiments are about to start."""

    def experiment_finished(self, result: ExperimentResult, state: RunState) -> None:
        """An experiment was recorded; `state` already holds it."""


class NullTrainProgress:
    """Ignores every training event."""

    def corpus_ready(self, corpus_dir: str, status: str) -> None:
        pass

    def run_started(self, run_dir: Path, state: RunState) -> None:
        pass

    def experiment_finished(self, result: ExperimentResult, state: RunState) -> None:
        pass
