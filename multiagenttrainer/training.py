"""The train stage, written once: corpus (ingest) -> workspace -> experiments -> report.

    request = train_request(cfg, name="small", max_experiments=4)
    summary = run_training(request)                       # plain calls (PlainTrainSteps)
    summary = run_training(request, PrefectTrainSteps())  # flows/train.py: steps are Prefect tasks

The rules live here:
- a new run ingests first (cached by the steps that can cache); when some sources fail but a corpus was
  written, training goes on and the summary notes it; without a corpus the run fails; with no sources
  at all, the corpus already in `corpus.dir` is used;
- `--resume` skips ingest and set-up and continues where results.tsv ends (experiments/runner.py);
- a flow run that runs again under the same id (a retry from the Prefect UI, `prefect flow-run retry`)
  resumes the run that flow run started (run.json records it) instead of starting a new one;
- experiments run one at a time through `run_loop`, and report.md is rewritten after each;
- a crashed experiment is a result, not a failure: it is e-mailed when `notifications.ses` is set;
- however the run ends, run.json and the report say how;
- every progress line `mat train` prints is also logged (`multiagenttrainer.progress`), so a flow run's
  logs hold them too (LoggedTrainProgress).

`TrainSteps` is what a caller swaps: the plain steps here, or Prefect tasks (tasks/train.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from multiagenttrainer import report
from multiagenttrainer.agents.base import Agent
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import Config, TrainingConfig, expand_path
from multiagenttrainer.errors import ConfigError, IngestIncomplete, MatError, disk_full_error, is_disk_full
from multiagenttrainer.experiments.fleet import Batches, Fleet, run_in_threads
from multiagenttrainer.experiments.loop import Loop, ResultHook
from multiagenttrainer.experiments.progress import NullTrainProgress, TrainProgress
from multiagenttrainer.experiments.run_state import RunState, find_run_of_flow_run, load_run
from multiagenttrainer.experiments.runner import DEFAULT_NAME, Runner, drive, find_run_dir, run_batch
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.notify import SesNotifier, experiment_crash_alert, make_notifier, notify_safely
from multiagenttrainer.progress import progress_log
from multiagenttrainer.workspace.setup import Workspace

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class TrainRequest:
    """One `mat train`: the loaded config and the command's choices, with paths made absolute."""

    config: Config
    name: str
    runs_dir: Path
    max_experiments: int | None = None
    repos: tuple[str, ...] = ()
    resume: str | None = None
    corpus_dir: str | None = None
    flow_run_id: str | None = None
    flow_run_url: str | None = None
    config_path: str | None = None  # where the config came from, for processes that load it again
    via_deployments: bool = False  # machines' batches as flow runs of their deployments (flows/machines.py)

    @property
    def training(self) -> TrainingConfig:
        """training: with the runs directory and experiment count this request asks for."""
        cfg = self.config.training
        count = self.max_experiments or cfg.max_experiments
        return cfg.model_copy(update={"output_dir": str(self.runs_dir), "max_experiments": count})


def default_run_name(name: str | None, config_path: str | Path | None) -> str:
    """The name given, else the config file's stem (`quickstart`), else "run"."""
    return name or (Path(config_path).stem if config_path else DEFAULT_NAME)


def train_request(
    cfg: Config,
    *,
    name: str | None = None,
    config_path: str | Path | None = None,
    max_experiments: int | None = None,
    output_dir: str | Path | None = None,
    repos: Sequence[str] = (),
    resume: str | None = None,
    corpus_dir: str | Path | None = None,
    flow_run_id: str | None = None,
    flow_run_url: str | None = None,
    via_deployments: bool = False,
) -> TrainRequest:
    """A TrainRequest from a command's options; unset options come from the config.

    A flow run that already started a run (it is being retried) resumes that run.
    """
    runs_dir = expand_path(str(output_dir or cfg.training.output_dir)).resolve()
    if resume is None and flow_run_id is not None:
        resume = run_to_retry(runs_dir, flow_run_id)
    return TrainRequest(
        config=cfg,
        name=default_run_name(name, config_path),
        runs_dir=runs_dir,
        max_experiments=max_experiments,
        repos=tuple(repos),
        resume=resume,
        corpus_dir=str(corpus_dir) if corpus_dir is not None else None,
        flow_run_id=flow_run_id,
        flow_run_url=flow_run_url,
        config_path=str(Path(config_path).expanduser().resolve()) if config_path is not None else None,
        via_deployments=via_deployments,
    )


