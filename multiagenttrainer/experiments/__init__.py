"""Training experiments: the loop, results.tsv, the keep/discard rule and the Runner API.

The names below are imported on first use, so reading run.json (`mat status`) does not load the loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiagenttrainer.experiments.runner import Runner
    from multiagenttrainer.history import ExperimentResult
    from multiagenttrainer.workspace.setup import Workspace

_PUBLIC = {
    "Runner": "multiagenttrainer.experiments.runner",
    "ExperimentResult": "multiagenttrainer.history",
    "Workspace": "multiagenttrainer.workspace.setup",
}

__all__ = ["ExperimentResult", "Runner", "Workspace"]


def __getattr__(name: str) -> Any:
    """Import a public name from its module the first time it is asked for."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'multiagenttrainer.experiments' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
