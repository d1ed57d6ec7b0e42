"""The `request` flow: the request stage (multiagenttrainer/request/stage.py) with Prefect tasks as steps.

Each agent's turn is a task run named after it (`task-agent`, `data-agent`, `task-agent-review`,
`model-agent`, `server-agent`); the request's sources are ingested by the `ingest` subflow (cached
like any ingest). A refused request ends the flow Failed with RequestRefused (exit code 3 in the CLI);
a failed or crashed one sends an SES alert when `notifications.ses` is configured.

`run_request_flow` is what `mat request run` calls: the flow runs in this process with the config
the command loaded and the request it validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import flow_run as current_flow_run

from flows import loaded_config
from flows.ingest import in_process_settings, ingest
from flows.train import config_of, failure_text, flow_run_url
from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import MatError, RequestRefused
from multiagenttrainer.notify import make_notifier, notify_safely, run_failure_alert
from multiagenttrainer.request.data import CORPUS_DIR, DataReport
from multiagenttrainer.request.model import ModelReport
from multiagenttrainer.request.plan import Plan
from multiagenttrainer.request.schema import load_request
from multiagenttrainer.request.stage import RequestRun, ingest_config, new_request, run_request
from tasks import request as agents


class PrefectRequestSteps:
    """The request stage's steps as Prefect tasks, with ingest as the `ingest` subflow."""

    def plan(self, run: RequestRun) -> Plan:
        return agents.task_agent(run)

    def ingest(self, run: RequestRun, plan: Plan) -> dict[str, Any]:
        summary: dict[str, Any] = ingest(
            corpus_dir=str(run.folder / CORPUS_DIR), config=ingest_config(run, plan)
        )
        return summary

    def data(self, run: RequestRun, plan: Plan, summary: dict[str, Any]) -> DataReport:
        return agents.data_agent(run, plan, summary)

    def review(self, run: RequestRun, plan: Plan, data: DataReport) -> Plan:
        return agents.task_agent_review(run, plan, data)

    def model(self, run: RequestRun, plan: Plan, data: DataReport) -> ModelReport:
        return agents.model_agent(run, plan, data)

    def serve(self, run: RequestRun, plan: Plan, data: DataReport, model: ModelReport) -> dict[str, Any]:
        return agents.server_agent(run, plan, data, model)


def alert_request_failure(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Flow hook (on_failure, on_crashed): e-mail a failed request (not a refused one) when SES is set."""
    parameters = flow_run.parameters or {}
    try:
        notifier = make_notifier(config_of(parameters).notifications)
    except (MatError, ValueError):
        return
    error, tail = failure_text(state)
    if notifier is None or error.startswith("request ") and " refused: " in error:
        return
    label = f"request {parameters.get('name') or parameters.get('request_file') or 'from text'}"
    notify_safely(notifier, *run_failure_alert(label, error, tail, flow_run_url(flow_run.id)))


def request_run_name() -> str:
    """The flow run's name in the UI: the request's name, its file's name, or `from-text`."""
    parameters = current_flow_run.parameters
    given = parameters.get("name") or (
        Path(parameters["request_file"]).stem if parameters.get("request_file") else None
    )
    return given or "from-text"


@flow(
    name="request",
    flow_run_name=request_run_name,
    on_failure=[alert_request_failure],
    on_crashed=[alert_request_failure],
)
def request(
    config_path: str | None = None,
    request_file: str | None = None,
    text: str | None = None,
    name: str | None = None,
    repos: list[str] | None = None,
    output_dir: str | None = None,
    serve_after: bool = True,
    request_id: str | None = None,
    config: Config | None = None,
) -> dict[str, Any]:
    """Plan, fetch, train and serve the model the request describes; returns the request's summary.

    `config` is the already-loaded config when the flow runs in-process; deployments pass `config_path`.
    """
    cfg = config or load_config(config_path)
    spec = load_request(Path(request_file)) if request_file else None
    run = new_request(
        cfg,
        spec=spec,
        text=text,
        name=name,
        request_file=request_file,
        repos=tuple(repos or ()),
        output_dir=output_dir,
        serve_after=serve_after,
        request_id=request_id,
    )
    return run_request(run, PrefectRequestSteps(), str(current_flow_run.id))


def run_request_flow(
    config: Config | str | Path | None = None,
    *,
    config_path: str | Path | None = None,
    request_file: str | Path | None = None,
    text: str | None = None,
    name: str | None = None,
    repos: tuple[str, ...] = (),
    output_dir: str | Path | None = None,
    serve_after: bool = True,
    request_id: str | None = None,
) -> dict[str, Any]:
    """Run the request flow here; raises RequestRefused (exit 3) or another MatError."""
    cfg, loaded_from = loaded_config(config)
    config_path = config_path or loaded_from
    with in_process_settings():
        summary: dict[str, Any] = request(
            config_path=str(config_path) if config_path is not None else None,
            request_file=str(request_file) if request_file is not None else None,
            text=text,
            name=name,
            repos=list(repos) or None,
            output_dir=str(output_dir) if output_dir is not None else None,
            serve_after=serve_after,
            request_id=request_id,
            config=cfg,
        )
    return summary


__all__ = ["RequestRefused", "request", "run_request_flow"]
