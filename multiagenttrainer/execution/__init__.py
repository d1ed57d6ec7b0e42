"""Execution targets: where training runs (local in this release), behind one Protocol."""

from multiagenttrainer.execution.base import Executor, RunOutcome
from multiagenttrainer.execution.registry import EXECUTORS, make_executor

__all__ = ["EXECUTORS", "Executor", "RunOutcome", "make_executor"]
