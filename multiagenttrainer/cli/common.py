"""What every `mat` command shares: the consoles, the common options, error exits, config loading,
what log records reach the terminal, and preparing Prefect before a flow module is imported."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import ConfigError, MatError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Config file (default: ./multiagenttrainer.yaml).", show_default=False
    ),
]
RepoOption = Annotated[
    list[str] | None,
    typer.Option(
        "--repo", "-r", help="Extra repository, owner/repo or a git URL; repeatable.", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def fail(error: MatError) -> NoReturn:
    """Print a MatError as red lines (no traceback) and exit with its code."""
    print_error(error)
    raise typer.Exit(error.exit_code)


def print_error(error: MatError) -> None:
    """A MatError as red `error:` lines on stderr."""
    lines = error.problems if isinstance(error, ConfigError) else [str(error)]
    for line in lines:
        warn(line, "error", "red")


def warn(line: str, label: str = "warning", style: str = "yellow") -> None:
    """`label: line` on stderr; the line is shown as written (it may quote a config, a server, a file)."""
    err.print(f"[{style}]{label}:[/{style}] {escape(line)}", markup=True, highlight=False)


class _MatLines(logging.Handler):
    """mat's own log records (`multiagenttrainer.*`, WARNING and up) as the CLI's own `warning:` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        label, style = ("error", "red") if record.levelno >= logging.ERROR else ("warning", "yellow")
        try:
            warn(record.getMessage(), label, style)
        except Exception:  # a record that cannot be formatted must not break the command
            self.handleError(record)


class _NoForeignRecords(logging.Filter):
    """Drops records of other libraries (urllib3, PyGithub, botocore, ...) from a terminal handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith("prefect")  # Prefect's own are left to quiet_console_logging


def configure_console_logging() -> None:
    """What log records reach the terminal: mat's own as `warning:`/`error:` lines; other libraries' none.

    mat turns third-party failures into its own errors at each adapter, so their log lines (urllib3's
    retries, PyGithub's, botocore's) would only be noise before mat's own message. Records still reach
    Prefect's run logs where it collects them. PREFECT_LOGGING_LEVEL=DEBUG or INFO leaves everything on.
    """
    if verbose_logging():
        return
    mat_logger = logging.getLogger("multiagenttrainer")
    if not any(isinstance(handler, _MatLines) for handler in mat_logger.handlers):
        mat_logger.addHandler(_MatLines(logging.WARNING))
    mat_logger.propagate = False
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())  # else Python's last-resort handler prints their warnings
    for handler in root.handlers:
        if not any(isinstance(f, _NoForeignRecords) for f in handler.filters):
            handler.addFilter(_NoForeignRecords())


def load_with_repos(config: Path | None, repos: list[str] | None) -> Config:
    """The config file plus any `--repo` arguments as extra sources."""
    from multiagenttrainer.sources.registry import repo_argument_to_source

    cfg = load_config(config)
    extra = [repo_argument_to_source(r, cfg.github) for r in repos or []]
    if extra:
        cfg = cfg.model_copy(update={"sources": [*cfg.sources, *extra]})
    return cfg


def prepare_prefect() -> None:
    """Point Prefect at a server (starting mat's local one on first use) before a flow module is
    imported, and keep Prefect's own console lines off the terminal unless asked for."""
    from multiagenttrainer.cli.prefect_server import ensure_prefect_server

    try:
        ensure_prefect_server(announce=lambda text: err.print(text, markup=False))
    except MatError as exc:
        fail(exc)
    import prefect.main  # noqa: F401  # sets up Prefect's logging, which quiet_console_logging then filters

    if not verbose_logging():
        from flows import quiet_console_logging

        quiet_console_logging()
    configure_console_logging()  # again: Prefect's logging set-up replaced the root handlers


def require_server(why: str, then: str) -> str:
    """The API URL of the running Prefect server (mat's, or PREFECT_API_URL), with Prefect pointed at it;
    without one, exit naming `mat server start`. `why`: what a throw-away server would lose."""
    from multiagenttrainer.cli.prefect_server import configure_prefect_environment
    from multiagenttrainer.errors import ServerError

    url = configure_prefect_environment()
    if url is None:
        fail(
            ServerError(
                f"no Prefect server is running, and {why}: start one with `mat server start` "
                f"(or set PREFECT_API_URL), then {then}"
            )
        )
    return url


def verbose_logging() -> bool:
    """Whether Prefect's own log lines should reach the terminal (PREFECT_LOGGING_LEVEL=DEBUG or INFO set)."""
    import os

    return os.environ.get("PREFECT_LOGGING_LEVEL", "").upper() in {"DEBUG", "INFO"}


def absolute(path: Path | None) -> str | None:
    """A path option as an absolute path: the flow run works in another directory."""
    return str(path.expanduser().resolve()) if path is not None else None


def config_parameter(config: Path | None) -> str | None:
    """The config file the flow run loads: --config, else ./multiagenttrainer.yaml if there is one."""
    from multiagenttrainer.config import DEFAULT_CONFIG_FILE

    if config is not None:
        return absolute(config)
    default = Path(DEFAULT_CONFIG_FILE)
    return absolute(default) if default.is_file() else None
