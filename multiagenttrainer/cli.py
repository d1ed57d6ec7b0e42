"""The `mat` command: parse arguments, load the config, call a flow or the library, render the result.

Prefect is imported only by the commands that run flows, after `configure_prefect_environment()`
has pointed it at a running `mat server` (if any), so read-only commands stay fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from multiagenttrainer import __version__
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import ConfigError, MatError

app = typer.Typer(
    name="mat",
    help="MultiAgentTrainer: build a corpus from your code, run training experiments, fine-tune models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Check configuration files.", no_args_is_help=True)
server_app = typer.Typer(help="Run a local Prefect server that later mat commands use.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(server_app, name="server")
finetune_app = typer.Typer(
    help="Fine-tune models on the corpus (open-source LoRA or Amazon Bedrock).", no_args_is_help=True
)
app.add_typer(finetune_app, name="finetune")

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


def load_with_repos(config: Path | None, repos: list[str] | None) -> Config:
    """The config file plus any `--repo` arguments as extra sources."""
    from multiagenttrainer.sources.registry import repo_argument_to_source

    cfg = load_config(config)
    extra = [repo_argument_to_source(r, cfg.github) for r in repos or []]
    if extra:
        cfg = cfg.model_copy(update={"sources": [*cfg.sources, *extra]})
    return cfg


@config_app.command("validate")
def config_validate(
    path: Annotated[Path, typer.Argument(help="Config file to check.")] = Path("multiagenttrainer.yaml"),
) -> None:
    """Check a config file against the schema (hosts and paths are not contacted)."""
    try:
        cfg = load_config(path)
    except MatError as exc:
        fail(exc)
    counts = f"{len(cfg.sources)} sources, {len(cfg.machines)} machines, {len(cfg.finetuner.targets)} targets"
    out.print(f"{path}: valid ({counts})")


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
    from multiagenttrainer.render import IngestReporter, render_ingest_summary

    try:
        cfg = load_with_repos(config, repo)  # fail fast on config errors, before Prefect starts
        if not cfg.sources:
            raise ConfigError(
                "sources: nothing to ingest; add a `sources:` list to the config "
                "(see configs/config.example.yaml) "
                "or pass --repo owner/repo"
            )
    except MatError as exc:
        fail(exc)
    flows_ingest = import_flows("ingest")
    reporter = IngestReporter(err, enabled=not as_json and err.is_terminal)
    summary: dict[str, Any]
    code = 0
    try:
        with reporter:
            summary = flows_ingest.run_ingest(
                config_path=str(config) if config else None,
                repos=list(repo or []),
                corpus_dir=str(corpus_dir) if corpus_dir else None,
                progress=reporter,
            )
    except IngestIncomplete as exc:
        summary, code = exc.summary, 1
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=summary["stats"])
    else:
        render_ingest_summary(out, summary)
    for failure in summary.get("failures", []):
        err.print(f"[red]failed:[/red] {failure['source']}: {failure['error']}")
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
    flows_train = import_flows("train")
    reporter = TrainReporter(out)
    try:
        summary = flows_train.run_train(
            config_path=str(config) if config else None,
            name=name,
            max_experiments=max_experiments,
            output_dir=str(output_dir) if output_dir else None,
            repos=list(repo or []),
            resume=resume,
            corpus_dir=str(corpus_dir) if corpus_dir else None,
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
        err.print(f"[yellow]warning:[/yellow] {note}")
    out.print(f"run {summary['run_id']} {summary['status']}: {summary['run_dir']}")
    out.print(f"report: {summary['report']}")
    raise typer.Exit(0 if summary["status"] == "completed" else 1)


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


# --------------------------------------------------------------------------- server


@server_app.command("start")
def server_start(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default 4200 or the next free one).")
    ] = None,
) -> None:
    """Start a local Prefect server (SQLite, UI on) in the background."""
    from multiagenttrainer.server import start_server

    try:
        info = start_server(port=port)
    except MatError as exc:
        fail(exc)
    out.print(f"Prefect server running at {info.ui_url} (API {info.api_url}, pid {info.pid}).")
    out.print("Later mat commands use it automatically; stop it with `mat server stop`.")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server started by `mat server start`."""
    from multiagenttrainer.server import stop_server

    try:
        stopped = stop_server()
    except MatError as exc:
        fail(exc)
    out.print("Prefect server stopped." if stopped else "No mat Prefect server was running.")


