"""The request stage, written once: Task agent -> ingest -> Data agent -> Task agent review -> Model agent
-> Server agent.

    run = new_request(cfg, spec=load_request(Path("request.yaml")))
    summary = run_request(run)                          # plain calls (PlainRequestSteps)
    summary = run_request(run, PrefectRequestSteps())   # flows/request.py: each agent a task run

The rules live here:
- the Task agent plans first; a refused plan ends the request (RequestRefused, exit code 3) with
  plan.md saying why, before any data is fetched or model loaded;
- the request's sources are ingested into `<request>/corpus`; sources that fail are noted and left out,
  and without any corpus the request fails (exit 1);
- the Data agent builds the training set; the Task agent reviews it (data, licenses, budget) and may
  still refuse;
- the Model agent's trials and final training, then the Server agent's endpoint, timing and reports;
- request.json says which agent has the request and how it ended; a request that fails or is
  interrupted after its server started stops that server.

`RequestSteps` is what a caller swaps: the plain steps here, or Prefect tasks (flows/request.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import Config, SourceConfig
from multiagenttrainer.errors import ConfigError, IngestIncomplete, MatError, RequestRefused
from multiagenttrainer.request import planner, serving
from multiagenttrainer.request.data import (
    CORPUS_DIR,
    DataReport,
    prepare_data,
    request_sources,
    source_tokens,
)
from multiagenttrainer.request.model import ModelReport, run_model_agent
from multiagenttrainer.request.plan import Plan, write_plan
from multiagenttrainer.request.planner_llm import request_from_text
from multiagenttrainer.request.report import Outcome, judge, write_reports
from multiagenttrainer.request.schema import RequestSpec
from multiagenttrainer.request.store import RequestState, Stage, new_request_id, read_state, requests_root
from multiagenttrainer.sources.registry import unique_names

REQUEST_YAML = "request.yaml"
PROMPTS_KEPT = 20


@dataclass(frozen=True)
class RequestRun:
    """One `mat request run`: the config, the request (or its free text), and where it is written."""

    config: Config
    request_id: str
    folder: Path
    spec: RequestSpec | None = None
    text: str | None = None
    repos: tuple[str, ...] = ()
    serve_after: bool = True
    started: float = field(default_factory=time.time)


def new_request(
    cfg: Config,
    *,
    spec: RequestSpec | None = None,
    text: str | None = None,
    name: str | None = None,
    request_file: str | Path | None = None,
    repos: tuple[str, ...] = (),
    output_dir: str | Path | None = None,
    serve_after: bool = True,
    request_id: str | None = None,
) -> RequestRun:
    """A new request folder with request.json (and request.yaml for a YAML request)."""
    check_inputs(cfg, spec, text)
    label = request_label(spec, name, request_file)
    request_id = request_id or new_request_id(label)
    folder = requests_root(cfg, output_dir) / request_id
    folder.mkdir(parents=True)
    if spec is not None:
        (folder / REQUEST_YAML).write_text(
            yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False), encoding="utf-8"
        )
    RequestState(request_id, label, task=spec.task if spec else "").save(folder)
    return RequestRun(cfg, request_id, folder, spec, text, tuple(repos), serve_after)


def request_label(spec: RequestSpec | None, name: str | None, request_file: str | Path | None) -> str:
    """--name, else the request's `name:`, else the request file's name, else "request"."""
    return name or (spec.name if spec else None) or (Path(request_file).stem if request_file else "request")


def check_inputs(cfg: Config, spec: RequestSpec | None, text: str | None) -> None:
    """ConfigError unless exactly one of a request and a text is given, and a text has a planner."""
    if (spec is None) == (text is None):
        raise ConfigError(
            'give either a request file (REQUEST.yaml) or --text "..." (see `mat request run --help`)'
        )
    if text is not None and not (cfg.request.planner_command or "").strip():
        raise ConfigError(
            "--text needs a planner LLM to turn the text into a request, and none is configured: set "
            "request.planner_command (a command with {prompt}, or preset:claude), or write the request as "
            "YAML and pass the file"
        )
    if text is not None and not text.strip():
        raise ConfigError("--text is empty; describe the model you need")


# --------------------------------------------------------------------------- the agents (library calls)


def task_agent_plan(run: RequestRun) -> Plan:
    """The Task agent's plan (the free text turned into a request first, by the planner LLM)."""
    spec = run.spec
    if spec is None:
        assert run.text is not None and run.config.request.planner_command is not None
        names = unique_names(list(run.config.sources))
        spec, _ = request_from_text(
            run.config.request.planner_command,
            run.text,
            names,
            run.folder,
            run.config.request.planner_timeout,
        )
    inputs = planner.PlanInputs(run.config, spec, run.request_id, run.folder, run.repos, run.started)
    return planner.plan_request(inputs)