def check_via_deployments(request: TrainRequest) -> None:
    """--via-deployments needs machines to send batches to and a config file their workers can load."""
    if not request.via_deployments:
        return
    if not request.config.machines:
        raise ConfigError(
            "machines: --via-deployments runs each machine's batch as a flow run; configure `machines:` "
            "(or run without --via-deployments)"
        )
    if request.config_path is None:
        raise ConfigError("--via-deployments needs --config FILE: the workers load the config from that file")


LOCAL_MACHINE = "local"  # the machine mat runs on, with training.execution as configured


def machine_names(cfg: Config) -> list[str]:
    """The machines a run's experiments can go to: `local` and every configured machine."""
    return [LOCAL_MACHINE, *(m.name for m in cfg.machines if m.name != LOCAL_MACHINE)]


def on_machine(cfg: Config, machine: str) -> Config:
    """`cfg` with its experiments on `machine`: that machine's execution target and agent command.

    "local" (unless a configured machine has that name) leaves `cfg` as it is; an unknown name is a
    ConfigError that lists the machines.
    """
    chosen = next((m for m in cfg.machines if m.name == machine), None)
    if chosen is None and machine == LOCAL_MACHINE:
        return cfg
    if chosen is None:
        raise ConfigError(
            f"machine {machine!r} is not configured; use one of: {', '.join(machine_names(cfg))} "
            "(the config's `machines:` names)"
        )
    update: dict[str, Any] = {"execution": chosen.execution}
    if chosen.agent_command:
        update["agent_command"] = chosen.agent_command
    return cfg.model_copy(update={"training": cfg.training.model_copy(update=update)})


def run_to_retry(runs_dir: Path, flow_run_id: str) -> str | None:
    """The id of the run a flow run started before, when it runs again (a retry); else None."""
    if not runs_dir.is_dir():
        return None
    state = find_run_of_flow_run(runs_dir, flow_run_id)
    if state is None:
        return None
    log.info("flow run %s runs again: resuming its run %s", flow_run_id, state.run_id)
    return state.run_id


# --------------------------------------------------------------------------- steps


class TrainSteps(Protocol):
    """What ingesting, setting up, running one experiment and reporting mean for one caller."""

    def ingest(self, request: TrainRequest) -> dict[str, Any]:
        """The ingest stage's summary; raises IngestIncomplete when a source failed."""
        ...

    def setup(self, request: TrainRequest, corpus_dir: str | None) -> tuple[Runner, Workspace]:
        """A new run with its workspace set up from the corpus, or the run request.resume reopened."""
        ...

    def experiment(self, runner: Runner, loop: Loop, experiment_id: int) -> list[ExperimentResult]:
        """Run and record experiment `experiment_id`."""
        ...

    def report(self, runner: Runner) -> dict[str, str]:
        """Write the final report; the paths written by name (report, plot)."""
        ...

    def machine_batches(self, request: TrainRequest) -> Batches:
        """How the machines of a multi-machine run run their batches: threads here, or flow runs."""
        ...


def open_run(
    request: TrainRequest, corpus_dir: str | None, secrets: Mapping[str, str] | None = None
) -> tuple[Runner, Workspace]:
    """Set a new run up from the corpus, or reopen the run to resume.

    `secrets`: where GITHUB_TOKEN is read for a private autoresearch fork (the environment by default).
    """
    if request.resume:
        runner, workspace = Runner.resume(request.resume, request.runs_dir)
        runner.shared_with_processes = request.via_deployments
        return runner, workspace
    cfg = request.config
    runner = Runner(
        cfg.autoresearch,
        request.training,
        request.name,
        output_dir=request.runs_dir,
        github=cfg.github,
        secrets=secrets,
        machines=cfg.machines,
    )
    runner.shared_with_processes = request.via_deployments
    return runner, runner.setup_workspace(str(corpus_dir))


