"""What every `mat` command shares: the consoles, the common options, error exits, config loading,
and importing a flow module after pointing Prefect at a running `mat server`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

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
    lines = error.problems if isinstance(error, ConfigError) else [str(error)]
    for line in lines:
        err.print(f"[red]error:[/red] {line}", markup=True, highlight=False)
    raise typer.Exit(error.exit_code)


def load_with_repos(config: Path | None, repos: list[str] | None) -> Config:
    """The config file plus any `--repo` arguments as extra sources."""
    from multiagenttrainer.sources.registry import repo_argument_to_source

    cfg = load_config(config)
    extra = [repo_argument_to_source(r, cfg.github) for r in repos or []]
    if extra:
        cfg = cfg.model_copy(update={"sources": [*cfg.sources, *extra]})
    return cfg


def import_flows(name: str) -> Any:
    """Import a flow module after pointing Prefect at a running mat server (or ephemeral mode)."""
    import importlib

    from multiagenttrainer.server import configure_prefect_environment

    configure_prefect_environment()
    module = importlib.import_module(f"flows.{name}")
    if not verbose_logging():
        importlib.import_module("flows").quiet_console_logging()
    return module


def verbose_logging() -> bool:
    """Whether Prefect's own log lines should reach the terminal (PREFECT_LOGGING_LEVEL=DEBUG or INFO set)."""
    import os

    return os.environ.get("PREFECT_LOGGING_LEVEL", "").upper() in {"DEBUG", "INFO"}
