"""The executor registry: `training.execution.type` -> executor class.

Executors are imported on first use, so a local run never pays for an SSH or Docker client library.
Each class is constructed as `Class(execution_cfg, machine_name)`; without a machine name (one
`training.execution` target, no `machines:`), the machine is named after the execution type.
"""

from __future__ import annotations

import importlib

from multiagenttrainer.config import ExecutionConfig
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.execution.base import Executor

EXECUTORS: dict[str, str] = {
    "local": "multiagenttrainer.execution.local:LocalExecutor",
    "ssh": "multiagenttrainer.execution.ssh:SshExecutor",
    "docker": "multiagenttrainer.execution.docker:DockerExecutor",
}
EXTRAS = {"ssh": "ssh", "docker": "docker"}  # the pip extra that brings an executor's client library


def executor_class(execution_type: str) -> type:
    """The executor class registered for an execution type."""
    try:
        module_name, class_name = EXECUTORS[execution_type].split(":")
    except KeyError:
        valid = ", ".join(EXECUTORS)
        raise ConfigError(
            f"training.execution.type: {execution_type!r} is not available; valid types: {valid}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(execution_type, execution_type)
        raise ConfigError(
            f"training.execution.type: {execution_type!r} needs {exc.name}; "
            f"install it with pip install 'multiagenttrainer[{extra}]'"
        ) from exc
    cls: type = getattr(module, class_name)
    return cls


def make_executor(execution_cfg: ExecutionConfig, machine_name: str | None = None) -> Executor:
    """Build the executor for one execution target (named after its type unless a machine name is given)."""
    cls = executor_class(execution_cfg.type)
    executor: Executor = cls(execution_cfg, machine_name or execution_cfg.type)
    return executor
