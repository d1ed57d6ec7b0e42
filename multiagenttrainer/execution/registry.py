"""The executor registry: `training.execution.type` -> executor class.

Executors are imported on first use, so a local run never pays for an SSH or Docker client library.
Each class is constructed as `Class(execution_cfg, machine_name)`.
"""

from __future__ import annotations

import importlib

from multiagenttrainer.config import ExecutionConfig
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.execution.base import Executor

EXECUTORS: dict[str, str] = {
    "local": "multiagenttrainer.execution.local:LocalExecutor",
}


def executor_class(execution_type: str) -> type:
    """The executor class registered for an execution type."""
    try:
        module_name, class_name = EXECUTORS[execution_type].split(":")
    except KeyError:
        valid = ", ".join(EXECUTORS)
        raise ConfigError(
            f"training.execution.type: {execution_type!r} is not available; valid types: {valid}"
        ) from None
    cls: type = getattr(importlib.import_module(module_name), class_name)
    return cls


def make_executor(execution_cfg: ExecutionConfig, machine_name: str = "local") -> Executor:
    """Build the executor for one execution target."""
    executor: Executor = executor_class(execution_cfg.type)(execution_cfg, machine_name)
    return executor
