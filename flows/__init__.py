"""Prefect flows: compositions of the tasks in `tasks/`."""

from __future__ import annotations

import logging


class _DropPrefectRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("prefect")


def quiet_console_logging() -> None:
    """Keep Prefect's run logs off the terminal (they still reach the API and the UI).

    The CLI renders progress and failures itself; Prefect's own console lines (task states,
    flow tracebacks for failures the CLI already explains) would only repeat them.
    """
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropPrefectRecords) for f in handler.filters):
            handler.addFilter(_DropPrefectRecords())
