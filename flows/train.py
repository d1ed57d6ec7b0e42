"""The `train` flow: the train stage (multiagenttrainer/training.py) with Prefect tasks as its steps.

Ingest runs as the `ingest` subflow (cached, so unchanged sources cost almost nothing); set-up, each
experiment (`experiment-0` is the baseline) and the final report are task runs. A failed or crashed flow
sends an SES alert when `notifications.ses` is configured, naming the run and linking the flow run.

`run_train` is what the CLI calls: it runs the flow in this process with the config it already loaded
and reports progress to the caller's TrainProgress object.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import flow_run as current_flow_run
from prefect.utilities.urls import url_for

from flows import loaded_config
from flows.ingest import in_process_settings, ingest
from multiagenttrainer.config import Config, expand_path, load_config
from multiagenttrainer.errors import MatError
from multiagenttrainer.experiments.fleet import Batches, run_in_threads
from multiagenttrainer.experiments.loop import Loop
from multiagenttrainer.experiments.progress import NullTrainProgress, TrainProgress
from multiagenttrainer.experiments.run_state import find_run_of_flow_run
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.notify import make_notifier, notify_safely, run_failure_alert
from multiagenttrainer.training import TrainRequest, default_run_name, run_training, train_request
from multiagenttrainer.workspace.setup import Workspace
from tasks import ProgressSlot
from tasks.train import run_experiment, setup_run, write_report

FAILURE_TAIL_LINES = 40
PROGRESS: ProgressSlot[TrainProgress] = ProgressSlot("mat_train_progress", NullTrainProgress)


# --------------------------------------------------------------------------- the stage's steps


class PrefectTrainSteps:
    """The train stage's steps as Prefect tasks, with ingest as the `ingest` subflow."""

    def ingest(self, request: TrainRequest) -> dict[str, Any]:
        summary: dict[str, Any] = ingest(
            repos=list(request.repos) or None, corpus_dir=request.corpus_dir, config=request.config
        )
        return summary

    def setup(self, request: TrainRequest, corpus_dir: str | None) -> tuple[Runner, Workspace]:
        return setup_run(request, corpus_dir)

    def experiment(self, runner: Runner, loop: Loop, experiment_id: int) -> list[ExperimentResult]:
        return run_experiment(runner, loop, experiment_id)

    def report(self, runner: Runner) -> dict[str, str]:
        return write_report(runner)

    def machine_batches(self, request: TrainRequest) -> Batches:
        if not request.via_deployments:
            return run_in_threads
        from flows.machines import batches_via_deployments

        assert request.config_path is not None  # check_via_deployments
        return batches_via_deployments(request.config_path)


# --------------------------------------------------------------------------- alerts


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


def config_of(parameters: dict[str, Any]) -> Config:
    """The flow run's config: the validated dict it was given in-process, or its config file."""
    given = parameters.get("config")
    if isinstance(given, dict):
        return Config.model_validate(given)
    return load_config(parameters.get("config_path"))


def run_label(cfg: Config, flow_run: FlowRun, parameters: dict[str, Any]) -> str:
    """The mat run the flow run drove (found through run.json), else what it resumed or its name."""
    runs_dir = expand_path(parameters.get("output_dir") or cfg.training.output_dir)
    state = find_run_of_flow_run(runs_dir, str(flow_run.id))
    if state is not None:
        return state.run_id
    return parameters.get("resume") or default_run_name(parameters.get("name"), parameters.get("config_path"))


def alert_run_failure(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Flow hook (on_failure, on_crashed): e-mail the failure when notifications.ses is configured."""
    parameters = flow_run.parameters or {}
    try:
        cfg = config_of(parameters)
    except (MatError, ValueError):
        return  # a config that does not load cannot say where alerts go
    notifier = make_notifier(cfg.notifications)
    if notifier is None:
        return
    error, tail = failure_text(state)
    label = run_label(cfg, flow_run, parameters)
    subject, body = run_failure_alert(label, error, tail, flow_run_url(flow_run.id))
    notify_safely(notifier, subject, body)


# --------------------------------------------------------------------------- the flow


def train_run_name() -> str:
    """The flow run's name in the UI: the run's name, or what it resumes."""
    parameters = current_flow_run.parameters
    if parameters.get("resume"):
        return f"resume-{parameters['resume']}"
    return default_run_name(parameters.get("name"), parameters.get("config_path"))


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
    config: Config | None = None,
) -> dict[str, Any]:
    """Ingest, set up a run, run its experiments (one task each) and write the report; returns a summary.

    `config` is the already-loaded config when the flow runs in-process; deployments pass `config_path`.
    """
    flow_run_id = current_flow_run.id
    request = train_request(
        config or load_config(config_path),
        name=name,
        config_path=config_path,
        max_experiments=max_experiments,
        output_dir=output_dir,
        repos=repos or [],
        resume=resume,
        corpus_dir=corpus_dir,
        flow_run_id=flow_run_id,
        flow_run_url=flow_run_url(flow_run_id),
    )
    return run_training(request, PrefectTrainSteps(), PROGRESS.current())


def run_train(
    config: Config | str | Path | None = None,
    *,
    config_path: str | Path | None = None,
    name: str | None = None,
    max_experiments: int | None = None,
    output_dir: str | Path | None = None,
    repos: Sequence[str] = (),
    resume: str | None = None,
    corpus_dir: str | Path | None = None,
    progress: TrainProgress | None = None,
) -> dict[str, Any]:
    """Run the train flow here with live progress; raises MatError (or KeyboardInterrupt) on failure."""
    cfg, loaded_from = loaded_config(config)
    config_path = config_path or loaded_from
    with PROGRESS.reporting(progress), in_process_settings():
        summary: dict[str, Any] = train(
            config_path=str(config_path) if config_path is not None else None,
            name=name,
            max_experiments=max_experiments,
            output_dir=str(output_dir) if output_dir is not None else None,
            repos=list(repos) or None,
            resume=resume,
            corpus_dir=str(corpus_dir) if corpus_dir is not None else None,
            config=cfg,
        )
    return summary
