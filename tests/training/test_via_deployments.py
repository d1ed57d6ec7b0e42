"""`mat train --via-deployments` against a real Prefect server and workers: `mat deploy` registers a pool
and an experiments-on-machine deployment per machine, `mat worker start` serves them, and the run's
machine batches are flow runs under the parent train flow run (two local machines, MAT_FIXED_STEPS=3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName

from multiagenttrainer.experiments.run_state import load_run
from tests.support.prefect_runs import mat_workers
from tests.training.conftest import MAT, ROOT, mat_env, only_run_dir, results_rows, write_config

pytestmark = pytest.mark.integration
RUN_TIMEOUT_S = 600


def test_each_machine_batch_is_a_flow_run_under_the_train_flow_run(
    prefect_api: str, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 4})
    text = (
        config.read_text()
        + "machines:\n"
        + "".join(f"- name: {name}\n  execution: {{type: local}}\n" for name in ("m1", "m2"))
    )
    config.write_text(text)
    env = mat_env()
    deployed = subprocess.run(
        [*MAT, "deploy", "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    with mat_workers(env, "--config", str(config)):
        train = subprocess.run(
            [*MAT, "train", "--via-deployments", "--config", str(config), "--name", "spread"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    state = load_run(run_dir)
    assert state.status == "completed" and len(results_rows(run_dir / "results.tsv")) == 4
    assert sorted(e.experiment_id for e in state.experiments) == [0, 1, 2, 3]
    assert {e.machine for e in state.experiments[1:]} <= {"m1", "m2"}
    assert state.flow_run_id is not None
    with get_client(sync_client=True) as client:
        batches = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["experiments-on-machine"]))
        )
        mine = [f for f in batches if f.parameters.get("run_id") == state.run_id]
        assert sorted(f.name for f in mine) == [f"m1: {state.run_id}", f"m2: {state.run_id}"]
        assert all(f.state is not None and f.state.is_completed() for f in mine)
        parents = {
            client.read_task_run(f.parent_task_run_id).flow_run_id for f in mine if f.parent_task_run_id
        }
    assert parents == {state.flow_run_id}  # both under the train flow run, as its subflows
    deployment_names = {str(f.deployment_id) for f in mine}
    assert len(deployment_names) == 2  # experiments-on-machine/m1 and /m2, each on its machine's pool
