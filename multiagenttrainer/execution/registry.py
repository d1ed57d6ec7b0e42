"""The executor registry: `training.execution.type` -> executor class.

Executors are imported on first use, so a local run never pays for an SSH or Docker client library.
Each class is constructed as `Class(execution_cfg, machine_name)`; without a machine name (one
`training.execution` target, no `machines:`), the machine is named after the execution type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multiagenttrainer.config import ExecutionConfig
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.execution.base import Executor


def _local() -> Any:
    from multiagenttrainer.execution.local import LocalExecutor

    return LocalExecutor


def _ssh() -> Any:
    from multiagenttrainer.execution.ssh import SshExecutor

    return SshExecutor


def _docker() -> Any:
    from multiagenttrainer.execution.docker import DockerExecutor

    return DockerExecutor


EXECUTORS: dict[str, Callable[[], Any]] = {"local": _local, "ssh": _ssh, "docker": _docker}
EXTRAS = {"ssh": "ssh", "docker": "docker"}  # the pip extra that brings an executor's client library


def executor_class(execution_type: str) -> Any:
    """The executor class registered for an execution type."""
    try:
        load = EXECUTORS[execution_type]
    except KeyError:
        valid = ", ".join(EXECUTORS)
        raise ConfigError(
            f"training.execution.type: {execution_type!r} is not available; valid types: {valid}"
        ) from None
    try:
        return load()
    except ImportError as exc:
        extra = EXTRAS.get(execution_type, execution_type)
        raise ConfigError(
            f"training.execution.type: {execution_type!r} needs {exc.name}; "
            f"install it with pip install 'multiagenttrainer[{extra}]'"
        ) from exc


def make_executor(execution_cfg: ExecutionConfig, machine_name: str | None = None) -> Executor:
    """Build the executor for one execution target (named after its type unless a machine name is given)."""
    executor: Executor = executor_class(execution_cfg.type)(execution_cfg, machine_name or execution_cfg.type)
    return executor
