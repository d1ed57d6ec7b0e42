"""The `mat` command: parse arguments, load the config, call a flow or the library, render the result.

The core commands live here; `mat server ...` in server.py, `mat worker ...` in worker.py, `mat finetune
...` in finetune.py, `mat serve` in serve.py, `mat request ...` in request.py, and what they all share in
common.py. `--deployment` runs of ingest and train are submitted and followed by follow.py.

Prefect is imported only by the commands that run flows, after `configure_prefect_environment()`
has pointed it at a running `mat server` (if any), so read-only commands stay fast.
"""

from __future__ import annotations

import signal
import sys
import threading
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table

from multiagenttrainer import __version__
from multiagenttrainer.cli.common import (
    ConfigOption,
    JsonOption,
    RepoOption,
    absolute,
    config_parameter,
    err,
    fail,
    load_with_repos,
    out,
    prepare_prefect,
    require_server,
    warn,
)
from multiagenttrainer.cli.finetune import finetune_app
from multiagenttrainer.cli.request import request_app
from multiagenttrainer.cli.serve import serve_command
from multiagenttrainer.cli.server import server_app
from multiagenttrainer.cli.worker import worker_app
from multiagenttrainer.config import Config, load_config
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
app.add_typer(worker_app, name="worker")
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

NO_WORKER = "a run submitted to a throw-away server has no worker"
DeploymentOption = Annotated[
    bool,
    typer.Option(
        "--deployment",
        help="Submit a flow run of the deployment to its work pool (after `mat deploy`) and follow it here.",
    ),
]


@app.command()
def ingest(
    config: ConfigOption = None,
    repo: RepoOption = None,
    corpus_dir: Annotated[
        Path | None, typer.Option("--corpus-dir", help="Where to write the corpus (default: corpus.dir).")
    ] = None,
    as_json: JsonOption = False,
    deployment: DeploymentOption = False,
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
    if deployment:
        ingest_on_deployment(config, repo, corpus_dir, as_json)
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


def ingest_on_deployment(
    config: Path | None, repo: list[str] | None, corpus_dir: Path | None, as_json: bool
) -> NoReturn:
    """`mat ingest --deployment`: a run of ingest/ingest on its work pool, followed here."""
    require_server(NO_WORKER, "run `mat deploy` and `mat worker start`")  # before Prefect is imported
    from multiagenttrainer.cli.follow import result_of, run_and_follow
    from multiagenttrainer.render import render_ingest_summary

    parameters = {
        "config_path": config_parameter(config),
        "repos": repo or None,
        "corpus_dir": absolute(corpus_dir),
    }
    try:
        flow_run, code = run_and_follow("ingest/ingest", parameters, err)
    except MatError as exc:
        fail(exc)
    summary = result_of(flow_run) if flow_run is not None and code == 0 else None
    if isinstance(summary, dict) and summary.get("stats") is not None:
        if as_json:
            out.print_json(data=summary["stats"])
        else:
            render_ingest_summary(out, summary)
    elif code == 0:
        warn("the run's summary is not in this machine's result storage; see the flow run in the UI")
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
    deployment: DeploymentOption = False,
    via_deployments: Annotated[
        bool,
        typer.Option(
            "--via-deployments",
            help="Run each machine's batch as a flow run of experiments-on-machine/<machine> on the "
            "machine's work pool (after `mat deploy` and `mat worker start`).",
        ),
    ] = False,
) -> None:
    """Ingest, set up a workspace and run training experiments; writes results.tsv and report.md."""
    from multiagenttrainer.config import expand_path
    from multiagenttrainer.experiments.starting import starting_marker
    from multiagenttrainer.training import default_run_name

    try:
        cfg = load_with_repos(config, repo)  # fail fast on config errors, before Prefect starts
        if not resume:
            from multiagenttrainer.agents import make_agent

            make_agent(cfg.training)  # an agent command that cannot work is a config error
        if via_deployments:
            from multiagenttrainer.training import check_via_deployments, train_request

            check_via_deployments(train_request(cfg, config_path=config, via_deployments=True))
    except MatError as exc:
        fail(exc)
    if deployment:
        parameters = {
            "config_path": config_parameter(config),
            "name": name,
            "max_experiments": max_experiments,
            "output_dir": absolute(output_dir),
            "repos": repo or None,
            "resume": resume,
            "corpus_dir": absolute(corpus_dir),
            "via_deployments": via_deployments,
        }
        train_on_deployment(parameters)
    runs = expand_path(str(output_dir or cfg.training.output_dir))
    with starting_marker(runs, resume or default_run_name(name, config)):  # `mat watch` sees it from now on
        run_train_command(cfg, config, name, max_experiments, output_dir, resume, corpus_dir, via_deployments)


def run_train_command(
    cfg: Config,
    config: Path | None,
    name: str | None,
    max_experiments: int | None,
    output_dir: Path | None,
    resume: str | None,
    corpus_dir: Path | None,
    via_deployments: bool,
) -> None:
    """`mat train` once its config is loaded and checked: start Prefect, run, print where things are."""
    from multiagenttrainer.render import TrainReporter

    if via_deployments:
        require_server(NO_WORKER, "run `mat deploy` and `mat worker start`")
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
            via_deployments=via_deployments,
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


