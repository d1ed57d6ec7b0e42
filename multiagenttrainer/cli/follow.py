"""`mat ingest --deployment` and `mat train --deployment`: a flow run of the deployment, run by a worker of
its work pool, followed in this terminal as if it ran here.

The command submits the run (`run_deployment(..., timeout=0)`), says where it can be watched, then
polls the flow run's state and logs through the API:
- mat's progress lines (logger `multiagenttrainer.progress`) are printed as the in-process command
  prints them; warnings and errors of mat's loggers as `warning:` and `error:` lines;
- the exit code is the in-process one: 0 completed, 1 failed or crashed, 2 when the flow failed on a
  configuration error, 130 when the run was cancelled or left running after Ctrl-C.

Ctrl-C asks, on a terminal, whether to cancel the flow run or leave it running; without a terminal the
run is left running and the command that cancels it is printed.

Imported only by the commands that use it, after Prefect was pointed at the server.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
from prefect.client.schemas.objects import FlowRun, Log, StateType
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.states import Cancelling
from prefect.utilities.urls import url_for
from rich.console import Console

from multiagenttrainer import errors
from multiagenttrainer.cli.common import err, warn
from multiagenttrainer.errors import MatError, ServerError
from multiagenttrainer.progress import PROGRESS_LOGGER

POLL_S = 1.0
LOG_PAGE = 200
LOG_OVERLAP_S = 10.0  # logs reach the API in batches, not always in order: re-read this far back
DRAIN_S = 3.0  # after the run ends, how long its last log batches get to arrive
CANCEL_WAIT_S = 60.0
EXCEPTION_PREFIX = "Flow run encountered an exception: "
INTERRUPTED = 130
LibraryLogs = Callable[[Log], None]


# --------------------------------------------------------------------------- submitting


def submit(deployment: str, parameters: dict[str, Any]) -> FlowRun:
    """A new flow run of `deployment` (flow/name) with `parameters`, scheduled now; it is not waited for."""
    try:
        flow_run: FlowRun = run_deployment(deployment, parameters=parameters, timeout=0)  # type: ignore[assignment]
    except ObjectNotFound:
        raise ServerError(
            f"there is no deployment {deployment} on the Prefect server: register mat's deployments with "
            "`mat deploy` (and start its workers with `mat worker start`), then run the command again"
        ) from None
    except PrefectHTTPStatusError as exc:
        raise ServerError(f"the Prefect server refused a run of {deployment}: {exc.response.text}") from None
    return flow_run


def pull_directory(client: SyncPrefectClient, deployment_id: UUID | None) -> str | None:
    """The directory a deployment's flow runs change into (its set_working_directory step), if any."""
    if deployment_id is None:
        return None
    steps = client.read_deployment(deployment_id).pull_steps or []
    for step in steps:
        for name, arguments in step.items():
            if name.endswith("set_working_directory") and isinstance(arguments, dict):
                return str(arguments.get("directory"))
    return None


def pool_has_worker(client: SyncPrefectClient, pool: str | None) -> bool:
    """Whether a worker has polled `pool` lately (its status is online)."""
    if pool is None:
        return True
    try:
        workers = client.read_workers_for_work_pool(pool)
    except ObjectNotFound:
        return False
    return any(str(worker.status).upper().endswith("ONLINE") for worker in workers)


def announce(client: SyncPrefectClient, flow_run: FlowRun) -> None:
    """Where the run is, and what would keep it from starting or make it behave unlike a local run."""
    err.print(
        f"flow run {flow_run.name} ({flow_run.id}) submitted to work pool {flow_run.work_pool_name}: "
        f"{url_for('flow-run', obj_id=str(flow_run.id))}",
        markup=False,
    )
    if not pool_has_worker(client, flow_run.work_pool_name):
        warn(
            f"no worker polls work pool {flow_run.work_pool_name}; the run waits until one does: "
            "start them with `mat worker start`"
        )
    directory = pull_directory(client, flow_run.deployment_id)
    if directory and Path(directory).resolve() != Path.cwd().resolve():
        warn(f"the flow run works in {directory}: relative paths in its config resolve there", "note")


# --------------------------------------------------------------------------- following


class LogReader:
    """The flow run's logs not read yet, oldest first (batches may arrive late and out of order)."""

    def __init__(self, client: SyncPrefectClient, flow_run_id: UUID) -> None:
        self.client = client
        self.flow_run_id = flow_run_id
        self.seen: set[UUID] = set()
        self.latest: Any = None

    def fresh(self) -> list[Log]:
        since = self.latest - timedelta(seconds=LOG_OVERLAP_S) if self.latest is not None else None
        log_filter = LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[self.flow_run_id]),
            timestamp=LogFilterTimestamp(after_=since) if since is not None else None,
        )
        logs: list[Log] = []
        while True:
            page = self.client.read_logs(
                log_filter, limit=LOG_PAGE, offset=len(logs), sort=LogSort.TIMESTAMP_ASC
            )
            logs += page
            if len(page) < LOG_PAGE:
                break
        new = [log for log in logs if log.id not in self.seen]
        self.seen.update(log.id for log in new)
        if new:
            self.latest = max(log.timestamp for log in new)
        return sorted(new, key=lambda log: log.timestamp)


