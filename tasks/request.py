"""Prefect steps of the request stage: one task run per agent turn, named after the agent.

The stage itself (order, refusals, failure rules) is `multiagenttrainer.request.stage.run_request`;
the `request` flow hands it these tasks as its steps (flows/request.py). None is cached or retried:
every request plans, trains and serves afresh, and a failed training is the request's outcome, not
something to repeat behind the user's back. Plans and reports are live objects handed from task to
task inside one flow run, so results are not persisted.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from blocks.secrets import environment_with_secrets
from multiagenttrainer.request import stage
from multiagenttrainer.request.data import DataReport
from multiagenttrainer.request.model import ModelReport
from multiagenttrainer.request.plan import Plan
from multiagenttrainer.request.stage import RequestRun


@task(name="task-agent", task_run_name="task-agent", cache_policy=NO_CACHE, persist_result=False)
def task_agent(run: RequestRun) -> Plan:
    """Plan the request (free text through the planner LLM first), or record why it is refused."""
    return stage.task_agent_plan(run)


@task(name="data-agent", task_run_name="data-agent", cache_policy=NO_CACHE, persist_result=False)
def data_agent(run: RequestRun, plan: Plan, summary: dict[str, Any]) -> DataReport:
    """Licenses, examples and split of the ingested corpus (GitHub tokens may come from Secret blocks)."""
    names = [getattr(source, "token_env", None) for source in stage.ingest_sources(run, plan)]
    return stage.data_agent(run, plan, summary, environment_with_secrets(names))


@task(
    name="task-agent-review", task_run_name="task-agent-review", cache_policy=NO_CACHE, persist_result=False
)
def task_agent_review(run: RequestRun, plan: Plan, data: DataReport) -> Plan:
    """Review the training set: data to train and hold out, licenses, budget."""
    return stage.task_agent_review(run, plan, data)


@task(name="model-agent", task_run_name="model-agent", cache_policy=NO_CACHE, persist_result=False)
def model_agent(run: RequestRun, plan: Plan, data: DataReport) -> ModelReport:
    """Trials, trials.tsv, and the best settings trained fully and measured."""
    return stage.model_agent(run, plan, data)


@task(name="server-agent", task_run_name="server-agent", cache_policy=NO_CACHE, persist_result=False)
def server_agent(run: RequestRun, plan: Plan, data: DataReport, model: ModelReport) -> dict[str, Any]:
    """Serve the model, time it with the openai client, judge the requirements, write the reports."""
    return stage.server_agent(run, plan, data, model)
