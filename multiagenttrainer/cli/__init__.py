"""The `mat` command: parse arguments, load the config, call a flow or the library, render the result.

The core commands live here; `mat server ...` in server.py, `mat finetune ...` in finetune.py, `mat serve`
in serve.py, `mat request ...` in request.py, and what they all share in common.py.

Prefect is imported only by the commands that run flows, after `configure_prefect_environment()`
has pointed it at a running `mat server` (if any), so read-only commands stay fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from multiagenttrainer import __version__
from multiagenttrainer.cli.common import (
    ConfigOption,
    JsonOption,
    RepoOption,
    err,
    fail,
    load_with_repos,
    out,
    prepare_prefect,
    warn,
)
from multiagenttrainer.cli.finetune import finetune_app
from multiagenttrainer.cli.request import request_app
from multiagenttrainer.cli.serve import serve_command
from multiagenttrainer.cli.server import server_app
from multiagenttrainer.config import load_config
from multiagenttrainer.errors import MatError

app = typer.Typer(
    name="mat",
    help="MultiAgentTrainer: build a corpus from your code, run training experiments, fine-tune models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Check configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(server_app, name="server")
app.add_typer(finetune_app, name="finetune")
app.add_typer(request_app, name="request")
app.command("serve")(serve_command)


def version_callback(value: bool) -> None:
    if value:
        out.print(f"mat {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """MultiAgentTrainer (mat)."""


# --------------------------------------------------------------------------- config


@config_app.command("validate")
def config_validate(
    path: Annotated[
        Path, typer.Argument(help="Config file to check; `-` reads it from standard input.")
    ] = Path("multiagenttrainer.yaml"),
) -> None:
    """Check a config file against the schema (hosts and paths are not contacted)."""
    from multiagenttrainer.config import load_config_stream

    try:
        cfg = load_config_stream(sys.stdin.buffer) if str(path) == "-" else load_config(path)
    except MatError as exc:
        fail(exc)
    counts = f"{len(cfg.sources)} sources, {len(cfg.machines)} machines, {len(cfg.finetuner.targets)} targets"
    out.print(f"{path}: valid ({counts})", markup=False)


# --------------------------------------------------------------------------- sources


@app.command()
def sources(config: ConfigOption = None, repo: RepoOption = None, as_json: JsonOption = False) -> None:
    """List the configured data sources."""
    from multiagenttrainer.sources import SourceContext, make_sources

    try:
        cfg = load_with_repos(config, repo)
        rows = [s.describe() for s in make_sources(cfg.sources, SourceContext(github=cfg.github))]
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=[vars(r) for r in rows])
        return
    if not rows:
        out.print("No sources configured: add a `sources:` list to the config or pass --repo owner/repo.")
        return
    table = Table("name", "type", "location", "branch", title=None, box=None, header_style="bold")
    for row in rows:
        table.add_row(row.name, row.type, row.location, row.branch or "(default)")
    out.print(table)


# --------------------------------------------------------------------------- ingest


@app.command()
def ingest(
    config: ConfigOption = None,
    repo: RepoOption = None,
    corpus_dir: Annotated[
        Path | None, typer.Option("--corpus-dir", help="Where to write the corpus (default: corpus.dir).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fetch every source and build the corpus (corpus.txt, corpus.jsonl, stats.json)."""
    from multiagenttrainer.errors import IngestIncomplete
    from multiagenttrainer.ingest import plan_ingest
    from multiagenttrainer.render import IngestReporter, render_ingest_summary

    try:
        cfg = load_with_repos(config, repo)  # fail fast on config errors, before Prefect starts
        plan_ingest(cfg, corpus_dir=corpus_dir)  # no sources: a config error
    except MatError as exc:
        fail(exc)
    prepare_prefect()
    from flows.ingest import run_ingest

    reporter = IngestReporter(err, enabled=not as_json and err.is_terminal)
    summary: dict[str, Any]
    code = 0
    try:
        with reporter:
            summary = run_ingest(cfg, corpus_dir=corpus_dir, progress=reporter)
    except IngestIncomplete as exc:
        summary, code = exc.summary, 1
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=summary["stats"])
    else:
        render_ingest_summary(out, summary)
    for failure in summary.get("failures", []):
        warn(
            f"{failure['source']}: {failure['error']}",
            "incomplete" if failure.get("partial") else "failed",
            "red",
        )
    raise typer.Exit(code)


# --------------------------------------------------------------------------- train


