"""Prefect deployments, workers and flow runs for the tests that go through a work pool.

`mat worker start` and `mat worker stop` are run for real (in the test session's MAT_HOME, against the
session's Prefect server); flow runs are read back through the Prefect API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import FlowRun, TaskRun

ROOT = Path(__file__).resolve().parents[2]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
WORKER_TIMEOUT_S = 180
RUN_TIMEOUT_S = 300


def run_mat(
    *args: str, env: Mapping[str, str], timeout: float = WORKER_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`mat ARGS` from the repository root, to completion."""
    return subprocess.run(
        [*MAT, *args], cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def worker_pids(mat_home: Path) -> list[int]:
    """Live `prefect worker start` processes of this MAT_HOME (read from their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = f"MAT_HOME={mat_home}".encode() in environ
        if ours and b"worker" in cmdline and b"start" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@contextmanager
def mat_workers(env: Mapping[str, str], *args: str) -> Iterator[subprocess.CompletedProcess[str]]:
    """`mat worker start ARGS` for the block, `mat worker stop` after it; yields the start's result."""
    started = run_mat("worker", "start", *args, env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield started
    finally:
        stopped = run_mat("worker", "stop", env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert worker_pids(Path(env["MAT_HOME"])) == []


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `predicate` every 0.2 s until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def read_flow_run(flow_run_id: UUID | str) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(str(flow_run_id)))


def wait_for_flow_run(flow_run_id: UUID | str, states: set[str], timeout_s: float = RUN_TIMEOUT_S) -> FlowRun:
    """Poll the flow run until its state type is one of `states` (e.g. {"COMPLETED"})."""
    deadline = time.monotonic() + timeout_s
    while True:
        flow_run = read_flow_run(flow_run_id)
        if flow_run.state is not None and flow_run.state.type.value in states:
            return flow_run
        if time.monotonic() > deadline:
            state = flow_run.state.type.value if flow_run.state else None
            raise AssertionError(f"flow run {flow_run_id} is {state} after {timeout_s} s, not {states}")
        time.sleep(0.5)


def wait_until_worker_done(flow_run_id: UUID | str, timeout_s: float = 120) -> None:
    """Wait for the worker's `prefect.worker.executed-flow-run` event of a flow run: the worker has reaped
    its process and said how it ended (a retry before that may be overwritten by a late crash report)."""
    resource = f"prefect.flow-run.{flow_run_id}"
    event_filter = {
        "event": {"name": ["prefect.worker.executed-flow-run"]},
        "any_resource": {"id": [resource]},
    }
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if client._client.post("/events/filter", json={"filter": event_filter, "limit": 1}).json()[
                "total"
            ]:
                return
            time.sleep(0.5)
    raise AssertionError(f"the worker did not finish with flow run {flow_run_id} within {timeout_s} s")


def task_runs_of(flow_run_id: UUID | str) -> list[TaskRun]:
    """The flow run's task runs in the order they started."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))]))
        )
    return sorted(runs, key=lambda run: run.expected_start_time or run.created)  # type: ignore[arg-type, return-value]


def pause_schedules(deployment_name: str) -> None:
    """Switch a deployment's schedules off and delete the runs they queued (the tests run no cron)."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(deployment_name)
        for schedule in deployment.schedules:
            client.update_deployment_schedule(deployment.id, schedule.id, active=False)
        queued = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        )
        for flow_run in queued:
            if flow_run.state is not None and flow_run.state.type.value == "SCHEDULED":
                client.delete_flow_run(flow_run.id)


def session_env(**extra: str) -> dict[str, str]:
    """The environment of a `mat` subprocess in the test session (its server, its MAT_HOME)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1", **extra}
