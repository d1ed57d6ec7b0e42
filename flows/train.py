"""The `train` flow: ingest -> corpus -> workspace set-up -> one task per experiment -> report.

Ingest runs as a subflow (cached, so unchanged sources cost almost nothing). If some sources fail
but a corpus was written, training goes on and the summary notes it; without a corpus the flow
fails. With `resume`, ingest and set-up are skipped and the run continues where results.tsv ends.

Experiments run one task each, in order (`experiment-0` is the baseline), and report.md is
rewritten after each. A crashed experiment is a result: it sends an SES alert when
`notifications.ses` is configured, and the run goes on. A failed or crashed flow sends one too,
with a link to the flow run when a Prefect server is in use.

`run_train` is what the CLI calls: it runs the flow in this process and reports progress to the
caller's TrainProgress object.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import flow_run as current_flow_run
from prefect.utilities.urls import url_for

from flows.ingest import in_process_settings, ingest
from multiagenttrainer import report
from multiagenttrainer.config import Config, expand_path, load_config
from multiagenttrainer.errors import IngestIncomplete, MatError
from multiagenttrainer.experiments.loop import ResultHook
from multiagenttrainer.experiments.model import ExperimentResult
from multiagenttrainer.experiments.runner import DEFAULT_NAME, Runner, sigterm_stops
from multiagenttrainer.notify import (
    SesNotifier,
    experiment_crash_alert,
    make_notifier,
    notify_safely,
    run_failure_alert,
)
from multiagenttrainer.progress import NullTrainProgress, TrainProgress
from multiagenttrainer.workspace.setup import Workspace
from tasks.train import RunRequest, run_experiment, setup_run, write_report

log = logging.getLogger(__name__)

FAILURE_TAIL_LINES = 40
_PROGRESS: ContextVar[TrainProgress | None] = ContextVar("mat_train_progress", default=None)
_RUN_IDS: dict[str, str] = {}  # flow run id -> mat run id, so the failure hooks can name the run


# --------------------------------------------------------------------------- progress


def current_progress() -> TrainProgress:
    """The progress receiver of the run in this context, or one that ignores everything."""
    return _PROGRESS.get() or NullTrainProgress()


@contextmanager
def reporting_progress(progress: TrainProgress | None) -> Iterator[None]:
    """Send training progress events raised in this context to `progress`."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


# --------------------------------------------------------------------------- alerts


def default_run_name(name: str | None, config_path: str | None) -> str:
    """The name given, else the config file's stem (`quickstart`), else "run"."""
    return name or (Path(config_path).stem if config_path else DEFAULT_NAME)


def flow_run_url(flow_run_id: object) -> str | None:
    """The UI page of a flow run when a Prefect server is in use (None in ephemeral mode)."""
    return url_for("flow-run", obj_id=str(flow_run_id)) if flow_run_id else None


def failure_text(state: State[Any]) -> tuple[str, str]:
    """(error, traceback tail) of a failed or crashed flow run's state."""
    try:
        outcome = state.result(raise_on_failure=False)
    except Exception:  # a crash seen from another process may have no result to read
        outcome = None
    if not isinstance(outcome, BaseException):
        return state.message or state.name or "failed", ""
    error = str(outcome) or type(outcome).__name__
    if not isinstance(outcome, MatError):
        error = f"{type(outcome).__name__}: {error}"
    lines = "".join(traceback.format_exception(outcome)).splitlines()
    return error, "\n".join(lines[-FAILURE_TAIL_LINES:])


