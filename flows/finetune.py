"""The `finetune` flow: every configured target (or one) fine-tuned at the same time, one task each.

Targets are submitted together on a thread pool; an open-source target trains in a child process
of its own, a Bedrock target returns once AWS accepted it. A failing target fails its task while
the others finish; the flow then ends Failed and, when `notifications.ses` is configured, sends
one alert naming the failed targets.

`run_finetune` is what `mat finetune start` calls: the flow runs in this process while job
records are read back for the progress display.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run as current_flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.ingest import in_process_settings
from flows.train import flow_run_url
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import BackendError
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.runner import (
    ProgressCallback,
    check_targets,
    chosen_targets,
    corpus_or_error,
    jobs_store,
    plan_jobs,
    watch_until,
)
from multiagenttrainer.notify import make_notifier, notify_safely, run_failure_alert
from tasks.finetune import run_target

MAX_PARALLEL_TARGETS = 32
_PLANS: dict[str, list[str]] = {}  # job name -> local job ids of the run in progress (for progress display)


def default_job_name(name: str | None, config_path: str | None) -> str:
    """The name given, else the config file's stem, else "finetune"."""
    return name or (Path(config_path).stem if config_path else "finetune")


def alert_failed_targets(cfg: Config, name: str, failures: list[str]) -> None:
    """E-mail the failed targets when notifications.ses is configured."""
    notifier = make_notifier(cfg.notifications)
    if notifier is None:
        return
    url = flow_run_url(current_flow_run.id)
    subject, body = run_failure_alert(f"finetune {name}", "; ".join(failures), "", url)
    notify_safely(notifier, subject, body)


def collect(futures: list[PrefectFuture[JobRecord]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each target's final record (as a dict) and the errors of those that failed."""
    records, failures = [], []
    for future in futures:
        try:
            records.append(future.result().to_dict())
        except BackendError as exc:
            failures.append(str(exc))
    return records, failures


@flow(name="finetune", task_runner=ThreadPoolTaskRunner(max_workers=MAX_PARALLEL_TARGETS))  # type: ignore[arg-type]
def finetune(
    config_path: str | None = None,
    corpus: str | None = None,
    name: str | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """Fine-tune every target (or `target`) concurrently; returns the jobs, fails if any target failed."""
    cfg = load_config(config_path)
    targets = chosen_targets(cfg, target)
    check_targets(targets)
    corpus_path = corpus_or_error(cfg, corpus)
    job_name = default_job_name(name, config_path)
    store = jobs_store(cfg)
    planned = plan_jobs(targets, job_name)
    _PLANS[job_name] = [job.job_id for job in planned if job.job_id]
    futures = [run_target.submit(job, str(corpus_path), job_name, str(store.jobs_dir)) for job in planned]
    records, failures = collect(futures)
    if failures:
        alert_failed_targets(cfg, job_name, failures)
        raise BackendError("; ".join(failures))
    return {"name": job_name, "jobs": records}


def run_finetune(
    config_path: str | Path | None = None,
    corpus: str | Path | None = None,
    name: str | None = None,
    target: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Run the finetune flow here, calling on_progress with the local jobs' records while they train."""
    config = str(config_path) if config_path is not None else None
    job_name = default_job_name(name, config)
    store = jobs_store(load_config(config_path))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            with in_process_settings():
                outcome["summary"] = finetune(
                    config_path=config, corpus=str(corpus) if corpus else None, name=job_name, target=target
                )
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="mat-finetune-flow", daemon=True)
    worker.start()
    watch_until(lambda: not worker.is_alive(), store, ids_of(job_name), on_progress)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    summary: dict[str, Any] = outcome["summary"]
    return summary


def ids_of(job_name: str) -> Callable[[], list[str]]:
    """The local job ids planned for this job name (empty until the flow has planned them)."""
    return lambda: list(_PLANS.get(job_name, []))