def train_on_deployment(parameters: dict[str, Any]) -> NoReturn:
    """`mat train --deployment`: a run of train/train on its work pool, followed here."""
    require_server(NO_WORKER, "run `mat deploy` and `mat worker start`")  # before Prefect is imported
    from multiagenttrainer.cli.follow import run_and_follow

    try:
        _, code = run_and_follow("train/train", parameters, out)
    except MatError as exc:
        fail(exc)
    raise typer.Exit(code)


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


class CodeFrom(StrEnum):
    """`mat deploy --code-from`: where a flow run gets mat's code (deployments/register.py)."""

    directory = "directory"
    git = "git"


@app.command()
def deploy(
    config: ConfigOption = None,
    work_pool: Annotated[
        str, typer.Option(help="Work pool of the deployments (process type).")
    ] = "mat-local",
    code_from: Annotated[
        CodeFrom,
        typer.Option(
            "--code-from",
            help="How flow runs get mat's code: `directory` (work in this checkout, the default) or `git` "
            "(clone the remote branch this checkout tracks, for workers on other machines).",
        ),
    ] = CodeFrom.directory,
) -> None:
    """Create the work pools (mat-local, mat-<machine>) and register the deployments of prefect.yaml."""
    try:
        cfg = load_config(config)
    except MatError as exc:
        fail(exc)
    require_server("deployments registered with a throw-away one would be lost", "run `mat deploy` again")
    from deployments.register import deploy as register

    config_path = config_file_for_deployments(config)
    try:
        report = register(project_dir(), cfg, config_path, work_pool, code_from=code_from.value)
    except MatError as exc:
        fail(exc)
    for line in report.warnings:
        warn(line)
    for pool in report.pools:
        limit = f"at most {pool.limit} flow runs at once" if pool.limit else "no limit"
        out.print(f"work pool {pool.name} ({limit})", markup=False)
    for name in report.deployments:
        out.print(f"deployed {name}", markup=False)
    out.print(f"flow runs get the code by: {describe_pull(report.pull_steps)}", markup=False)
    if config_path is not None:
        out.print(f"deployments use {config_path} unless a run passes another config_path", markup=False)
    out.print("Start the workers with `mat worker start` (or: prefect worker start --pool mat-local).")


def config_file_for_deployments(config: Path | None) -> Path | None:
    """The config the deployments default to: --config, else ./multiagenttrainer.yaml if present."""
    from multiagenttrainer.config import DEFAULT_CONFIG_FILE

    path = config if config is not None else Path(DEFAULT_CONFIG_FILE)
    return path.resolve() if path.is_file() else None


def describe_pull(steps: list[dict[str, Any]]) -> str:
    """One line for the deployments' pull step."""
    (name, arguments), *_ = steps[0].items()
    if name.endswith("git_clone"):
        return f"git clone {arguments['repository']} (branch {arguments['branch']})"
    return f"working in {arguments['directory']} (it must exist where the worker runs)"


def project_dir() -> Path:
    """The directory holding prefect.yaml, flows/ and tasks/ (the repository root)."""
    return Path(__file__).resolve().parents[2]


def main() -> None:
    """Run the command line (the `mat` script's multiagenttrainer.console.main loads it first)."""
    from multiagenttrainer.cli.common import configure_console_logging, print_error
    from multiagenttrainer.errors import INTERRUPTED_MESSAGE, disk_full_error, is_disk_full

    pressed = watch_ctrl_c()
    try:
        configure_console_logging()
        app()
    except SystemExit as exc:
        if exc.code == 130 and caused_by_interrupt(exc):  # typer ends a Ctrl-C with exit 130, silently
            err.print(INTERRUPTED_MESSAGE)
        raise
    except BaseException as exc:
        if pressed.is_set() or caused_by_interrupt(exc):  # a library may turn it into an error of its own
            err.print(INTERRUPTED_MESSAGE)
            sys.exit(130)
        if not isinstance(exc, OSError) or not is_disk_full(exc):
            raise
        full = disk_full_error(exc, Path.cwd(), 0, "run the command again")
        print_error(full)  # outside the app, where typer's Exit would end in a traceback
        sys.exit(full.exit_code)
    finally:
        skip_collection_at_exit()


def watch_ctrl_c() -> threading.Event:
    """An event set when Ctrl-C (SIGINT) arrives; KeyboardInterrupt is raised as usual. Where SIGINT is
    ignored (a background job) it stays ignored."""
    pressed = threading.Event()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:

        def note_and_raise(signum: int, frame: FrameType | None) -> None:
            pressed.set()
            signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, note_and_raise)
    return pressed


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a Ctrl-C is behind `exc`: a KeyboardInterrupt in its chain of causes (a context that was
    replaced on purpose, `raise ... from None`, does not count: that command has said so itself)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return False


def skip_collection_at_exit() -> None:
    """Keep the interpreter's shutdown from walking every object Prefect and torch created.

    Once a command is done, the garbage collector's passes over ~100k module-level objects during
    interpreter finalization cost about 0.4 s per command (a third of a no-change `mat ingest`). Frozen
    objects are left to the operating system; exit handlers (Prefect's log and event flushes, logging's
    shutdown) and reference-count clean-up still run as usual.
    """
    import gc

    gc.freeze()
