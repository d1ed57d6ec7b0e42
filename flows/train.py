"""The `train` flow: the train stage (multiagenttrainer/training.py) with Prefect tasks as its steps.

Ingest runs as the `ingest` subflow (cached, so unchanged sources cost almost nothing); set-up, each
experiment (`experiment-0` is the baseline) and the final report are task runs. A failed or crashed flow
sends an SES alert when `notifications.ses` is configured (or the `mat-ses-alerts` block exists), naming
the run and linking the flow run; the alert's traceback shows mat's frames, not Prefect's engine.

What a Prefect user sees and can rely on:
- Retry (the UI's button, `prefect flow-run retry`): the flow run runs again under the same id, and the
  stage resumes the run that flow run started (same run id, finished experiments not repeated).
- Deployment runs of `train` and `nightly` that write into the same runs directory never overlap: each
  holds the global concurrency limit `mat-output-<digest of the directory>` (limit 1) for the whole run.
  Collision strategy: enqueue: a second run waits, saying so in its logs, until the first one ends.
  (`mat train` in a terminal is not limited: several named runs may share a directory on purpose.)
- The flow's return value (the run's summary) is persisted as JSON in the shared result storage, so
  `mat train --deployment` can print it.

`run_train` is what the CLI calls: it runs the flow in this process with the config it already loaded
and reports progress to the caller's TrainProgress object. `experiments_on_machine` continues a run's
experiments on one machine; it is the `experiments-on-machine` deployment that multi-machine runs start.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from prefect import Flow, flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import FlowRun, State
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from prefect.utilities.urls import url_for

import blocks
import flows
import tasks
from blocks.settings import with_setting_blocks
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
from multiagenttrainer.notify import failure_traceback, make_notifier, notify_safely, run_failure_alert
from multiagenttrainer.progress import progress_log
from multiagenttrainer.training import (
    TrainRequest,
    default_run_name,
    is_machine_batch,
    on_machine,
    run_machine_batch,
    run_training,
    train_request,
)
from multiagenttrainer.workspace.setup import Workspace
from tasks import ProgressSlot
from tasks.train import experiment_results, run_experiment, setup_run, write_report

FAILURE_TAIL_LINES = 40
MAT_ROOTS = tuple(Path(str(package.__file__)).resolve().parent for package in (flows, tasks, blocks))
OUTPUT_LIMIT_PREFIX = "mat-output-"
LOCKED = 423  # the server's answer when a concurrency slot is taken
OUTPUT_LEASE_S = 60.0  # a killed run's slot is given back within this (plus the server's 15 s sweep)
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
        state = run_experiment(runner, loop, experiment_id, return_state=True)
        machine = loop.machine if loop.state.machines else None
        return experiment_results(state, loop.state, experiment_id, machine)

    def report(self, runner: Runner) -> dict[str, str]:
        return write_report(runner)

    def machine_batches(self, request: TrainRequest) -> Batches:
        if not request.via_deployments:
            return run_in_threads
        from flows.machines import batches_via_deployments

        assert request.config_path is not None  # check_via_deployments
        return batches_via_deployments(request.config_path, [m.name for m in request.config.machines])


# --------------------------------------------------------------------------- alerts


def flow_run_url(flow_run_id: object) -> str | None:
    """The UI page of a flow run when a Prefect server is in use (None in ephemeral mode)."""
    return url_for("flow-run", obj_id=str(flow_run_id)) if flow_run_id else None


def failure_text(state: State[Any]) -> tuple[str, str]:
    """(error, traceback tail) of a failed or crashed flow run's state; the tail holds mat's frames only.

    A crash (killed, interrupted, lost its process) has no traceback worth sending: its message says it.
    """
    if state.is_crashed():
        return state.message or "the flow run crashed", ""
    try:
        outcome = state.result(raise_on_failure=False)
    except Exception:  # a crash seen from another process may have no result to read
        outcome = None
    if not isinstance(outcome, BaseException):
        return state.message or state.name or "failed", ""
    error = str(outcome) or type(outcome).__name__
    if not isinstance(outcome, MatError):
        error = f"{type(outcome).__name__}: {error}"
    return error, failure_traceback(outcome, MAT_ROOTS, FAILURE_TAIL_LINES)


def config_of(parameters: dict[str, Any]) -> Config:
    """The flow run's config: the validated dict it was given in-process, or its config file (with
    the settings its blocks hold)."""
    given = parameters.get("config")
    if isinstance(given, dict):
        return Config.model_validate(given)
    return with_setting_blocks(load_config(parameters.get("config_path")))


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
    subject, body = run_failure_alert(
        label, error, tail, flow_run_url(flow_run.id), crashed=state.is_crashed()
    )
    notify_safely(notifier, subject, body)


# --------------------------------------------------------------------------- one deployment run per output


def driven_by_deployment() -> bool:
    """Whether this flow run belongs to a deployment run (its own, or its parent's, as under nightly)."""
    return bool(current_deployment.id or current_flow_run.parent_deployment_id)


def output_limit_name(runs_dir: Path) -> str:
    """The global concurrency limit that guards one runs directory."""
    return OUTPUT_LIMIT_PREFIX + hashlib.sha256(str(runs_dir).encode()).hexdigest()[:16]


def ensure_output_limit(name: str, runs_dir: Path) -> None:
    """Create the limit (1 slot) when it is missing."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            return
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            return
    get_run_logger().info("created the concurrency limit %s (1 run at a time) for %s", name, runs_dir)


def slot_is_taken(error: ConcurrencySlotAcquisitionError) -> bool:
    """Whether a single attempt to take the slot failed because another run holds it (423 Locked)."""
    cause = error.__cause__
    return isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == LOCKED


@contextlib.contextmanager
def one_deployment_run_per_output(runs_dir: Path) -> Iterator[None]:
    """Deployment runs writing into `runs_dir` run one at a time (collision strategy: enqueue).

    One attempt first, so that a run that has to wait always says so (checking the slot before
    waiting for it would miss a run that takes it in between).
    """
    if not driven_by_deployment():
        yield
        return
    name = output_limit_name(runs_dir)
    ensure_output_limit(name, runs_dir)
    held = contextlib.ExitStack()
    try:
        held.enter_context(
            concurrency(name, occupy=1, lease_duration=OUTPUT_LEASE_S, strict=True, max_retries=0)
        )
    except ConcurrencySlotAcquisitionError as error:
        if not slot_is_taken(error):
            raise
        progress_log.warning(
            "another train or nightly run writes into %s; waiting for it to finish (concurrency limit %s)",
            runs_dir,
            name,
        )
        held.enter_context(concurrency(name, occupy=1, lease_duration=OUTPUT_LEASE_S, strict=True))
    with held:
        yield


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
    persist_result=True,
    result_serializer="json",
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
    via_deployments: bool = False,
) -> dict[str, Any]:
    """Ingest, set up a run, run its experiments (one task each) and write the report; returns a summary.

    `config` is the already-loaded config when the flow runs in-process; deployments pass `config_path`.
    Run again under the same flow run id (a retry), it resumes the run it started.
    """
    flow_run_id = current_flow_run.id
    request = train_request(
        with_setting_blocks(config or load_config(config_path)),
        name=name,
        config_path=config_path,
        max_experiments=max_experiments,
        output_dir=output_dir,
        repos=repos or [],
        resume=resume,
        corpus_dir=corpus_dir,
        flow_run_id=flow_run_id,
        flow_run_url=flow_run_url(flow_run_id),
        via_deployments=via_deployments,
    )
    with one_deployment_run_per_output(request.runs_dir):
        return run_training(request, PrefectTrainSteps(), PROGRESS.current())


@flow(
    name="experiments-on-machine",
    flow_run_name="{machine}: {run_id}",
    on_failure=[alert_run_failure],
    on_crashed=[alert_run_failure],
    persist_result=True,
    result_serializer="json",
)
def experiments_on_machine(
    run_id: str, machine: str, output_dir: str | None = None, config_path: str | None = None
) -> dict[str, Any]:
    """Run `machine`'s batch of run `run_id`: its share of the experiments of a multi-machine run that is
    going on (`mat train --via-deployments` starts one per machine); or, for a run without that machine,
    resume it and run its remaining experiments on `machine`. Returns what it did."""
    cfg = with_setting_blocks(load_config(config_path))
    runs_dir = expand_path(output_dir or cfg.training.output_dir).resolve()
    if is_machine_batch(runs_dir, run_id, machine):
        return run_machine_batch(run_id, runs_dir, machine, PrefectTrainSteps(), PROGRESS.current())
    cfg = on_machine(cfg, machine)
    flow_run_id = current_flow_run.id
    request = train_request(
        cfg,
        config_path=config_path,
        output_dir=output_dir,
        resume=run_id,
        flow_run_id=flow_run_id,
        flow_run_url=flow_run_url(flow_run_id),
    )
    progress_log.info("run %s: the remaining experiments run on machine %s", run_id, machine)
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
    via_deployments: bool = False,
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
            via_deployments=via_deployments,
        )
    return summary
