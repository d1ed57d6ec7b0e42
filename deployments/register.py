"""Work pools, block types and deployments on the current Prefect API: what `mat deploy` runs.

prefect.yaml stays the one description of mat's deployments; this module reads it and registers each
entry through the Prefect client, so that re-running it updates everything in place:

- work pools (process type): `mat-local`, and `mat-<machine>` for every machine of the config. A machine
  with `gpus: N` gets a pool limit of N flow runs at once; `gpus: 0` (the default) means no limit;
- the block types of blocks/settings.py, so machine and SES settings can be kept on the server;
- every deployment of prefect.yaml (ingest, train, experiments-on-machine, finetune, nightly with its
  cron schedule), plus `experiments-on-machine/<machine>` on each machine's pool;
- with a config file, the deployments' `config_path` parameter defaults to it (an absolute path).

How a worker gets the code (the pull step), chosen with `mat deploy --code-from`:

- `directory` (the default): the flow run changes into the project directory (`set_working_directory`),
  the code as it is here, uncommitted edits included; the directory must exist where the worker runs;
- `git`: the flow run clones the remote branch this checkout's branch tracks (`git_clone`; credentials in
  the remote's URL are never copied into the deployment), for workers on machines without a checkout.
  Commits not pushed there and uncommitted changes are reported: flow runs would not see them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import yaml
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate, WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
from prefect.flows import Flow, load_flow_from_entrypoint
from prefect.schedules import Schedule
from prefect.utilities.callables import parameter_schema
from prefect.workers.process import ProcessWorker

from blocks.settings import register_block_types
from deployments.pools import DEFAULT_WORK_POOL, Pool, pool_name, pools_for
from multiagenttrainer.config import Config
from multiagenttrainer.errors import ConfigError, ServerError

MACHINE_DEPLOYMENT = "experiments-on-machine"  # prefect.yaml's entry that is copied once per machine
PROJECT_DIR_VARIABLE = "MAT_PROJECT_DIR"  # templated in prefect.yaml as {{ $MAT_PROJECT_DIR }}
ENV_TEMPLATE = re.compile(r"{{\s*\$(\w+)\s*}}")  # Prefect's syntax for environment variables
SCHEDULE_FIELDS = {field.name for field in dataclasses.fields(Schedule)}
GIT_TIMEOUT_S = 10.0
SET_WORKING_DIRECTORY = "prefect.deployments.steps.set_working_directory"
GIT_CLONE = "prefect.deployments.steps.git_clone"
CODE_FROM = ("directory", "git")  # `mat deploy --code-from`


@dataclass(frozen=True)
class DeployReport:
    """What `mat deploy` registered."""

    pools: list[Pool]
    deployments: list[str]
    pull_steps: list[dict[str, Any]]
    block_types: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------- prefect.yaml


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


# --------------------------------------------------------------------------- work pools


def ensure_pool(client: SyncPrefectClient, pool: Pool) -> None:
    """Create the process pool, or bring an existing one's limit in line with the config."""
    try:
        existing = client.read_work_pool(pool.name)
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        create = WorkPoolCreate(
            name=pool.name, type="process", base_job_template=template, concurrency_limit=pool.limit
        )
        try:
            client.create_work_pool(create)
            return
        except ObjectAlreadyExists:  # created meanwhile by another caller
            existing = client.read_work_pool(pool.name)
    if existing.concurrency_limit != pool.limit:
        client.update_work_pool(pool.name, WorkPoolUpdate(concurrency_limit=pool.limit))


def ensure_process_pool(name: str) -> None:
    """Create the process work pool `name` unless it exists."""
    with get_client(sync_client=True) as client:
        ensure_pool(client, Pool(name))


# --------------------------------------------------------------------------- pull step


def git(project_dir: Path, *args: str) -> str | None:
    """Output of a read-only git command in `project_dir`, or None when it fails."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    try:
        done = subprocess.run(
            ["git", "-C", str(project_dir), *args],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def without_credentials(url: str) -> str:
    """A repository URL with any user:token@ part removed (it must not end up in a deployment)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def git_upstream(project_dir: Path) -> tuple[str, str] | None:
    """(repository URL, branch) that the project's current branch tracks, or None."""
    branch = git(project_dir, "symbolic-ref", "--quiet", "--short", "HEAD")
    if branch is None:
        return None
    remote = git(project_dir, "config", f"branch.{branch}.remote")
    merge = git(project_dir, "config", f"branch.{branch}.merge")
    if remote is None or merge is None or remote == ".":
        return None
    url = git(project_dir, "remote", "get-url", remote)
    return (without_credentials(url), merge.removeprefix("refs/heads/")) if url else None


def pull_steps_for(project_dir: Path, code_from: str = "directory") -> list[dict[str, Any]]:
    """Change into the project directory, or (`git`) clone the remote branch its branch tracks."""
    if code_from not in CODE_FROM:
        raise ConfigError(f"--code-from: {code_from!r} is not one of {', '.join(CODE_FROM)}")
    if code_from == "directory":
        return [{SET_WORKING_DIRECTORY: {"directory": str(project_dir)}}]
    upstream = git_upstream(project_dir)
    if upstream is None:
        raise ConfigError(
            f"--code-from git: {project_dir} is not on a branch that tracks a remote branch; push it "
            "(git push --set-upstream <remote> <branch>) or deploy with --code-from directory"
        )
    repository, branch = upstream
    return [{GIT_CLONE: {"repository": repository, "branch": branch}}]


