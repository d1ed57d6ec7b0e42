"""The `finetune` flow: the fine-tune stage (finetune/runner.py) with a Prefect task per target.

Targets are submitted together; an open-source target trains in a child process of its own, a
Bedrock target returns once AWS accepted it. A failing target fails its task while the others finish;
the flow then ends Failed and, when `notifications.ses` is configured, its failure hook sends one alert
naming the failed targets.

`run_finetune` is what `mat finetune start` calls: the flow runs in this process with the config the
command loaded, and the stage reports the local jobs' records to the progress display as they train.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State

from flows import loaded_config
from flows.ingest import in_process_settings
from flows.train import config_of, failure_text, flow_run_url
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import MatError, TargetsFailed
from multiagenttrainer.finetune.runner import ProgressCallback, failed_targets, start_targets
from multiagenttrainer.notify import make_notifier, notify_safely, run_failure_alert
from tasks import ProgressSlot
from tasks.finetune import run_target

PROGRESS: ProgressSlot[ProgressCallback | None] = ProgressSlot("mat_finetune_progress", lambda: None)


def default_job_name(name: str | None, config_path: str | None) -> str:
    """The name given, else the config file's stem, else "finetune"."""
    return name or (Path(config_path).stem if config_path else "finetune")


def alert_failed_targets(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Flow hook (on_failure, on_crashed): e-mail the failed targets when notifications.ses is configured."""
    parameters = flow_run.parameters or {}
    try:
        notifier = make_notifier(config_of(parameters).notifications)
    except (MatError, ValueError):
        return
    if notifier is None:
        return
    error, tail = failure_text(state)
    label = f"finetune {default_job_name(parameters.get('name'), parameters.get('config_path'))}"
    notify_safely(notifier, *run_failure_alert(label, error, tail, flow_run_url(flow_run.id)))


@flow(name="finetune", on_failure=[alert_failed_targets], on_crashed=[alert_failed_targets])
def finetune(
    config_path: str | None = None,
    corpus: str | None = None,
    name: str | None = None,
    target: str | None = None,
    config: Config | None = None,
) -> dict[str, Any]:
    """Fine-tune every target (or `target`) concurrently; returns the jobs, fails if any target failed."""
    job_name = default_job_name(name, config_path)
    cfg = config or load_config(config_path)
    records = start_targets(cfg, corpus, job_name, target, PROGRESS.current(), step=run_target)
    summary = {"name": job_name, "jobs": [record.to_dict() for record in records]}
    failures = failed_targets(records)
    if failures:
        raise TargetsFailed(summary, failures)
    return summary


def run_finetune(
    config: Config | str | Path | None = None,
    *,
    config_path: str | Path | None = None,
    corpus: str | Path | None = None,
    name: str | None = None,
    target: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Run the finetune flow here; raises TargetsFailed (with every job's record) when a target failed."""
    cfg, loaded_from = loaded_config(config)
    config_path = config_path or loaded_from
    with PROGRESS.reporting(on_progress), in_process_settings():
        summary: dict[str, Any] = finetune(
            config_path=str(config_path) if config_path is not None else None,
            corpus=str(corpus) if corpus else None,
            name=name,
            target=target,
            config=cfg,
        )
    return summary