@app.command("train")
def train_command(
    config: ConfigOption = None,
    name: Annotated[
        str | None,
        typer.Option("--name", "-n", help="Run name (default: the config file's name)."),
    ] = None,
    max_experiments: Annotated[
        int | None,
        typer.Option(
            "--max-experiments", min=1, help="Experiments in the run (default: training.max_experiments)."
        ),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Runs directory (default: training.output_dir).")
    ] = None,
    repo: RepoOption = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue the run with this id (see `mat status`).")
    ] = None,
    corpus_dir: Annotated[
        Path | None,
        typer.Option("--corpus-dir", help="Where the corpus is written and read (default: corpus.dir)."),
    ] = None,
) -> None:
    """Ingest, set up a workspace and run training experiments; writes results.tsv and report.md."""
    from multiagenttrainer.render import TrainReporter

    try:
        cfg = load_with_repos(config, repo)  # fail fast on config errors, before Prefect starts
        if not resume:
            from multiagenttrainer.agents import make_agent

            make_agent(cfg.training)  # an agent command that cannot work is a config error
    except MatError as exc:
        fail(exc)
    prepare_prefect()
    from flows.train import run_train

    reporter = TrainReporter(out)
    try:
        summary = run_train(
            cfg,
            config_path=config,
            name=name,
            max_experiments=max_experiments,
            output_dir=output_dir,
            resume=resume,
            corpus_dir=corpus_dir,
            progress=reporter,
        )
    except KeyboardInterrupt:
        hint = f"; continue it with `mat train --resume {reporter.run_id}`" if reporter.run_id else ""
        err.print(f"interrupted{hint}")
        raise typer.Exit(130) from None
    except MatError as exc:
        if reporter.run_dir is not None:
            err.print(f"run directory: {reporter.run_dir}")
        fail(exc)
    for note in summary.get("notes", []):
        warn(note)
    out.print(f"run {summary['run_id']} {summary['status']}: {summary['run_dir']}")
    out.print(f"report: {summary['report']}")
    raise typer.Exit(0 if summary["status"] == "completed" else 1)


# --------------------------------------------------------------------------- status and watch

OutputDirOption = Annotated[
    Path | None,
    typer.Option(
        "--output-dir", "-o", help="Runs directory (default: training.output_dir).", show_default=False
    ),
]


def runs_dir(config: Path | None, output_dir: Path | None) -> Path:
    """The directory holding the runs: --output-dir, else training.output_dir of the config."""
    from multiagenttrainer.config import expand_path

    if output_dir is not None:
        return output_dir
    return expand_path(load_config(config).training.output_dir)


@app.command()
def status(
    config: ConfigOption = None, output_dir: OutputDirOption = None, as_json: JsonOption = False
) -> None:
    """One row per training run: progress, baseline and best val_bpb, start time, duration."""
    from multiagenttrainer.monitor import render_status_table, run_rows

    try:
        rows = run_rows(runs_dir(config, output_dir))
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=rows)
    elif not rows:
        out.print("No runs yet; start one with `mat train`.")
    else:
        render_status_table(out, rows)


@app.command()
def watch(
    config: ConfigOption = None,
    output_dir: OutputDirOption = None,
    once: Annotated[bool, typer.Option("--once", help="Print the current state once and exit.")] = False,
) -> None:
    """Live view of every run under the output directory; exits when all of them are done."""
    from multiagenttrainer.monitor import watch_runs

    try:
        watch_runs(out, runs_dir(config, output_dir), once=once)
    except MatError as exc:
        fail(exc)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


# --------------------------------------------------------------------------- deploy


@app.command()
def deploy(
    work_pool: Annotated[str, typer.Option(help="Process work pool to deploy to.")] = "mat-local",
) -> None:
    """Create the work pool and register the deployments in prefect.yaml with the running server."""
    from multiagenttrainer.cli.prefect_server import configure_prefect_environment
    from multiagenttrainer.errors import ServerError

    if configure_prefect_environment() is None:
        fail(
            ServerError(
                "no Prefect server is running, and deployments registered with a throw-away one would "
                "be lost: start one with `mat server start` (or set PREFECT_API_URL), then run "
                "`mat deploy` again"
            )
        )
    from deployments.register import register_deployments

    try:
        names = register_deployments(project_dir(), work_pool=work_pool)
    except MatError as exc:
        fail(exc)
    for name in names:
        out.print(f"deployed {name} on work pool {work_pool}")
    out.print(f"Start a worker with: prefect worker start --pool {work_pool}")


def project_dir() -> Path:
    """The directory holding prefect.yaml, flows/ and tasks/ (the repository root)."""
    return Path(__file__).resolve().parents[2]


def main() -> None:
    """Console-script entry point."""
    from multiagenttrainer.errors import disk_full_error, is_disk_full

    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        fail(disk_full_error(exc, Path.cwd(), 0, "run the command again"))
