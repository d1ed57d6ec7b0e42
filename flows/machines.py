"""`mat train --via-deployments`: each machine's batch as a flow run of `experiments-on-machine/<machine>`.

The parent `train` flow run sets the run up and runs the baseline; then, instead of a thread per machine,
it starts one flow run per active machine (`experiments-on-machine/<machine>`, in the machine's work pool
`mat-<machine>`, served by `mat worker start`) as its subflows, so the UI shows them under the parent and a
failed batch can be retried from there. Each child runs `Runner.open_batch` + `run_batch` on the same run
directory: the run's state is shared through run.json under a file lock (experiments/run_state.RunLock).
The parent waits for every child, then ends the run from what run.json holds.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment

from multiagenttrainer.errors import ConfigError
from multiagenttrainer.experiments.fleet import Batches, Fleet, Step

log = logging.getLogger("multiagenttrainer.training")

DEPLOYMENT = "experiments-on-machine"
POLL_S = 2.0


def deployment_for(machine: str) -> str:
    """`experiments-on-machine/<machine>`: the deployment `mat deploy` registers on the machine's pool."""
    return f"{DEPLOYMENT}/{machine}"


def batch_parameters(fleet: Fleet, machine: str, config_path: str) -> dict[str, Any]:
    return {
        "run_id": fleet.state.run_id,
        "machine": machine,
        "output_dir": str(fleet.run_dir.parent),
        "config_path": config_path,
    }


def run_batch_deployment(fleet: Fleet, machine: str, config_path: str) -> FlowRun:
    """Start the machine's batch as a subflow run of the current flow run and wait for it to end."""
    flow_run = run_deployment(
        deployment_for(machine),
        parameters=batch_parameters(fleet, machine, config_path),
        flow_run_name=f"{machine}: {fleet.state.run_id}",
        as_subflow=True,
        timeout=None,
        poll_interval=POLL_S,
    )
    return cast(FlowRun, flow_run)  # the sync dispatch: called from a worker thread, not a coroutine


def check_deployments(machines: list[str]) -> None:
    """Every machine's deployment is registered; else a ConfigError naming `mat deploy`."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for machine in machines:
            try:
                client.read_deployment_by_name(deployment_for(machine))
            except ObjectNotFound:
                raise ConfigError(
                    f"machines: no deployment {deployment_for(machine)} on the Prefect server; register the "
                    "deployments with `mat deploy --config FILE` and start workers with `mat worker start`"
                ) from None


def batches_via_deployments(config_path: str, machines: list[str]) -> Batches:
    """A `Batches` for run_fleet_experiments that runs every active machine's batch as a flow run
    (the machines' deployments are checked first)."""
    check_deployments(machines)

    def run(fleet: Fleet, step: Step) -> None:
        machines = [loop.machine for loop in fleet.active()]
        with ThreadPoolExecutor(max_workers=len(machines), thread_name_prefix="mat-batch") as pool:
            futures = {
                machine: pool.submit(
                    contextvars.copy_context().run, run_batch_deployment, fleet, machine, config_path
                )
                for machine in machines
            }
            for machine, future in futures.items():
                flow_run = future.result()
                state = flow_run.state.name if flow_run.state else "unknown"
                if flow_run.state is None or not flow_run.state.is_completed():
                    log.warning(
                        "the batch of machine %s ended %s (flow run %s); retry it from the UI, or resume",
                        machine,
                        state,
                        flow_run.name,
                    )

    return run
