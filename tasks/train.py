"""Prefect tasks for a training run: set the run up, run one experiment, write the report.

Thin wrappers over `multiagenttrainer.experiments.runner.Runner` and `multiagenttrainer.report`.
None of them is cached or retried: a run directory is created once, and a crashed training run is
a recorded result, not a task failure. The Runner and its Loop are live objects (agent, executor,
run state) handed from task to task inside one flow run, so results are never persisted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from blocks.secrets import environment_with_secrets
from multiagenttrainer import report
from multiagenttrainer.config import AutoresearchConfig, GithubConfig, TrainingConfig
from multiagenttrainer.experiments.loop import Loop
from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.workspace.setup import GITHUB_TOKEN_ENV, Workspace

ARTIFACT_PREFIX = "mat"


@dataclass(frozen=True)
class RunRequest:
    """What `setup_run` needs: a new run (config sections, name, corpus) or the id of one to resume."""

    autoresearch: AutoresearchConfig
    training: TrainingConfig
    name: str
    output_dir: Path
    corpus_path: str | None = None
    resume: str | None = None
    github: GithubConfig = field(default_factory=GithubConfig)


def artifact_key(kind: str, run_name: str) -> str:
    """`mat-report-nightly`: Prefect artifact keys allow lowercase letters, digits and dashes only.

    Keyed on the run's name, so the runs of one name (every nightly) are versions of one artifact.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run"
    return f"{ARTIFACT_PREFIX}-{kind}-{slug}"


@task(name="setup-run", cache_policy=NO_CACHE, persist_result=False)
def setup_run(request: RunRequest) -> tuple[Runner, Workspace]:
    """A new run with its workspace set up from the corpus, or the run `request.resume` reopened."""
    if request.resume:
        return Runner.resume(request.resume, request.output_dir)
    runner = Runner(
        request.autoresearch,
        request.training,
        request.name,
        output_dir=request.output_dir,
        github=request.github,
        secrets=environment_with_secrets([GITHUB_TOKEN_ENV]),  # a private autoresearch fork
    )
    return runner, runner.setup_workspace(str(request.corpus_path))


@task(
    name="experiment",
    task_run_name="experiment-{experiment_id}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def run_experiment(runner: Runner, loop: Loop, experiment_id: int) -> list[dict[str, Any]]:
    """Run the run's next experiment (`experiment_id`), record it and rewrite report.md and progress.png."""
    results = runner.step(loop)
    report.write_report(loop.run_dir, loop.state)
    return [result.to_dict() for result in results]


@task(name="write-report", cache_policy=NO_CACHE, persist_result=False)
def write_report(run_dir: Path, state: RunState) -> dict[str, str]:
    """Write report.md and progress.png, and publish them as markdown and table artifacts."""
    report_path, plot_path = report.write_report(run_dir, state)
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
    return {"report": str(report_path), "plot": str(plot_path)}
