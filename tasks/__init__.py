"""Prefect tasks: thin wrappers over `multiagenttrainer` calls, adding cache policies and retries.

`ProgressSlot` carries a progress receiver from the command that started a flow into the flow's steps
(a context variable, copied into the stage's worker threads), so progress never enters task inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Generic, TypeVar

P = TypeVar("P")


class ProgressSlot(Generic[P]):
    """The progress receiver of the run in this context, or a default that ignores everything."""

    def __init__(self, name: str, default: Callable[[], P]) -> None:
        self._var: ContextVar[P | None] = ContextVar(name, default=None)
        self._default = default

    def current(self) -> P:
        value = self._var.get()
        return value if value is not None else self._default()

    @contextmanager
    def reporting(self, progress: P | None) -> Iterator[None]:
        """Send the progress events raised in this context (and threads it starts) to `progress`."""
        token = self._var.set(progress)
        try:
            yield
        finally:
            self._var.reset(token)