def report_files(runner: Runner) -> dict[str, str]:
    """Write report.md and progress.png; their paths."""
    assert runner.run_dir is not None and runner.state is not None
    report_path, plot_path = report.write_report(runner.run_dir, runner.state)
    return {"report": str(report_path), "plot": str(plot_path)}


class PlainTrainSteps:
    """Each step a plain call in this process."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env

    def ingest(self, request: TrainRequest) -> dict[str, Any]:
        from multiagenttrainer.ingest import PlainSteps, plan_ingest, run_ingest

        plan = plan_ingest(request.config, request.repos, request.corpus_dir)
        return run_ingest(plan, PlainSteps(self.env))

    def setup(self, request: TrainRequest, corpus_dir: str | None) -> tuple[Runner, Workspace]:
        return open_run(request, corpus_dir, self.env)

    def experiment(self, runner: Runner, loop: Loop, experiment_id: int) -> list[ExperimentResult]:
        return runner.step(loop, experiment_id)

    def report(self, runner: Runner) -> dict[str, str]:
        return report_files(runner)

    def machine_batches(self, request: TrainRequest) -> Batches:
        if request.via_deployments:
            raise ConfigError(
                "--via-deployments needs the train flow (mat train runs it; the library cannot)"
            )
        return run_in_threads


# --------------------------------------------------------------------------- the stage


def prepare_corpus(
    request: TrainRequest, steps: TrainSteps, progress: TrainProgress
) -> tuple[str, list[str]]:
    """Ingest and return the corpus directory and notes; without sources, the corpus already there."""
    cfg = request.config
    if not cfg.sources and not request.repos:
        directory = str(expand_path(request.corpus_dir or cfg.corpus.dir).resolve())
        progress.corpus_ready(directory, "existing")
        return directory, []
    notes: list[str] = []
    try:
        summary = steps.ingest(request)
    except IngestIncomplete as exc:
        if exc.summary.get("stats") is None:
            raise
        summary = exc.summary
        failed = ", ".join(f"{f['source']} ({f['error']})" for f in summary.get("failures", []))
        notes.append(f"some sources failed and were left out of the corpus: {failed}")
        log.warning("training on an incomplete corpus: %s", failed)
    progress.corpus_ready(str(summary["corpus_dir"]), str(summary["corpus_status"]))
    return str(summary["corpus_dir"]), notes


class LoggedTrainProgress:
    """Logs each training event as the line `mat train` prints for it, and passes every event on."""

    def __init__(self, inner: TrainProgress) -> None:
        self.inner = inner

    def corpus_ready(self, corpus_dir: str, status: str) -> None:
        progress_log.info("%s", report.corpus_line(corpus_dir, status))
        self.inner.corpus_ready(corpus_dir, status)

    def run_started(self, run_dir: Path, state: RunState) -> None:
        progress_log.info("%s", report.run_started_line(run_dir, state))
        self.inner.run_started(run_dir, state)

    def experiment_finished(self, result: ExperimentResult, state: RunState) -> None:
        progress_log.info("%s", report.experiment_line(result, state))
        self.inner.experiment_finished(result, state)


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


def attach_run(runner: Runner, request: TrainRequest, progress: TrainProgress) -> None:
    """Record the driving flow run in run.json and install the result hooks (progress, crash alerts)."""
    assert runner.state is not None and runner.run_dir is not None
    runner.state.flow_run_id = request.flow_run_id
    runner.state.flow_run_url = request.flow_run_url
    runner.state.save(runner.run_dir)
    runner.hooks.append(progress_hook(progress, runner))
    notifier = make_notifier(request.config.notifications)
    if notifier is not None:
        runner.hooks.append(crash_alerts(notifier, runner))
    progress.run_started(runner.run_dir, runner.state)


def run_summary(runner: Runner, files: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """What the stage returns: where the run is, how it ended, its best result."""
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


def run_training(
    request: TrainRequest, steps: TrainSteps | None = None, progress: TrainProgress | None = None
) -> dict[str, Any]:
    """The whole stage; returns the run's summary, raises MatError (or KeyboardInterrupt) when it failed.

    A full disk anywhere (ingest, set-up, resume, an experiment) ends it with one DiskFullError line that
    says how much to free and what to run afterwards.
    """
    logged = LoggedTrainProgress(progress or NullTrainProgress())
    try:
        summary = train_stage(request, steps or PlainTrainSteps(), logged)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        then = f"`mat train --resume {request.resume}`" if request.resume else "run the command again"
        raise disk_full_error(exc, request.runs_dir, 0, then) from None
    for line in report.run_finished_lines(summary):
        progress_log.info("%s", line)
    return summary


def is_machine_batch(runs_dir: Path, run_id: str, machine: str) -> bool:
    """Whether `machine` is one of the machines of multi-machine run `run_id` (its batch can join it)."""
    try:
        state = load_run(find_run_dir(run_id, runs_dir))
    except MatError:
        return False
    return machine in {record.name for record in state.machines}


def reporting_step(steps: TrainSteps, runner: Runner) -> Callable[[Loop, int], None]:
    """The step of the experiment loop: run and record one experiment, then rewrite report.md."""
    assert runner.run_dir is not None and runner.state is not None
    run_dir, state = runner.run_dir, runner.state

    def experiment(loop: Loop, experiment_id: int) -> None:
        steps.experiment(runner, loop, experiment_id)
        with loop.lock:  # machines of one run record and report one at a time
            report.write_report(run_dir, state)

    return experiment


def complete_after_retry(fleet: Fleet) -> None:
    """A batch retried after the run's owner ended it (failed, its batches short of the total) completes the
    run when the run now holds its total: run.json and the report say so."""
    state = fleet.state
    with fleet.lock:
        if state.status == "running" or len(state.experiments) < state.max_experiments:
            return
        state.status, state.error, state.finished_at = "completed", None, now_iso()
        state.save(fleet.run_dir)
        report.write_report(fleet.run_dir, state)
    progress_log.info("run %s completed by machine batches run again", state.run_id)


def run_machine_batch(
    run_id: str,
    runs_dir: Path,
    machine: str,
    steps: TrainSteps,
    progress: TrainProgress | None = None,
    agent: Agent | None = None,
) -> dict[str, Any]:
    """One machine's batch of a multi-machine run started elsewhere (`mat train --via-deployments`): its
    experiments until the run holds its total, recorded in the shared run.json; returns what it did."""
    logged = LoggedTrainProgress(progress or NullTrainProgress())
    runner, fleet = Runner.open_batch(run_id, runs_dir, machine, agent=agent)
    runner.hooks.append(progress_hook(logged, runner))
    state = fleet.state
    experiment = reporting_step(steps, runner)

    progress_log.info(
        "run %s: machine %s takes experiments until the run holds %d", run_id, machine, state.max_experiments
    )
    run_batch(fleet, experiment)
    complete_after_retry(fleet)
    mine = [result for result in state.experiments if result.machine == machine]
    return {
        "run_id": state.run_id,
        "run_dir": str(fleet.run_dir),
        "machine": machine,
        "experiments": len(mine),
        "kept": sum(1 for result in mine if result.status == "keep"),
        "crashed": sum(1 for result in mine if result.status == "crash"),
        "machine_status": next(r.status for r in state.machines if r.name == machine),
    }


def train_stage(request: TrainRequest, steps: TrainSteps, progress: TrainProgress) -> dict[str, Any]:
    """run_training's body."""
    check_via_deployments(request)
    batches = steps.machine_batches(request)
    corpus_dir, notes = (None, []) if request.resume else prepare_corpus(request, steps, progress)
    runner, workspace = steps.setup(request, corpus_dir)
    attach_run(runner, request, progress)
    assert runner.run_dir is not None and runner.state is not None
    run_dir, state = runner.run_dir, runner.state
    experiment = reporting_step(steps, runner)

    try:
        drive(runner, workspace, request.max_experiments, experiment, batches)
    except BaseException:
        report.write_report(run_dir, state)  # the report shows how the run ended
        raise
    return run_summary(runner, steps.report(runner), notes)
