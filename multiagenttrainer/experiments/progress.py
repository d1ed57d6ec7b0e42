"""How a training run reports progress (`mat train` prints it, tests record it)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.history import ExperimentResult


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
