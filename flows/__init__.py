"""Prefect flows: compositions of the tasks in `tasks/`.

mat's progress lines (`multiagenttrainer.progress`, INFO) are switched on here, so with
PREFECT_LOGGING_EXTRA_LOGGERS=multiagenttrainer (set by mat, its workers and the deployments) they reach
every flow run's logs, where the UI and `mat ingest|train --deployment` read them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from multiagenttrainer.config import Config, load_config
from multiagenttrainer.progress import PROGRESS_LOGGER

logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)


def loaded_config(config: Config | str | Path | None) -> tuple[Config, str | None]:
    """The config object and the file it came from: commands pass what they loaded, scripts may pass
    a path (or nothing, for ./multiagenttrainer.yaml)."""
    if isinstance(config, Config):
        return config, None
    return load_config(config), str(config) if config is not None else None


class _DropPrefectRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        mat_warning = name.startswith("multiagenttrainer") and record.levelno == logging.WARNING
        return not (name.startswith("prefect") or name.startswith(PROGRESS_LOGGER) or mat_warning)


class _WarningLines(logging.Handler):
    """mat's warnings (an ingest waiting for another one, sources left out) as the CLI's own lines."""

    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:
            self.show(record.getMessage())


def quiet_console_logging(show_warning: Callable[[str], None] | None = None) -> None:
    """Keep Prefect's run logs and mat's progress records off the terminal (they still reach the API
    and the UI); mat's warnings go to `show_warning` instead of Prefect's console format.

    The CLI renders progress and failures itself; Prefect's own console lines (task states,
    flow tracebacks for failures the CLI already explains) would only repeat them.
    """
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropPrefectRecords) for f in handler.filters):
            handler.addFilter(_DropPrefectRecords())
    library = logging.getLogger("multiagenttrainer")
    if show_warning is not None and not any(isinstance(h, _WarningLines) for h in library.handlers):
        library.addHandler(_WarningLines(show_warning))
