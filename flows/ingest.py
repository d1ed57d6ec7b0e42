"""The `ingest` flow: the ingest stage (multiagenttrainer/ingest.py) with Prefect tasks as its steps.

A source that fails is reported by name and left out; the corpus is built from the others and the
flow then fails with IngestIncomplete, so the run is red in the UI and `mat ingest` exits 1.
Re-running on unchanged sources fetches nothing: fetch and corpus tasks are cached (tasks/ingest.py).
The summary it returns is persisted as JSON in the shared result storage (`mat ingest --deployment`
prints it from there).

`run_ingest` is what the CLI calls: it runs the flow in this process with the config it already
loaded and delivers live progress events to the caller's progress object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows import loaded_config
from multiagenttrainer import ingest as stage
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.progress import IngestProgress
from tasks.ingest import PROGRESS, PrefectSteps


@flow(name="ingest", persist_result=True, result_serializer="json")
def ingest(
    config_path: str | None = None,
    repos: list[str] | None = None,
    corpus_dir: str | None = None,
    config: Config | None = None,
) -> dict[str, Any]:
    """Fetch every configured source (plus --repo ones) and build the corpus; summary of what happened.

    `config` is the already-loaded config when the flow runs in-process; deployments pass `config_path`.
    """
    plan = stage.plan_ingest(config or load_config(config_path), repos or [], corpus_dir)
    return stage.run_ingest(plan, PrefectSteps(), PROGRESS.current())


@contextmanager
def in_process_settings() -> Iterator[None]:
    """Prefect settings for a short run inside the CLI process.

    Flow heartbeats are off: they only help a server notice a crashed worker-launched run, and
    stopping the heartbeat thread costs up to a second at the end of every run.
    """
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def run_ingest(
    config: Config | str | Path | None = None,
    repos: Sequence[str] = (),
    corpus_dir: str | Path | None = None,
    progress: IngestProgress | None = None,
) -> dict[str, Any]:
    """Run the ingest flow here with live progress; raises IngestIncomplete or ConfigError."""
    cfg, config_path = loaded_config(config)
    with PROGRESS.reporting(progress), in_process_settings():
        summary: dict[str, Any] = ingest(
            config_path=config_path,
            repos=list(repos) or None,
            corpus_dir=str(corpus_dir) if corpus_dir is not None else None,
            config=cfg,
        )
    return summary
