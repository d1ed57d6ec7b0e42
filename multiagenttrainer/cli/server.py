"""`mat server start|stop|status`: a local Prefect server (SQLite, 127.0.0.1, UI on) that later `mat`
commands find and use."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from multiagenttrainer.cli.common import JsonOption, fail, out, warn
from multiagenttrainer.errors import MatError

STATUS_TIMEOUT_S = 5.0  # a busy machine answers slowly; a healthy server answers within this

server_app = typer.Typer(help="Run a local Prefect server that later mat commands use.", no_args_is_help=True)


@server_app.command("start")
def server_start(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default 4200 or the next free one).")
    ] = None,
) -> None:
    """Start a local Prefect server (SQLite, UI on) in the background, and make the Prefect profile `mat`
    (this server, mat's result storage) the active one, so the plain `prefect` command uses it too."""
    from multiagenttrainer.cli.prefect_profile import PROFILE, switch_back_command, write_mat_profile
    from multiagenttrainer.cli.prefect_server import start_server

    try:
        info = start_server(port=port)
        written = write_mat_profile(info.api_url)
    except MatError as exc:
        fail(exc)
    state = "was already running" if info.already_running else "running"
    out.print(f"Prefect server {state} at {info.ui_url} (API {info.api_url}, pid {info.pid}).", markup=False)
    out.print(
        f"Prefect profile `{PROFILE}` is active in {written.path}: the `prefect` command uses this server "
        "and mat's result storage. Later mat commands use it too; stop it with `mat server stop`.",
        markup=False,
    )
    own = os.environ.get("PREFECT_API_URL")
    if own and own.rstrip("/") != info.api_url:
        warn(f"PREFECT_API_URL={own} is set here and wins over the profile: unset it to use this server")
    out.print("Next:", markup=False)
    back = (switch_back_command(written.previous), "switch the `prefect` command back")
    for command, what in (*NEXT_STEPS, back):
        out.print(f"  {command:<46} # {what}", markup=False)


NEXT_STEPS = (
    ("mat deploy", "work pools and deployments (prefect.yaml)"),
    ("mat worker start", "a worker per work pool (or: prefect worker start --pool mat-local)"),
    ("prefect deployment run ingest/ingest --watch", "a run, picked up by a worker"),
    ("prefect deployment run train/train", "or: mat train --deployment"),
)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server started by `mat server start` (the Prefect profile `mat` stays)."""
    from multiagenttrainer.cli.prefect_profile import (
        PROFILE,
        mat_profile_exists,
        remembered_previous_profile,
        switch_back_command,
    )
    from multiagenttrainer.cli.prefect_server import stop_server

    try:
        stopped = stop_server()
    except MatError as exc:
        fail(exc)
    out.print("Prefect server stopped." if stopped else "No mat Prefect server was running.")
    if mat_profile_exists():
        previous = switch_back_command(remembered_previous_profile(None))
        out.print(
            f"The Prefect profile `{PROFILE}` stays, pointing the `prefect` command at this server: "
            f"`mat server start` brings the server back; `{previous}` switches the `prefect` command back.",
            markup=False,
        )


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
