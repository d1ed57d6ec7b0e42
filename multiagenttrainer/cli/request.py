"""`mat request run|status|stop`: from a stated need (YAML or free text) to a served, measured model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from multiagenttrainer.cli.common import (
    ConfigOption,
    JsonOption,
    RepoOption,
    err,
    fail,
    out,
    prepare_prefect,
    warn,
)
from multiagenttrainer.config import load_config
from multiagenttrainer.errors import MatError, RequestRefused

request_app = typer.Typer(
    help="Ask for a model: plan, fetch data, train, serve and measure it against your requirements.",
    no_args_is_help=True,
)

OutputDirOption = Annotated[
    Path | None,
    typer.Option(
        "--output-dir", "-o", help="Where requests/ is (default: request.output_dir).", show_default=False
    ),
]


def say(line: str) -> None:
    out.print(line, markup=False, highlight=False)


@request_app.command("run")
def request_run(
    request_file: Annotated[
        Path | None, typer.Argument(help="The request (YAML): task, data, requirements, allowed_licenses.")
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="The request in words; needs request.planner_command.")
    ] = None,
    config: ConfigOption = None,
    repo: RepoOption = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Request name (default: the file's).")
    ] = None,
    output_dir: OutputDirOption = None,
    serve_after: Annotated[
        bool,
        typer.Option("--serve-after/--no-serve-after", help="Leave the model served when the request ends."),
    ] = True,
) -> None:
    """Plan, fetch, train and serve the model a request describes; exit 3 when it is refused."""
    from multiagenttrainer.request.schema import load_request
    from multiagenttrainer.request.stage import check_inputs, request_label
    from multiagenttrainer.request.store import new_request_id

    try:
        cfg = load_config(config)
        spec = load_request(request_file) if request_file is not None else None
        check_inputs(cfg, spec, text)
    except MatError as exc:
        fail(exc)
    request_id = new_request_id(request_label(spec, name, request_file))
    say(f"request {request_id}")
    prepare_prefect()
    from flows.request import run_request_flow

    try:
        summary = run_request_flow(
            cfg,
            config_path=config,
            request_file=request_file,
            text=text,
            name=name,
            repos=tuple(repo or ()),
            output_dir=output_dir,
            serve_after=serve_after,
            request_id=request_id,
        )
    except RequestRefused as exc:
        refused(exc, cfg, output_dir)
    except KeyboardInterrupt:
        err.print(f"interrupted; request {request_id} stopped")
        raise typer.Exit(130) from None
    except MatError as exc:
        fail(exc)
    finished(summary, serve_after)


def refused(exc: RequestRefused, cfg: Any, output_dir: Path | None) -> None:
    """The refusal, one reason per line, and where plan.md says more; exit 3."""
    from multiagenttrainer.request.store import requests_root

    for reason in exc.reasons:
        warn(reason, "refused", "red")
    plan = requests_root(cfg, output_dir) / exc.request_id / "plan.md"
    err.print(f"plan: {plan}", markup=False)
    raise typer.Exit(exc.exit_code)


def finished(summary: dict[str, Any], serve_after: bool) -> None:
    """Each requirement met or not, the outputs, and the endpoint; exit 1 when a requirement is not met."""
    for verdict in summary["verdicts"]:
        mark = "met" if verdict["met"] else "NOT met"
        say(f"{verdict['requirement']}: {mark} ({verdict['figure']}; required {verdict['target']})")
    folder = Path(summary["dir"])
    say(f"report: {folder / 'report.md'}")
    say(f"model card: {folder / 'MODEL_CARD.md'}")
    speed = summary["speed"]
    if serve_after:
        stop = f"mat request stop {summary['request_id']}"
        say(f"serving {speed['url']} (model {speed['model']}); stop it with `{stop}`")
    met = summary["outcome"] == "met"
    say(f"request {summary['request_id']}: {'met' if met else 'not met'}")
    raise typer.Exit(0 if met else 1)


@request_app.command("status")
def request_status(
    request_id: Annotated[str | None, typer.Argument(help="One request (default: all of them).")] = None,
    config: ConfigOption = None,
    output_dir: OutputDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """The requests under <output_dir>/requests: stage, outcome, and the endpoint while one is served."""
    from multiagenttrainer.request.store import request_dir, requests_root, status_rows

    try:
        root = requests_root(load_config(config), output_dir)
        if request_id is not None:
            request_dir(root, request_id)
        rows, warnings = status_rows(root)
    except MatError as exc:
        fail(exc)
    for warning in warnings:
        warn(warning)
    rows = [row for row in rows if request_id is None or row["id"] == request_id]
    if as_json:
        out.print_json(data=rows[0] if request_id is not None else rows)
    elif not rows:
        out.print("No requests yet; start one with `mat request run REQUEST.yaml`.")
    else:
        render_rows(rows)


def render_rows(rows: list[dict[str, Any]]) -> None:
    table = Table("id", "task", "stage", "outcome", "endpoint", box=None, header_style="bold")
    for row in rows:
        table.add_row(row["id"], row["task"], row["stage"], row["outcome"], row["endpoint"] or "-")
    out.print(table)
    for row in rows:
        for reason in row["reasons"] or ([row["error"]] if row["error"] else []):
            say(f"{row['id']}: {reason}")


@request_app.command("stop")
def request_stop(
    request_id: Annotated[str, typer.Argument(help="The request whose model server to stop.")],
    config: ConfigOption = None,
    output_dir: OutputDirOption = None,
) -> None:
    """Stop the model server a request left running."""
    from multiagenttrainer.request.serving import stop_server
    from multiagenttrainer.request.store import request_dir, requests_root

    try:
        folder = request_dir(requests_root(load_config(config), output_dir), request_id)
    except MatError as exc:
        fail(exc)
    if stop_server(folder):
        say(f"request {request_id}: server stopped")
    else:
        say(f"request {request_id}: no server was running")