def alert_run_failure(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Flow hook (on_failure, on_crashed): e-mail the failure when notifications.ses is configured."""
    parameters = flow_run.parameters or {}
    try:
        cfg = load_config(parameters.get("config_path"))
    except MatError:
        return  # a config that does not load cannot say where alerts go
    notifier = make_notifier(cfg.notifications)
    if notifier is None:
        return
    label = (
        _RUN_IDS.get(str(flow_run.id))
        or parameters.get("resume")
        or default_run_name(parameters.get("name"), parameters.get("config_path"))
    )
    error, tail = failure_text(state)
    subject, body = run_failure_alert(str(label), error, tail, flow_run_url(flow_run.id))
    notify_safely(notifier, subject, body)


def crash_alerts(notifier: SesNotifier, runner: Runner) -> ResultHook:
    """An on_result hook that e-mails each crashed experiment, with its log's absolute path."""

    def alert(result: ExperimentResult) -> None:
        if result.status != "crash" or runner.state is None or runner.run_dir is None:
            return
        if result.log_path:
            result = dataclasses.replace(result, log_path=str(runner.run_dir / result.log_path))
        notify_safely(notifier, *experiment_crash_alert(runner.state, result))

    return alert


def progress_hook(progress: TrainProgress, runner: Runner) -> ResultHook:
    """An on_result hook that reports each recorded experiment to `progress`."""

    def report_result(result: ExperimentResult) -> None:
        if runner.state is not None:
            progress.experiment_finished(result, runner.state)

    return report_result


# --------------------------------------------------------------------------- stages


def prepare_corpus(
    cfg: Config, config_path: str | None, repos: list[str], corpus_dir: str | None
) -> tuple[str, list[str]]:
    """Ingest (a subflow) and return the corpus directory and notes; without sources, the existing corpus."""
    if not cfg.sources and not repos:
        directory = str(expand_path(corpus_dir or cfg.corpus.dir).resolve())
        current_progress().corpus_ready(directory, "existing")
        return directory, []
    notes: list[str] = []
    try:
        summary: dict[str, Any] = ingest(config_path=config_path, repos=repos or None, corpus_dir=corpus_dir)
    except IngestIncomplete as exc:
        if exc.summary.get("stats") is None:
            raise
        summary = exc.summary
        failed = ", ".join(f"{f['source']} ({f['error']})" for f in summary.get("failures", []))
        notes.append(f"some sources failed and were left out of the corpus: {failed}")
        log.warning("training on an incomplete corpus: %s", failed)
    current_progress().corpus_ready(str(summary["corpus_dir"]), str(summary["corpus_status"]))
    return str(summary["corpus_dir"]), notes


def attach_run(runner: Runner, cfg: Config) -> None:
    """Record the flow run in run.json and install the result hooks (progress, crash alerts)."""
    assert runner.state is not None and runner.run_dir is not None
    flow_run_id = current_flow_run.id
    runner.state.flow_run_url = flow_run_url(flow_run_id)
    runner.state.save(runner.run_dir)
    if flow_run_id:
        _RUN_IDS[str(flow_run_id)] = runner.state.run_id
    progress = current_progress()
    runner.hooks.append(progress_hook(progress, runner))
    notifier = make_notifier(cfg.notifications)
    if notifier is not None:
        runner.hooks.append(crash_alerts(notifier, runner))
    progress.run_started(runner.run_dir, runner.state)


def run_all_experiments(runner: Runner, workspace: Workspace, max_experiments: int | None) -> None:
    """One task per experiment until the run is complete; the run is ended in run.json either way."""
    loop = runner.begin(workspace, max_experiments)
    try:
        with sigterm_stops(loop.stop, workspace.path):
            while runner.has_next(loop):
                run_experiment(runner, loop, len(loop.state.experiments))
    except BaseException as exc:
        runner.abort(loop, exc)
        report.write_report(loop.run_dir, loop.state)  # the report shows how the run ended
        raise
    runner.end(loop, "completed")


def run_summary(runner: Runner, files: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """What the flow returns: where the run is, how it ended, its best result."""
    state = runner.state
    assert state is not None
    best, baseline = state.best, state.baseline
    return {
        "run_id": state.run_id,
        "run_dir": str(runner.run_dir),
        "status": state.status,
        "experiments": state.done,
        "max_experiments": state.max_experiments,
        "baseline_val_bpb": baseline.val_bpb if baseline else None,
        "best_val_bpb": best.val_bpb if best else None,
        "best_commit": best.commit if best else None,
        "flow_run_url": state.flow_run_url,
        "notes": notes,
        **files,
    }


def train_run_name() -> str:
    """The flow run's name in the UI: the run's name, or what it resumes."""
    parameters = current_flow_run.parameters
    if parameters.get("resume"):
        return f"resume-{parameters['resume']}"
    return default_run_name(parameters.get("name"), parameters.get("config_path"))


# --------------------------------------------------------------------------- flows


@flow(
    name="train",
    flow_run_name=train_run_name,
    on_failure=[alert_run_failure],
    on_crashed=[alert_run_failure],
)
def train(
    config_path: str | None = None,
    name: str | None = None,
    max_experiments: int | None = None,
    output_dir: str | None = None,
    repos: list[str] | None = None,
    resume: str | None = None,
    corpus_dir: str | None = None,
) -> dict[str, Any]:
    """Ingest, set up a run, run its experiments (one task each) and write the report; returns a summary."""
    cfg = load_config(config_path)
    runs_dir = expand_path(output_dir or cfg.training.output_dir).resolve()
    training = cfg.training.model_copy(
        update={
            "output_dir": str(runs_dir),
            "max_experiments": max_experiments or cfg.training.max_experiments,
        }
    )
    notes: list[str] = []
    corpus_path = None
    if not resume:
        corpus_path, notes = prepare_corpus(cfg, config_path, repos or [], corpus_dir)
    run_name = default_run_name(name, config_path)
    request = RunRequest(cfg.autoresearch, training, run_name, runs_dir, corpus_path, resume, cfg.github)
    runner, workspace = setup_run(request)
    attach_run(runner, cfg)
    run_all_experiments(runner, workspace, max_experiments)
    assert runner.run_dir is not None and runner.state is not None
    files = write_report(runner.run_dir, runner.state)
    return run_summary(runner, files, notes)


def run_train(
    config_path: str | Path | None = None,
    name: str | None = None,
    max_experiments: int | None = None,
    output_dir: str | Path | None = None,
    repos: list[str] | None = None,
    resume: str | None = None,
    corpus_dir: str | Path | None = None,
    progress: TrainProgress | None = None,
) -> dict[str, Any]:
    """Run the train flow here with live progress; raises MatError (or KeyboardInterrupt) on failure."""
    with reporting_progress(progress), in_process_settings():
        summary: dict[str, Any] = train(
            config_path=str(config_path) if config_path is not None else None,
            name=name,
            max_experiments=max_experiments,
            output_dir=str(output_dir) if output_dir is not None else None,
            repos=list(repos) if repos else None,
            resume=resume,
            corpus_dir=str(corpus_dir) if corpus_dir is not None else None,
        )
    return summary