def ingest_sources(run: RequestRun, plan: Plan) -> list[SourceConfig]:
    """What the ingest step fetches for this request."""
    return request_sources(run.config, plan.spec, run.repos)


def ingest_config(run: RequestRun, plan: Plan) -> Config:
    """The config the ingest stage runs with: only the request's sources."""
    return run.config.model_copy(update={"sources": ingest_sources(run, plan)})


def data_agent(
    run: RequestRun, plan: Plan, summary: dict[str, Any], env: Mapping[str, str] | None = None
) -> DataReport:
    """The Data agent: licenses, examples and split of the ingested corpus."""
    tokens = source_tokens(ingest_sources(run, plan), env if env is not None else os.environ)
    return prepare_data(run.folder, plan.spec, summary, run.config, tokens)


def task_agent_review(run: RequestRun, plan: Plan, data: DataReport) -> Plan:
    """The Task agent's review of the training set: data, licenses, budget."""
    return planner.review_data(plan, data, run.config, run.started)


def model_agent(run: RequestRun, plan: Plan, data: DataReport) -> ModelReport:
    """The Model agent: trials, trials.tsv, the best trained fully and evaluated."""
    return run_model_agent(run.folder, plan, data, run.config, run.started)


def held_out_prompts(dataset: str) -> list[str]:
    """Prompts for timing the endpoint: the held-out examples' prompts (or texts)."""
    prompts = []
    with open(dataset, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line) if line.strip() else None
            if isinstance(row, dict) and row.get("split") == "val":
                prompts.append(str(row.get("prompt") or row.get("text") or ""))
            if len(prompts) >= PROMPTS_KEPT:
                break
    return prompts


def server_agent(run: RequestRun, plan: Plan, data: DataReport, model: ModelReport) -> dict[str, Any]:
    """The Server agent: serve the model, time it, judge every requirement, write the reports."""
    cfg, spec = run.config, plan.spec
    endpoint = serving.start_server(cfg, run.folder, model.job_id, run.request_id)
    try:
        tokens = spec.requirements.speed.latency_tokens
        speed = serving.measure(
            endpoint,
            serving.api_key(cfg),
            held_out_prompts(data.dataset),
            tokens,
            cfg.request.measure_requests,
        )
        speed.serving = run.serve_after
        outcome = Outcome(plan, data, model, speed, time.time() - run.started)
        verdicts = judge(outcome)
        write_reports(run.folder, outcome, verdicts)
    except BaseException:
        serving.stop_server(run.folder)
        raise
    if not run.serve_after:
        serving.stop_server(run.folder)
    return {"speed": speed.to_dict(), "verdicts": [v.to_dict() for v in verdicts]}


# --------------------------------------------------------------------------- steps


class RequestSteps(Protocol):
    """What each agent's turn means for one caller (plain calls, or Prefect tasks)."""

    def plan(self, run: RequestRun) -> Plan: ...

    def ingest(self, run: RequestRun, plan: Plan) -> dict[str, Any]: ...

    def data(self, run: RequestRun, plan: Plan, summary: dict[str, Any]) -> DataReport: ...

    def review(self, run: RequestRun, plan: Plan, data: DataReport) -> Plan: ...

    def model(self, run: RequestRun, plan: Plan, data: DataReport) -> ModelReport: ...

    def serve(self, run: RequestRun, plan: Plan, data: DataReport, model: ModelReport) -> dict[str, Any]: ...


