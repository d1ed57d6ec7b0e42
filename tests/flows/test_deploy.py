"""`mat deploy`: work pools per machine, the deployments of prefect.yaml, and how a worker gets the code."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.schedules import CronSchedule
from prefect.exceptions import ObjectNotFound

from deployments.pools import Pool, pools_for
from deployments.register import git_upstream, pull_steps_for, unpublished_changes, without_credentials
from multiagenttrainer.config import Config
from multiagenttrainer.errors import ConfigError
from tests.support.prefect_runs import ROOT, pause_schedules, run_mat, session_env

GIT = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
DEPLOYMENTS = [
    "ingest/ingest",
    "train/train",
    "experiments-on-machine/experiments-on-machine",
    "experiments-on-machine/gpu-box",
    "experiments-on-machine/cpu_box",
    "finetune/finetune",
    "request/request",
    "nightly/nightly",
]


def git(directory: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(directory), *args],
        check=True,
        capture_output=True,
        env={**GIT, "PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )


def test_machine_pools_take_their_limit_from_the_gpu_count() -> None:
    cfg = Config.model_validate(
        {"machines": [{"name": "gpu-box", "gpus": 2}, {"name": "cpu_box"}, {"name": "One GPU", "gpus": 1}]}
    )
    assert pools_for(cfg) == [
        Pool("mat-local"),
        Pool("mat-gpu-box", 2),
        Pool("mat-cpu-box"),
        Pool("mat-one-gpu", 1),
    ]
    clash = Config.model_validate({"machines": [{"name": "gpu box"}, {"name": "gpu-box"}]})
    with pytest.raises(ConfigError, match="mat-gpu-box"):
        pools_for(clash)


def test_by_default_flow_runs_work_in_the_project_directory_even_in_a_clone(tmp_path: Path) -> None:
    assert git_upstream(tmp_path) is None
    origin, clone = tracking_clone(tmp_path)
    for directory in (tmp_path, clone):
        assert pull_steps_for(directory) == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(directory)}}
        ]


def tracking_clone(tmp_path: Path) -> tuple[Path, Path]:
    """A bare origin and a clone whose branch `trunk` tracks origin/trunk."""
    origin, clone = tmp_path / "origin.git", tmp_path / "clone"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=trunk", str(origin))
    git(tmp_path, "init", "--quiet", "--initial-branch=trunk", str(clone))
    (clone / "flow.py").write_text("x = 1\n")
    git(clone, "add", "flow.py")
    git(clone, "commit", "--quiet", "-m", "first")
    git(clone, "remote", "add", "origin", str(origin))
    git(clone, "push", "--quiet", "--set-upstream", "origin", "trunk")
    return origin, clone


def test_code_from_git_clones_the_tracked_remote_branch(tmp_path: Path) -> None:
    origin, clone = tracking_clone(tmp_path)
    assert pull_steps_for(clone, "git") == [
        {"prefect.deployments.steps.git_clone": {"repository": str(origin), "branch": "trunk"}}
    ]
    assert unpublished_changes(clone) == []


def test_code_from_git_names_what_the_clone_would_miss(tmp_path: Path) -> None:
    _, clone = tracking_clone(tmp_path)
    git(clone, "commit", "--quiet", "--allow-empty", "-m", "local")
    (clone / "flow.py").write_text("x = 2\n")
    notes = unpublished_changes(clone)
    assert notes == [
        f"1 commit(s) of {clone} are not pushed: flow runs clone without them",
        f"{clone} has uncommitted changes: flow runs clone without them",
    ]


def test_code_from_git_without_a_tracked_branch_says_how_to_fix_it(tmp_path: Path) -> None:
    _, clone = tracking_clone(tmp_path)
    git(clone, "checkout", "--quiet", "-b", "local-only")  # a branch that tracks nothing
    for directory in (clone, tmp_path):  # and a directory that is no repository at all
        with pytest.raises(
            ConfigError, match=r"--code-from git: .*git push --set-upstream.*--code-from directory"
        ):
            pull_steps_for(directory, "git")


def test_mat_deploy_refuses_an_unknown_code_source() -> None:
    done = run_mat("deploy", "--code-from", "svn", env=session_env())
    assert done.returncode == 2 and "'--code-from'" in done.stderr and "'svn'" in done.stderr, done.stderr


def test_credentials_in_the_remote_url_never_reach_the_deployment() -> None:
    assert (
        without_credentials("https://bot:ghp_secret@github.com/acme/mat.git")
        == "https://github.com/acme/mat.git"
    )
    assert without_credentials("https://github.com/acme/mat.git") == "https://github.com/acme/mat.git"
    assert without_credentials("git@github.com:acme/mat.git") == "git@github.com:acme/mat.git"


@pytest.fixture
def machines_config(tmp_path: Path) -> Iterator[Path]:
    """A config with a GPU machine (2 GPUs) and a CPU machine; their pools are deleted afterwards."""
    path = tmp_path / "machines.yaml"
    path.write_text(
        yaml.safe_dump({"machines": [{"name": "gpu-box", "gpus": 2}, {"name": "cpu_box"}]}), encoding="utf-8"
    )
    yield path
    with get_client(sync_client=True) as client:
        for name in ("experiments-on-machine/gpu-box", "experiments-on-machine/cpu_box"):
            with contextlib.suppress(ObjectNotFound):
                client.delete_deployment(client.read_deployment_by_name(name).id)
        for pool in ("mat-gpu-box", "mat-cpu-box"):
            with contextlib.suppress(ObjectNotFound):
                client.delete_work_pool(pool)


@pytest.mark.integration
def test_deploy_creates_a_pool_per_machine_and_every_deployment(
    prefect_api: str, machines_config: Path
) -> None:
    first = run_mat("deploy", "--config", str(machines_config), env=session_env())
    try:
        assert first.returncode == 0, first.stderr
        assert "work pool mat-gpu-box (at most 2 flow runs at once)" in first.stdout
        assert "work pool mat-cpu-box (no limit)" in first.stdout
        assert [
            line.removeprefix("deployed ")
            for line in first.stdout.splitlines()
            if line.startswith("deployed ")
        ] == DEPLOYMENTS
        assert f"flow runs get the code by: working in {ROOT}" in first.stdout  # also in a clone (CI's)

        with get_client(sync_client=True) as client:
            pools = {
                name: client.read_work_pool(name) for name in ("mat-local", "mat-gpu-box", "mat-cpu-box")
            }
            assert {p.type for p in pools.values()} == {"process"}
            assert [pools[n].concurrency_limit for n in ("mat-local", "mat-gpu-box", "mat-cpu-box")] == [
                None,
                2,
                None,
            ]
            deployments = {name: client.read_deployment_by_name(name) for name in DEPLOYMENTS}
            assert deployments["experiments-on-machine/gpu-box"].work_pool_name == "mat-gpu-box"
            assert deployments["experiments-on-machine/gpu-box"].parameters["machine"] == "gpu-box"
            assert deployments["train/train"].work_pool_name == "mat-local"
            assert deployments["train/train"].parameters["config_path"] == str(machines_config)
            for deployment in deployments.values():
                assert deployment.pull_steps == [
                    {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
                ]
                assert deployment.job_variables["env"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "multiagenttrainer"
            schema = deployments["experiments-on-machine/experiments-on-machine"].parameter_openapi_schema
            assert set(schema["properties"]) == {"run_id", "machine", "output_dir", "config_path"}
            assert set(schema["required"]) == {"run_id", "machine"}
            (schedule,) = deployments["nightly/nightly"].schedules
            assert isinstance(schedule.schedule, CronSchedule) and schedule.schedule.cron == "0 2 * * *"
            assert client.read_block_type_by_slug("mat-machine").slug == "mat-machine"
            assert client.read_block_type_by_slug("mat-ses-alerts").slug == "mat-ses-alerts"
            ids = {name: d.id for name, d in deployments.items()}

        machines_config.write_text(
            yaml.safe_dump({"machines": [{"name": "gpu-box", "gpus": 1}, {"name": "cpu_box"}]})
        )
        again = run_mat("deploy", "--config", str(machines_config), env=session_env())
        assert again.returncode == 0, again.stderr
        with get_client(sync_client=True) as client:
            assert client.read_work_pool("mat-gpu-box").concurrency_limit == 1  # updated in place
            assert {name: client.read_deployment_by_name(name).id for name in DEPLOYMENTS} == ids
            assert len(client.read_deployment_by_name("nightly/nightly").schedules) == 1
    finally:
        pause_schedules("nightly/nightly")


def test_deploy_without_a_server_names_mat_server_start(tmp_path: Path) -> None:
    env = session_env(MAT_HOME=str(tmp_path / "mat-home"))
    env.pop("PREFECT_API_URL", None)
    result = run_mat("deploy", env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "no Prefect server is running" in result.stderr and "`mat server start`" in result.stderr
