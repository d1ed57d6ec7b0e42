"""The `nightly` flow: re-ingest every source and run a training run named "nightly".

prefect.yaml schedules it at 02:00 UTC. Ingest is cached on each source's resolved commit, so a
night with no new commits fetches nothing and reuses the corpus; the run itself is always new.
Alerts come from the `train` subflow's hooks (notifications.ses).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.train import train

NIGHTLY_RUN_NAME = "nightly"


@flow(name="nightly")
def nightly(config_path: str | None = None, max_experiments: int | None = None) -> dict[str, Any]:
    """Re-ingest (cached when unchanged) and train a run named "nightly"; returns the run's summary."""
    summary: dict[str, Any] = train(
        config_path=config_path, name=NIGHTLY_RUN_NAME, max_experiments=max_experiments
    )
    return summary
