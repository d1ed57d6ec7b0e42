"""Register the deployments in prefect.yaml against the current Prefect API (what `mat deploy` runs).

prefect.yaml stays the single description of mat's deployments; this module reads it and deploys
each entry with `Flow.from_source(<project dir>, entrypoint).deploy(...)`, which gives every flow
run a pull step that changes into the project directory. That is the same effect as
`MAT_PROJECT_DIR=$PWD prefect deploy --all`, without a slow CLI round trip, and it creates the
process work pool first when it is missing. The project directory must exist on the machine where
the worker runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Schedule
from prefect.workers.process import ProcessWorker

from multiagenttrainer.errors import ConfigError

DEFAULT_WORK_POOL = "mat-local"
PROJECT_DIR_VARIABLE = "MAT_PROJECT_DIR"  # templated in prefect.yaml as {{ $MAT_PROJECT_DIR }}
ENV_TEMPLATE = re.compile(r"{{\s*\$(\w+)\s*}}")  # Prefect's syntax for environment variables
SCHEDULE_FIELDS = {field.name for field in dataclasses.fields(Schedule)}


def load_deployment_specs(project_dir: Path) -> list[dict[str, Any]]:
    """The `deployments:` entries of prefect.yaml, with {{ $ENV }} templates filled in."""
    path = project_dir / "prefect.yaml"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{path}: cannot read the deployments ({exc}); run `mat deploy` from the project"
        ) from exc
    specs = document.get("deployments") or []
    if not specs:
        raise ConfigError(f"{path}: no `deployments:` entries to register")
    values = {**os.environ, PROJECT_DIR_VARIABLE: str(project_dir)}
    return [cast(dict[str, Any], fill_env_templates(spec, values)) for spec in specs]


def fill_env_templates(value: Any, env: Mapping[str, str]) -> Any:
    """Replace `{{ $NAME }}` in every string of `value` with env[NAME]; unknown names stay as written."""
    if isinstance(value, str):
        return ENV_TEMPLATE.sub(lambda match: env.get(match.group(1), match.group(0)), value)
    if isinstance(value, list):
        return [fill_env_templates(item, env) for item in value]
    if isinstance(value, dict):
        return {key: fill_env_templates(item, env) for key, item in value.items()}
    return value


def work_pool_for(spec: Mapping[str, Any], default_pool: str) -> str:
    """The pool a deployment runs on: `default_pool` stands in for prefect.yaml's mat-local."""
    name = (spec.get("work_pool") or {}).get("name")
    return default_pool if name in (None, DEFAULT_WORK_POOL) else str(name)


def schedule_from_spec(deployment: str, spec: Mapping[str, Any]) -> Schedule:
    """A prefect.yaml schedule entry (cron, interval in seconds, or rrule) as a Schedule."""
    unknown = set(spec) - SCHEDULE_FIELDS
    if unknown:
        raise ConfigError(
            f"prefect.yaml: deployment {deployment!r}: unsupported schedule keys {sorted(unknown)}; "
            f"use {sorted(SCHEDULE_FIELDS)}"
        )
    values = dict(spec)
    if "interval" in values:
        values["interval"] = dt.timedelta(seconds=float(values["interval"]))
    return Schedule(**values)


def ensure_process_pool(name: str) -> bool:
    """Create the process work pool `name` unless it exists; True when it was created."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            pass
        template = ProcessWorker.get_default_base_job_template()
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
        except ObjectAlreadyExists:
            return False  # created meanwhile by another caller
    return True


def deploy_one(project_dir: Path, spec: Mapping[str, Any], work_pool: str) -> str:
    """Register one prefect.yaml deployment; returns "flow-name/deployment-name"."""
    name = str(spec["name"])
    pool_spec = spec.get("work_pool") or {}
    flow: Flow[Any, Any] = Flow.from_source(str(project_dir), str(spec["entrypoint"]))  # type: ignore[assignment]
    flow.deploy(
        name=name,
        work_pool_name=work_pool,
        work_queue_name=pool_spec.get("work_queue_name"),
        job_variables=pool_spec.get("job_variables") or {},
        parameters=spec.get("parameters") or {},
        description=spec.get("description"),
        tags=spec.get("tags") or [],
        schedules=[schedule_from_spec(name, s) for s in spec.get("schedules") or []],
        build=False,
        push=False,
        print_next_steps=False,
        ignore_warnings=True,
    )
    return f"{flow.name}/{name}"


def register_deployments(
    project_dir: Path, work_pool: str = DEFAULT_WORK_POOL, only: Sequence[str] | None = None
) -> list[str]:
    """Create the process pool `work_pool` if missing and register the deployments in prefect.yaml.

    Deployments on prefect.yaml's `mat-local` pool go to `work_pool`; any other pool must exist.
    `only` limits registration to the named deployments (all of them by default).
    """
    project_dir = Path(project_dir).resolve()
    specs = [s for s in load_deployment_specs(project_dir) if only is None or s["name"] in only]
    ensure_process_pool(work_pool)
    return [deploy_one(project_dir, spec, work_pool_for(spec, work_pool)) for spec in specs]