class PlainRequestSteps:
    """Each agent a plain call in this process."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env

    def plan(self, run: RequestRun) -> Plan:
        return task_agent_plan(run)

    def ingest(self, run: RequestRun, plan: Plan) -> dict[str, Any]:
        from multiagenttrainer.ingest import PlainSteps, plan_ingest, run_ingest

        return run_ingest(
            plan_ingest(ingest_config(run, plan), (), run.folder / CORPUS_DIR), PlainSteps(self.env)
        )

    def data(self, run: RequestRun, plan: Plan, summary: dict[str, Any]) -> DataReport:
        return data_agent(run, plan, summary, self.env)

    def review(self, run: RequestRun, plan: Plan, data: DataReport) -> Plan:
        return task_agent_review(run, plan, data)

    def model(self, run: RequestRun, plan: Plan, data: DataReport) -> ModelReport:
        return model_agent(run, plan, data)

    def serve(self, run: RequestRun, plan: Plan, data: DataReport, model: ModelReport) -> dict[str, Any]:
        return server_agent(run, plan, data, model)


# --------------------------------------------------------------------------- the stage


class Progress:
    """request.json kept up to date as the request moves from agent to agent."""

    def __init__(self, run: RequestRun, flow_run_id: str | None) -> None:
        self.run = run
        self.state = read_state(run.folder)
        self.state.flow_run_id = flow_run_id

    def stage(self, stage: Stage, plan: Plan | None = None) -> None:
        self.state.stage = stage
        if plan is not None:
            self.state.task = plan.spec.task
        self.state.save(self.run.folder)

    def end(self, outcome: Any, reasons: list[str], error: str | None = None) -> None:
        self.state.outcome, self.state.reasons, self.state.error = outcome, reasons, error
        self.state.finished_at = now_iso()
        self.state.save(self.run.folder)


def judged(run: RequestRun, plan: Plan, progress: Progress) -> None:
    """Write the plan; end the request when it is refused."""
    write_plan(run.folder, plan)
    if plan.refused:
        progress.end("refused", plan.refusals)
        raise RequestRefused(run.request_id, plan.refusals)


def ingested(run: RequestRun, plan: Plan, steps: RequestSteps) -> dict[str, Any]:
    """The ingest summary; with failed sources, what was fetched (noted), or the failure."""
    try:
        return steps.ingest(run, plan)
    except IngestIncomplete as exc:
        if exc.summary.get("stats") is None:
            raise
        return exc.summary


def run_request(
    run: RequestRun, steps: RequestSteps | None = None, flow_run_id: str | None = None
) -> dict[str, Any]:
    """The whole stage; returns the summary, raises RequestRefused (exit 3) or MatError."""
    steps = steps or PlainRequestSteps()
    progress = Progress(run, flow_run_id)
    try:
        return request_stage(run, steps, progress)
    except RequestRefused:
        raise
    except BaseException as exc:
        serving.stop_server(run.folder)
        reason = str(exc) if isinstance(exc, MatError) else f"{type(exc).__name__}: {exc}"
        progress.end("failed", [], reason if not isinstance(exc, KeyboardInterrupt) else "interrupted")
        raise


def request_stage(run: RequestRun, steps: RequestSteps, progress: Progress) -> dict[str, Any]:
    """run_request's body."""
    plan = steps.plan(run)
    progress.stage("plan", plan)
    judged(run, plan, progress)
    progress.stage("data")
    data = steps.data(run, plan, ingested(run, plan, steps))
    progress.stage("review")
    plan = steps.review(run, plan, data)
    judged(run, plan, progress)
    progress.stage("model")
    model = steps.model(run, plan, data)
    progress.stage("serve")
    served = steps.serve(run, plan, data, model)
    unmet = [v["requirement"] for v in served["verdicts"] if not v["met"]]
    progress.stage("done")
    progress.end("not met" if unmet else "met", [f"not met: {name}" for name in unmet])
    return {
        "request_id": run.request_id,
        "dir": str(run.folder),
        "outcome": progress.state.outcome,
        "model": model.to_dict(),
        **served,
    }