@server_app.command("status")
def server_status_command(as_json: JsonOption = False) -> None:
    """Show whether the local Prefect server is running."""
    from multiagenttrainer.server import server_status

    info = server_status()
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


# --------------------------------------------------------------------------- finetune


@finetune_app.command("start")
def finetune_start(
    config: ConfigOption = None,
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", help="corpus.jsonl to train on (default: <corpus.dir>/corpus.jsonl)."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Job name (default: the config file's name).")
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="Run only this target of finetuner.targets.")
    ] = None,
) -> None:
    """Start every fine-tuning target at once; waits for local ones, prints Bedrock job ARNs."""
    from multiagenttrainer.errors import BackendError
    from multiagenttrainer.finetune.display import FinetuneProgress
    from multiagenttrainer.finetune.runner import check_targets, chosen_targets, corpus_or_error

    try:
        cfg = load_config(config)  # config, QLoRA and corpus problems stop here, before anything starts
        check_targets(chosen_targets(cfg, target))
        corpus_path = corpus_or_error(cfg, corpus)
    except MatError as exc:
        fail(exc)
    flows_finetune = import_flows("finetune")
    reporter = FinetuneProgress(err, enabled=err.is_terminal)
    try:
        with reporter:
            summary = flows_finetune.run_finetune(
                config_path=str(config) if config else None,
                corpus=str(corpus_path),
                name=name,
                target=target,
                on_progress=reporter,
            )
    except BackendError as exc:
        print_job_lines(reporter_records(cfg, reporter))
        fail(exc)
    except MatError as exc:
        fail(exc)
    from multiagenttrainer.finetune.base import JobRecord

    print_job_lines([JobRecord.from_dict(job) for job in summary["jobs"]])


def reporter_records(cfg: Config, reporter: Any) -> list[Any]:
    """The records of the jobs the progress display saw (to show what finished before a failure)."""
    from multiagenttrainer.finetune.runner import list_jobs

    seen = set(reporter.bars)
    return [record for record in list_jobs(cfg) if record.id in seen]


def print_job_lines(records: list[Any]) -> None:
    """One line per job: target, status, and the adapter folder or the Bedrock ARN."""
    for record in records:
        where = record.external_id or record.output_path or ""
        detail = f" ({record.error})" if record.error else ""
        out.print(f"{record.target}: job {record.id} {record.status} {where}{detail}".rstrip())


@finetune_app.command("list")
def finetune_list(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Every fine-tuning job recorded under finetuner.jobs_dir."""
    from multiagenttrainer.finetune.display import render_jobs_table
    from multiagenttrainer.finetune.runner import list_jobs

    try:
        records = list_jobs(load_config(config))
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=[r.to_dict() for r in records])
    elif not records:
        out.print("No fine-tuning jobs yet; start one with `mat finetune start`.")
    else:
        render_jobs_table(out, records)


@finetune_app.command("status")
def finetune_status(
    job_id: Annotated[str, typer.Argument(help="Job id (or Bedrock job ARN) from `mat finetune list`.")],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """One job's state; Bedrock jobs are refreshed from AWS."""
    from multiagenttrainer.finetune.display import render_job
    from multiagenttrainer.finetune.runner import status as job_status

    try:
        record = job_status(load_config(config), job_id)
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=record.to_dict())
    else:
        render_job(out, record)


@finetune_app.command("cancel")
def finetune_cancel(
    job_id: Annotated[str, typer.Argument(help="Job id (or Bedrock job ARN) from `mat finetune list`.")],
    config: ConfigOption = None,
) -> None:
    """Cancel a job: a local one stops at its next step (keeping a checkpoint), a Bedrock one is stopped."""
    from multiagenttrainer.finetune.runner import cancel as cancel_job

    try:
        record = cancel_job(load_config(config), job_id)
    except MatError as exc:
        fail(exc)
    state = "cancelled" if record.status == "cancelled" else f"{record.status}; stopping at its next step"
    out.print(f"job {record.id}: {state}")


# --------------------------------------------------------------------------- deploy


@app.command()
def deploy(
    work_pool: Annotated[str, typer.Option(help="Process work pool to deploy to.")] = "mat-local",
) -> None:
    """Create the work pool and register the deployments in prefect.yaml with the running server."""
    from multiagenttrainer.server import configure_prefect_environment

    configure_prefect_environment()
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
    return Path(__file__).resolve().parent.parent


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
