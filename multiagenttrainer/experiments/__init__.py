"""Training experiments: the loop, results.tsv, the keep/discard rule and the Runner API.

Runner and Workspace are imported on first use: the agents package imports this package's model
module, and an eager import of the runner from here would make that a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multiagenttrainer.experiments.model import ExperimentResult

if TYPE_CHECKING:
    from multiagenttrainer.experiments.runner import Runner
    from multiagenttrainer.workspace.setup import Workspace

__all__ = ["ExperimentResult", "Runner", "Workspace"]


def __getattr__(name: str) -> Any:
    if name == "Runner":
        from multiagenttrainer.experiments.runner import Runner

        return Runner
    if name == "Workspace":
        from multiagenttrainer.workspace.setup import Workspace

        return Workspace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
