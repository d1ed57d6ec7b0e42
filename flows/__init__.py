"""Prefect flows: compositions of the tasks in `tasks/`.

mat's progress lines (`multiagenttrainer.progress`, INFO) are switched on here, so with
PREFECT_LOGGING_EXTRA_LOGGERS=multiagenttrainer (set by mat, its workers and the deployments) they reach
every flow run's logs, where the UI and `mat ingest|train --deployment` read them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import prefect

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
    """Drops records of Prefect's loggers, and of loggers Prefect's own code names otherwise
    (its background services log as `EventsWorker`, `APILogWorker`, ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("prefect") or record.pathname.startswith(_PREFECT_DIR))


_PREFECT_DIR = str(Path(prefect.__file__).parent) + os.sep


def quiet_console_logging() -> None:
    """Keep Prefect's run logs off the terminal (they still reach the API and the UI); mat's own records
    are the CLI's lines (multiagenttrainer/cli/common.configure_console_logging).

    The CLI renders progress and failures itself; Prefect's own console lines (task states,
    flow tracebacks for failures the CLI already explains) would only repeat them.
    """
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropPrefectRecords) for f in handler.filters):
            handler.addFilter(_DropPrefectRecords())
