"""Prefect steps of the train stage: set the run up, run one experiment, write the report.

The stage itself (order, failure rules, resume) is `multiagenttrainer.training.run_training`; the
`train` flow hands it these tasks as its steps (flows/train.py).
None of the tasks is cached or retried: a run directory is created once, and a crashed training run is
a recorded result, not a task failure. The Runner and its Loop are live objects (agent, executor,
run state) handed from task to task inside one flow run, so results are never persisted.
"""

from __future__ import annotations

import re
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from blocks.secrets import environment_with_secrets
from multiagenttrainer import report
from multiagenttrainer.experiments.loop import Loop
from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.training import TrainRequest, open_run, report_files
from multiagenttrainer.workspace.setup import GITHUB_TOKEN_ENV, Workspace

ARTIFACT_PREFIX = "mat"


def artifact_key(kind: str, run_name: str) -> str:
    """`mat-report-nightly`: Prefect artifact keys allow lowercase letters, digits and dashes only.

    Keyed on the run's name, so the runs of one name (every nightly) are versions of one artifact.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run"
    return f"{ARTIFACT_PREFIX}-{kind}-{slug}"


@task(name="setup-run", cache_policy=NO_CACHE, persist_result=False)
def setup_run(request: TrainRequest, corpus_dir: str | None) -> tuple[Runner, Workspace]:
    """A new run with its workspace set up from the corpus, or the run `request.resume` reopened."""
    return open_run(request, corpus_dir, environment_with_secrets([GITHUB_TOKEN_ENV]))


@task(
    name="experiment",
    task_run_name="experiment-{experiment_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def run_experiment(runner: Runner, loop: Loop, experiment_id: int) -> list[ExperimentResult]:
    """Run experiment `experiment_id` (on the loop's machine) and record it."""
    return runner.step(loop, experiment_id)


def publish_artifacts(run_dir: Path, state: RunState, plot_path: str) -> None:
    """The report as a markdown artifact and the experiments as a table artifact."""
    markdown = report.render_report_markdown(state).replace(
        f"![val_bpb per experiment]({report.PLOT_FILE})", f"Files: `{run_dir}` (plot: `{plot_path}`)"
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