def unpublished_changes(project_dir: Path) -> list[str]:
    """What a flow run that clones the tracked branch would not see: unpushed commits, uncommitted edits."""
    notes = []
    ahead = git(project_dir, "rev-list", "--count", "@{upstream}..HEAD")
    if ahead is not None and ahead != "0":
        notes.append(f"{ahead} commit(s) of {project_dir} are not pushed: flow runs clone without them")
    if git(project_dir, "status", "--porcelain", "--untracked-files=no") is not None:
        notes.append(f"{project_dir} has uncommitted changes: flow runs clone without them")
    return notes


# --------------------------------------------------------------------------- deployments


def machine_specs(spec: Mapping[str, Any], cfg: Config | None) -> list[dict[str, Any]]:
    """prefect.yaml's experiments-on-machine entry once per machine, on that machine's pool."""
    specs = []
    for machine in cfg.machines if cfg else []:
        pool = {**(spec.get("work_pool") or {}), "name": pool_name(machine.name)}
        parameters = {**(spec.get("parameters") or {}), "machine": machine.name}
        specs.append({**spec, "name": machine.name, "work_pool": pool, "parameters": parameters})
    return specs


def with_config_path(spec: dict[str, Any], config_path: Path | None) -> dict[str, Any]:
    """The spec with its `config_path` parameter defaulting to the given config file."""
    parameters = spec.get("parameters") or {}
    if config_path is None or "config_path" not in parameters:
        return spec
    return {**spec, "parameters": {**parameters, "config_path": str(config_path)}}


def deploy_one(
    client: SyncPrefectClient,
    project_dir: Path,
    spec: Mapping[str, Any],
    work_pool: str,
    pull_steps: list[dict[str, Any]],
) -> str:
    """Register (or update) one deployment; returns "flow-name/deployment-name"."""
    name, entrypoint = str(spec["name"]), str(spec["entrypoint"])
    path, _, function = entrypoint.rpartition(":")
    try:
        flow: Flow[..., Any] = load_flow_from_entrypoint(f"{project_dir / path}:{function}")
    except Exception as exc:  # a missing file, a syntax error, no such function: all mean a bad entry
        raise ConfigError(
            f"prefect.yaml: deployment {name!r}: entrypoint {entrypoint} cannot be loaded ({exc})"
        ) from exc
    pool_spec = spec.get("work_pool") or {}
    client.create_deployment(
        flow_id=client.create_flow_from_name(flow.name),
        name=name,
        entrypoint=entrypoint,
        work_pool_name=work_pool,
        work_queue_name=pool_spec.get("work_queue_name"),
        job_variables=pool_spec.get("job_variables") or {},
        parameters=spec.get("parameters") or {},
        parameter_openapi_schema=parameter_schema(flow).model_dump_for_openapi(),
        enforce_parameter_schema=True,
        description=spec.get("description"),
        tags=spec.get("tags") or [],
        schedules=[
            DeploymentScheduleCreate.from_schedule(schedule_from_spec(name, s))
            for s in spec.get("schedules") or []
        ],
        pull_steps=pull_steps,
    )
    return f"{flow.name}/{name}"


def register_deployments(
    project_dir: Path,
    work_pool: str = DEFAULT_WORK_POOL,
    only: Sequence[str] | None = None,
    cfg: Config | None = None,
    config_path: Path | None = None,
    code_from: str = "directory",
) -> list[str]:
    """Create the pools (`work_pool` and one per machine of `cfg`) and register the deployments.

    Deployments on prefect.yaml's `mat-local` pool go to `work_pool`; `only` limits registration to
    the named prefect.yaml entries (all of them by default).
    """
    return deploy(project_dir, cfg, config_path, work_pool, only, code_from).deployments


def deploy(
    project_dir: Path,
    cfg: Config | None = None,
    config_path: Path | None = None,
    work_pool: str = DEFAULT_WORK_POOL,
    only: Sequence[str] | None = None,
    code_from: str = "directory",
) -> DeployReport:
    """Everything `mat deploy` registers: pools, block types, deployments (module docstring)."""
    project_dir = Path(project_dir).resolve()
    specs = [s for s in load_deployment_specs(project_dir) if only is None or s["name"] in only]
    pools = pools_for(cfg, work_pool)
    pull_steps = pull_steps_for(project_dir, code_from)
    warnings = unpublished_changes(project_dir) if code_from == "git" else []
    try:
        block_types = register_block_types()
        names = []
        with get_client(sync_client=True) as client:
            for pool in pools:
                ensure_pool(client, pool)
            for spec in specs:
                extra = machine_specs(spec, cfg) if spec["name"] == MACHINE_DEPLOYMENT else []
                for one in (spec, *extra):
                    one = with_config_path(one, config_path)
                    target = work_pool_for(one, work_pool)
                    names.append(deploy_one(client, project_dir, one, target, pull_steps))
    except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
        raise ServerError(f"the Prefect server refused or dropped the registration: {exc}") from None
    return DeployReport(pools, names, pull_steps, block_types, warnings)
