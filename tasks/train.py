"""Prefect steps of the train stage: set the run up, run one experiment, write the report.

The stage itself (order, failure rules, resume) is `multiagenttrainer.training.run_training`; the
`train` flow hands it these tasks as its steps (flows/train.py).
None of the tasks is cached or retried: a run directory is created once, and a crashed training run is
a recorded result, not a task failure. The Runner and its Loop are live objects (agent, executor,
run state) handed from task to task inside one flow run, so results are never persisted.

What the UI shows of an experiment: its task run is renamed `experiment-3: <the change>` as soon as
the agent has proposed it, and ends in a state named Keep or Discard (Completed), or Crash (Failed,
its message the reason), so a crashed experiment is red without failing the flow (Prefect's own line
about that Crash state comes without the empty `NoneType: None` traceback it would append). The report
artifact carries progress.png inline, so the plot is visible in the UI, not only on the worker's disk.
"""

from __future__ import annotations

import base64
import logging
import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.states import Completed, Failed

from blocks.secrets import environment_with_secrets
from multiagenttrainer import report
from multiagenttrainer.experiments.loop import Loop
from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.training import TrainRequest, open_run, report_files
from multiagenttrainer.workspace.setup import GITHUB_TOKEN_ENV, Workspace

log = logging.getLogger(__name__)

ARTIFACT_PREFIX = "mat"
MAX_TASK_RUN_NAME = 200  # a long agent description is cut to keep the UI readable
MAX_INLINE_PLOT_BYTES = 2_000_000  # a larger plot is linked by path instead of embedded
STATE_NAMES = {"keep": "Keep", "discard": "Discard", "crash": "Crash"}
TASK_RUN_LOGGER = "prefect.task_runs"


class NoEmptyTraceback(logging.Filter):
    """Drops the `NoneType: None` line that Prefect's "Task run failed with state: Crash(...)" carries (it
    logs with exc_info=True when no exception is being handled, as for a Crash state returned on purpose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[0] is None:
            record.exc_info = None
        return True


logging.getLogger(TASK_RUN_LOGGER).addFilter(NoEmptyTraceback())


def artifact_key(kind: str, run_name: str) -> str:
    """`mat-report-nightly`: Prefect artifact keys allow lowercase letters, digits and dashes only.

    Keyed on the run's name, so the runs of one name (every nightly) are versions of one artifact.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run"
    return f"{ARTIFACT_PREFIX}-{kind}-{slug}"


@task(name="setup-run", cache_policy=NO_CACHE, persist_result=False)
def setup_run(request: TrainRequest, corpus_dir: str | None) -> tuple[Runner, Workspace]:
    """A new run with its workspace set up from the corpus, or the run `request.resume` reopened."""
    runner, workspace = open_run(request, corpus_dir, environment_with_secrets([GITHUB_TOKEN_ENV]))
    runner.proposal_hooks.append(name_task_run_after_change)
    return runner, workspace


def experiment_task_run_name(experiment_id: int, description: str) -> str:
    """`experiment-3: LEARNING_RATE 3e-3 -> 6e-3`, on one line, cut to MAX_TASK_RUN_NAME."""
    name = f"experiment-{experiment_id}: {' '.join(description.split())}"
    return name if len(name) <= MAX_TASK_RUN_NAME else name[: MAX_TASK_RUN_NAME - 1] + "…"


def name_task_run_after_change(experiment_id: int, description: str) -> None:
    """Rename the running experiment task run after the change it tries (a Loop proposal hook)."""
    context = TaskRunContext.get()
    if context is None:
        return
    name = experiment_task_run_name(experiment_id, description)
    context.task_run.name = name  # the task's later state events carry the new name too
    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_name(context.task_run.id, name)
    except Exception as exc:  # a name in the UI is not worth an experiment
        log.warning("could not rename task run %s to %r: %s", context.task_run.id, name, exc)


def experiment_state(results: list[ExperimentResult], run: RunState) -> State[Any]:
    """The experiment task run's final state: Keep or Discard (Completed), Crash (Failed, with the reason)."""
    outcome = report.experiment_outcome(results)
    message = "\n".join(report.experiment_line(result, run) for result in results)
    if outcome == "crash":
        reasons = "; ".join(report.first_line(r.error) or "crashed" for r in results)
        return Failed(name=STATE_NAMES[outcome], message=reasons)
    return Completed(name=STATE_NAMES[outcome], message=message)


@task(
    name="experiment",
    task_run_name="experiment-{experiment_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def run_experiment(runner: Runner, loop: Loop, experiment_id: int) -> State[Any]:
    """Run experiment `experiment_id` on the loop's machine and record it; its outcome is the task's state."""
    results = runner.step(loop, experiment_id)
    if results:
        name_task_run_after_change(experiment_id, results[-1].description)
    return experiment_state(results, loop.state)


def experiment_results(
    state: State[Any], run: RunState, experiment_id: int, machine: str | None = None
) -> list[ExperimentResult]:
    """What experiment `experiment_id`'s task recorded in the run (on `machine`, when the run has several:
    the others record theirs meanwhile); what the task raised is raised again (a Crash is a recorded
    result, not an error)."""
    if state.name != STATE_NAMES["crash"]:
        state.result()
    return [
        result
        for result in run.experiments
        if result.experiment_id >= experiment_id and machine in (None, result.machine)
    ]


def plot_markdown(plot_path: str) -> str:
    """progress.png inline (a data: URI), so the UI shows it; its path when it is missing or huge."""
    try:
        data = Path(plot_path).read_bytes()
    except OSError:
        return f"(plot: `{plot_path}`)"
    if len(data) > MAX_INLINE_PLOT_BYTES:
        return f"(plot: `{plot_path}`, {len(data)} bytes)"
    return f"![val_bpb per experiment](data:image/png;base64,{base64.b64encode(data).decode('ascii')})"


def publish_artifacts(run_dir: Path, state: RunState, plot_path: str) -> None:
    """The report (plot inline) as a markdown artifact and the experiments as a table artifact."""
    markdown = report.render_report_markdown(state).replace(
        f"![val_bpb per experiment]({report.PLOT_FILE})",
        f"{plot_markdown(plot_path)}\n\nFiles: `{run_dir}`",
    )
    create_markdown_artifact(
        key=artifact_key("report", state.name),
        markdown=markdown,
        description=f"Report of training run {state.run_id}",
    )
    create_table_artifact(
        key=artifact_key("results", state.name),
        table=report.results_table(state),
        description=f"Experiments of training run {state.run_id}",
    )


@task(name="write-report", cache_policy=NO_CACHE, persist_result=False)
def write_report(runner: Runner) -> dict[str, str]:
    """Write report.md and progress.png, and publish them as markdown and table artifacts."""
    files = report_files(runner)
    assert runner.run_dir is not None and runner.state is not None
    publish_artifacts(runner.run_dir, runner.state, files["plot"])
    return files