def progress_printer(console: Console) -> LibraryLogs:
    """Print mat's progress lines on `console` and mat's warnings and errors as labelled lines."""

    def show(log: Log) -> None:
        name = log.name or ""
        if not name.startswith("multiagenttrainer"):
            return  # Prefect's own lines are in the UI; the in-process command does not print them either
        if log.level >= logging.ERROR:
            warn(log.message, "error", "red")
        elif log.level >= logging.WARNING:
            warn(log.message)
        elif name == PROGRESS_LOGGER:
            console.print(log.message, markup=False, highlight=False)

    return show


def follow(client: SyncPrefectClient, flow_run_id: UUID, show: LibraryLogs) -> FlowRun:
    """Print the run's logs as they come until it ends; the ended flow run."""
    reader = LogReader(client, flow_run_id)
    while True:
        flow_run = client.read_flow_run(flow_run_id)
        for log in reader.fresh():
            show(log)
        if flow_run.state is not None and flow_run.state.is_final():
            break
        time.sleep(POLL_S)
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:  # the flow process sends its last batch as it exits
        time.sleep(POLL_S)
        for log in reader.fresh():
            show(log)
    return flow_run


# --------------------------------------------------------------------------- outcome


def error_of(flow_run: FlowRun) -> tuple[str, int]:
    """(message, exit code) of a flow run that did not complete."""
    state = flow_run.state
    message = (state.message if state else None) or "no message"
    if state is not None and state.type == StateType.CRASHED:
        return f"flow run {flow_run.name} crashed: {message}", 1
    detail = message.removeprefix(EXCEPTION_PREFIX)
    kind, _, text = detail.partition(": ")
    error_class = getattr(errors, kind, None)
    if isinstance(error_class, type) and issubclass(error_class, MatError):
        return text or detail, error_class.exit_code
    outcome = (state.name if state and state.name else "failed").lower()
    return f"flow run {flow_run.name} {outcome}: {detail}", 1


def result_of(flow_run: FlowRun) -> Any:
    """The completed flow run's return value from the shared result storage, or None when unreadable."""
    try:
        return flow_run.state.result(raise_on_failure=False) if flow_run.state else None
    except Exception:  # stored on another machine's disk, or with another serializer
        return None


# --------------------------------------------------------------------------- Ctrl-C


def ask_to_cancel() -> bool:
    """On a terminal: whether the user wants the flow run cancelled (a second Ctrl-C: leave it)."""
    if not sys.stdin.isatty():
        return False
    try:
        answer = err.input("Cancel the flow run (c) or leave it running (l)? [c/l] ")
    except (KeyboardInterrupt, EOFError):
        return False
    return answer.strip().lower().startswith("c")


def cancel(client: SyncPrefectClient, flow_run_id: UUID, show: LibraryLogs) -> FlowRun:
    """Ask the server to cancel the flow run and follow it until it is cancelled (or CANCEL_WAIT_S)."""
    client.set_flow_run_state(flow_run_id, Cancelling(message="cancelled from mat (Ctrl-C)"), force=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    reader = LogReader(client, flow_run_id)
    reader.seen.update(log.id for log in reader.fresh())  # already printed before Ctrl-C
    while time.monotonic() < deadline:
        flow_run = client.read_flow_run(flow_run_id)
        for log in reader.fresh():
            show(log)
        if flow_run.state is not None and flow_run.state.is_final():
            return flow_run
        time.sleep(POLL_S)
    return client.read_flow_run(flow_run_id)


def interrupted(client: SyncPrefectClient, flow_run_id: UUID, show: LibraryLogs) -> int:
    """What Ctrl-C does: cancel the flow run or leave it running, as the user says; exit code 130."""
    if ask_to_cancel():
        flow_run = cancel(client, flow_run_id, show)
        state = flow_run.state.name if flow_run.state else "unknown"
        err.print(f"flow run {flow_run.name}: {state}", markup=False)
        return INTERRUPTED
    err.print(
        f"left running: flow run {flow_run_id} ({url_for('flow-run', obj_id=str(flow_run_id))}); "
        f"cancel it with `prefect flow-run cancel {flow_run_id}`",
        markup=False,
    )
    return INTERRUPTED


@contextmanager
def default_sigint() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt here even when mat was started with SIGINT ignored."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- the command


def run_and_follow(
    deployment: str, parameters: dict[str, Any], console: Console
) -> tuple[FlowRun | None, int]:
    """Submit a run of `deployment` and follow it; (the ended flow run, or None after Ctrl-C; exit code).

    Raises MatError when the run could not be submitted; a run that fails is reported, not raised.
    """
    try:
        flow_run = submit(deployment, parameters)
    except httpx.HTTPError as exc:
        raise ServerError(f"the Prefect server did not take the run of {deployment}: {exc}") from None
    show = progress_printer(console)
    with get_client(sync_client=True) as client, default_sigint():
        try:
            announce(client, flow_run)
            ended = follow(client, flow_run.id, show)
        except KeyboardInterrupt:
            return None, interrupted(client, flow_run.id, show)
        except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
            raise ServerError(
                f"lost the Prefect server while following flow run {flow_run.id} ({exc}); the run may go on: "
                f"see {url_for('flow-run', obj_id=str(flow_run.id))}"
            ) from None
    if ended.state is not None and ended.state.is_completed():
        return ended, 0
    message, code = error_of(ended)
    if ended.state is not None and ended.state.type == StateType.CANCELLED:
        code = INTERRUPTED
    warn(message, "error", "red")
    return ended, code
