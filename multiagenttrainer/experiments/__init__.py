"""Training experiments: the loop, results.tsv, the keep/discard rule and the Runner API."""

from __future__ import annotations

from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.workspace.setup import Workspace

__all__ = ["ExperimentResult", "Runner", "Workspace"]
