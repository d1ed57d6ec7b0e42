"""Retry policies: how often each kind of remote call is tried again, stated once.

A remote call has exactly one policy, applied by whoever drives the call: the plain library path
calls `policy.call(fn)`, and a Prefect task is given the same numbers (`retries`, delays and
`retry_condition_fn`, see tasks/ingest.py). Client libraries with retries of their own (PyGithub,
boto3) are configured not to retry the same failures again, so attempts never multiply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from multiagenttrainer.errors import TransientSourceError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Try again after each of `delays_s` when the failure is one of `retry_on`."""

    delays_s: tuple[float, ...]
    retry_on: tuple[type[BaseException], ...]

    @property
    def retries(self) -> int:
        """How many attempts follow the first one."""
        return len(self.delays_s)

    def should_retry(self, error: object) -> bool:
        """Whether a failure may pass on its own."""
        return isinstance(error, self.retry_on)

    def call(self, fn: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> T:
        """`fn()`, tried again after each delay while it fails with a retryable error."""
        for delay_s in self.delays_s:
            try:
                return fn()
            except self.retry_on as exc:
                log.warning("%s; trying again in %.0f s", exc, delay_s)
                sleep(delay_s)
        return fn()


# Fetching or resolving a source (clone, fetch, API listing): network errors, 5xx and rate limits.
SOURCE_RETRY = RetryPolicy(delays_s=(1.0, 5.0), retry_on=(TransientSourceError,))
