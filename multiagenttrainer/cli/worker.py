"""`mat worker start|stop|status`: Prefect workers for mat's work pools (prefect_workers.py), started in
the background against the running server."""

from __future__ import annotations

import typer
from rich.table import Table

from multiagenttrainer.cli.common import ConfigOption, JsonOption, fail, out, require_server
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import MatError

worker_app = typer.Typer(
    help="Prefect workers for mat's work pools (mat-local and one per machine).", no_args_is_help=True
)


def pool_names(cfg: Config) -> list[str]:
    """The pools `mat deploy` creates for this config: mat-local and mat-<machine> per machine."""
    from deployments.pools import pools_for

    return [pool.name for pool in pools_for(cfg)]


@worker_app.command("start")
def worker_start(config: ConfigOption = None) -> None:
    """Start one worker per work pool (mat-local and mat-<machine> per configured machine)."""
    from multiagenttrainer.cli.prefect_workers import start_workers

    try:
        pools = pool_names(load_config(config))
    except MatError as exc:
        fail(exc)
    api_url = require_server("a worker of a throw-away server gets no runs", "run `mat worker start` again")
    try:
        started = start_workers(pools, api_url)
    except MatError as exc:
        fail(exc)
    for info, new in started:
        state = "started" if new else "already running"
        out.print(f"worker for {info.pool} {state} (pid {info.pid}), log {info.log_file}", markup=False)
    out.print("Stop them with `mat worker stop`.", markup=False)


@worker_app.command("stop")
def worker_stop() -> None:
    """Stop the workers `mat worker start` started (SIGTERM; killed only if they hang)."""
    from multiagenttrainer.cli.prefect_workers import stop_workers

    try:
        stopped = stop_workers()
    except MatError as exc:
        fail(exc)
    if not stopped:
        out.print("No mat worker was running.")
    for info, how in stopped:
        out.print(f"worker for {info.pool} (pid {info.pid}) {how}", markup=False)


@worker_app.command("status")
def worker_status(as_json: JsonOption = False) -> None:
    """The workers `mat worker start` started: pool, pid, running or not, log file."""
    from multiagenttrainer.cli.prefect_workers import read_workers

    workers = read_workers()
    if as_json:
        out.print_json(data=[info.to_dict() for info in workers.values()])
        return
    if not workers:
        out.print("No mat worker is recorded; start them with `mat worker start`.")
        raise typer.Exit(1)
    table = Table("pool", "pid", "state", "started", "log", box=None, header_style="bold")
    for info in workers.values():
        state = "running" if info.alive else "gone"
        table.add_row(info.pool, str(info.pid), state, info.started_at, info.log_file)
    out.print(table)
    if not all(info.alive for info in workers.values()):
        raise typer.Exit(1)
