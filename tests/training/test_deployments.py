"""The train and nightly deployments of prefect.yaml, registered against the session's Prefect server, and the
nightly flow itself, run in this process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.schedules import CronSchedule

from deployments.register import register_deployments
from tests.training.conftest import FIXED_STEPS, write_config

pytestmark = pytest.mark.integration

PROJECT_DIR = Path(__file__).resolve().parents[2]


def test_prefect_yaml_schedules_nightly_at_two_utc() -> None:
    document = yaml.safe_load((PROJECT_DIR / "prefect.yaml").read_text())
    specs = {d["name"]: d for d in document["deployments"]}
    assert specs["train"]["entrypoint"] == "flows/train.py:train"
    assert set(specs["train"]["parameters"]) == {
        "config_path", "name", "max_experiments", "output_dir", "repos", "resume", "corpus_dir",
    }  # fmt: skip
    assert specs["nightly"]["entrypoint"] == "flows/nightly.py:nightly"
    assert specs["nightly"]["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC", "active": True}]
    assert {specs[name]["work_pool"]["name"] for name in ("train", "nightly")} == {"mat-local"}


@pytest.fixture
def private_pool() -> Iterator[str]:
    """A work pool no worker polls, so the nightly schedule's runs are never picked up during the tests."""
    name = f"mat-training-test-{uuid.uuid4().hex[:6]}"
    yield name
    with get_client(sync_client=True) as client:
        client.delete_work_pool(name)


def test_every_deployment_registers_and_nightly_runs_at_two_utc(prefect_api: str, private_pool: str) -> None:
    names = register_deployments(PROJECT_DIR, work_pool=private_pool)
    assert names == [
        "ingest/ingest",
        "train/train",
        "experiments-on-machine/experiments-on-machine",
        "finetune/finetune",
        "request/request",
        "nightly/nightly",
    ]

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("nightly/nightly")
        train = client.read_deployment_by_name("train/train")
        try:
            assert nightly.work_pool_name == private_pool and train.work_pool_name == private_pool
            assert (
                nightly.entrypoint == "flows/nightly.py:nightly"
                and train.entrypoint == "flows/train.py:train"
            )
            assert nightly.parameters == {"config_path": "configs/quickstart.yaml", "max_experiments": None}
            assert train.parameters["config_path"] == "configs/quickstart.yaml"
            assert train.schedules == []
            (schedule,) = nightly.schedules
            assert isinstance(schedule.schedule, CronSchedule)
            assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == (
                "0 2 * * *",
                "UTC",
                True,
            )
        finally:  # the schedule is the point, not its runs: stop it and drop what it queued
            for deployment_schedule in nightly.schedules:
                client.update_deployment_schedule(nightly.id, deployment_schedule.id, active=False)
            queued = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[nightly.id]))
            )
            for flow_run in queued:
                client.delete_flow_run(flow_run.id)


def test_the_nightly_flow_trains_a_run_named_nightly(
    prefect_api: str, tiny_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.nightly import nightly

    monkeypatch.setenv("MAT_FIXED_STEPS", FIXED_STEPS)
    config = write_config(tmp_path, tiny_source)
    summary = nightly(str(config), max_experiments=1)

    assert summary["status"] == "completed" and summary["experiments"] == 1
    assert Path(summary["run_dir"]).parent == tmp_path / "runs" and summary["run_id"].endswith("-nightly")
    assert (tmp_path / "corpus" / "corpus.jsonl").is_file()
    with get_client(sync_client=True) as client:
        train_run = client.read_flow_run(UUID(summary["flow_run_url"].rsplit("/", 1)[-1]))
        assert train_run.name == "nightly" and train_run.parent_task_run_id is not None
        parent = client.read_task_run(train_run.parent_task_run_id)
        assert parent.flow_run_id is not None
        assert (
            client.read_flow_run(parent.flow_run_id).flow_id != train_run.flow_id
        )  # run by the nightly flow
