"""`mat server start|stop|status`: a local Prefect server (SQLite, 127.0.0.1, UI on) that later `mat`
commands find and use."""

from __future__ import annotations

from typing import Annotated

import typer

from multiagenttrainer.cli.common import JsonOption, fail, out
from multiagenttrainer.errors import MatError

STATUS_TIMEOUT_S = 5.0  # a busy machine answers slowly; a healthy server answers within this

server_app = typer.Typer(help="Run a local Prefect server that later mat commands use.", no_args_is_help=True)


@server_app.command("start")
def server_start(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default 4200 or the next free one).")
    ] = None,
) -> None:
    """Start a local Prefect server (SQLite, UI on) in the background."""
    from multiagenttrainer.cli.prefect_server import start_server

    try:
        info = start_server(port=port)
    except MatError as exc:
        fail(exc)
    out.print(f"Prefect server running at {info.ui_url} (API {info.api_url}, pid {info.pid}).")
    out.print("Later mat commands use it automatically; stop it with `mat server stop`.")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server started by `mat server start`."""
    from multiagenttrainer.cli.prefect_server import stop_server

    try:
        stopped = stop_server()
    except MatError as exc:
        fail(exc)
    out.print("Prefect server stopped." if stopped else "No mat Prefect server was running.")


@server_app.command("status")
def server_status_command(as_json: JsonOption = False) -> None:
    """Show whether the local Prefect server is running."""
    from multiagenttrainer.cli.prefect_server import server_status

    info = server_status(timeout_s=STATUS_TIMEOUT_S)
    if as_json:
        out.print_json(data=info.to_dict() if info else {"running": False})
        return
    if info is None:
        out.print("No mat Prefect server is running; start one with `mat server start`.")
        raise typer.Exit(1)
    health = "healthy" if info.healthy else "not answering"
    out.print(f"Prefect server {health} at {info.ui_url} (pid {info.pid}, up {info.uptime_s:.0f} s).")
    if not info.healthy:
        raise typer.Exit(1)
