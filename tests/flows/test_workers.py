"""`mat worker start|stop` and `mat ingest --deployment`: a flow run on the mat-local pool, run by a worker
mat started, followed in the terminal, sharing the cache of an in-process `mat ingest`."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from deployments.register import register_deployments
from tests.flows.conftest import write_config
from tests.support.prefect_runs import MAT, ROOT, run_mat, session_env, worker_pids

pytestmark = pytest.mark.integration
SIGINT_BIT = 1 << (signal.SIGINT - 1)


def ignored_signals(pid: int) -> int:
    """The SigIgn mask of a process (/proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn line for {pid}")


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `mat worker start &` in a script inherits


@pytest.fixture(scope="module")
def worker(prefect_api: str) -> Iterator[int]:
    """`mat worker start` from a process that ignores SIGINT; `mat worker stop` must still stop it."""
    register_deployments(ROOT, only=["ingest"])
    started = subprocess.run(
        [*MAT, "worker", "start"], cwd=ROOT, env=session_env(), capture_output=True, text=True,
        timeout=240, preexec_fn=ignore_sigint, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    match = re.search(r"worker for mat-local started \(pid (\d+)\), log (\S+)", started.stdout)
    assert match, started.stdout
    pid = int(match.group(1))
    try:
        yield pid
    finally:
        if pid in worker_pids(Path(session_env()["MAT_HOME"])):
            run_mat("worker", "stop", env=session_env())


def notes_config(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    for index in range(3):
        (notes / f"note_{index}.md").write_text(f"# Note {index}\nFOLLOWED_NOTE_{index}\n")
    return write_config(
        tmp_path / "mat.yaml",
        [{"type": "local_repo", "path": str(notes), "name": "notes"}],
        tmp_path / "corpus",
        tmp_path / "staging",
    )


def test_a_started_worker_stops_on_sigterm_though_started_with_sigint_ignored(worker: int) -> None:
    assert not ignored_signals(worker) & SIGINT_BIT, "the worker must not inherit SIGINT as ignored"
    status = run_mat("worker", "status", env=session_env())
    assert status.returncode == 0 and re.search(rf"mat-local\s+{worker}\s+running", status.stdout), (
        status.stdout
    )
    again = run_mat("worker", "start", env=session_env())
    assert f"worker for mat-local already running (pid {worker})" in again.stdout


def test_a_deployment_run_after_mat_ingest_hits_its_cache_and_is_followed_here(
    worker: int, tmp_path: Path
) -> None:
    config = notes_config(tmp_path)
    local = run_mat("ingest", "--config", str(config), env=session_env())
    assert local.returncode == 0, local.stderr

    followed = run_mat("ingest", "--deployment", "--config", str(config), env=session_env(), timeout=300)

    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "submitted to work pool mat-local" in followed.stderr
    assert "notes: unchanged" in followed.stderr  # the fetch cached by the in-process ingest
    assert "corpus unchanged, kept the existing one" in followed.stderr
    assert f"Corpus: {tmp_path / 'corpus' / 'corpus.txt'}" in followed.stdout  # the summary, as in-process
    assert re.search(r"notes\s+local_repo\s+3\b", followed.stdout), followed.stdout
    assert "Traceback" not in followed.stderr


def test_a_failing_deployment_run_exits_1_with_the_reason(worker: int, tmp_path: Path) -> None:
    config = notes_config(tmp_path)
    (tmp_path / "notes").rename(tmp_path / "gone")  # the source disappears after the config was checked

    followed = run_mat("ingest", "--deployment", "--config", str(config), env=session_env(), timeout=300)

    assert followed.returncode == 1, followed.stdout + followed.stderr
    assert re.search(r"error: source 'notes': .*gone|does not exist|not found", followed.stderr), (
        followed.stderr
    )
    assert "error: " in followed.stderr and "Traceback" not in followed.stderr


def test_a_deployment_that_is_not_registered_names_mat_deploy(worker: int, tmp_path: Path) -> None:
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_deployment(client.read_deployment_by_name("finetune/finetune").id)
    from multiagenttrainer.cli.follow import submit
    from multiagenttrainer.errors import ServerError

    with pytest.raises(ServerError, match=r"no deployment finetune/finetune .*`mat deploy`"):
        submit("finetune/finetune", {})


def test_without_a_server_the_deployment_option_names_mat_server_start(tmp_path: Path) -> None:
    env = session_env(MAT_HOME=str(tmp_path / "empty-home"))
    env.pop("PREFECT_API_URL", None)
    result = run_mat("ingest", "--deployment", "--config", str(notes_config(tmp_path)), env=env)
    assert (
        result.returncode == 1 and "`mat server start`" in result.stderr and "Traceback" not in result.stderr
    )


def git(*args: str) -> None:
    subprocess.run(
        ["git", *args], check=True, capture_output=True, env={**session_env(), "GIT_TERMINAL_PROMPT": "0"}
    )


def test_a_deployment_with_code_from_git_runs_from_a_fresh_clone(worker: int, tmp_path: Path) -> None:
    """With --code-from git each flow run clones the branch the checkout tracks: no checkout is needed."""
    origin, checkout = tmp_path / "origin.git", tmp_path / "checkout"
    git("clone", "--quiet", "--bare", str(ROOT), str(origin))
    git("-C", str(origin), "branch", "--force", "mat-under-test", "HEAD")  # also when ROOT's HEAD is detached
    git("clone", "--quiet", "--branch", "mat-under-test", str(origin), str(checkout))
    assert register_deployments(checkout, only=["ingest"], code_from="git") == ["ingest/ingest"]
    with get_client(sync_client=True) as client:
        pull = client.read_deployment_by_name("ingest/ingest").pull_steps
    assert pull == [
        {"prefect.deployments.steps.git_clone": {"repository": str(origin), "branch": "mat-under-test"}}
    ]
    config = notes_config(tmp_path)

    run = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", "ingest/ingest", "-p", f"config_path={config}",
         "--watch", "--watch-timeout", "300"],
        env=session_env(), capture_output=True, text=True, timeout=360, check=False,
    )  # fmt: skip

    register_deployments(ROOT, only=["ingest"])  # back to this checkout for the other tests
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    log = Path(session_env()["MAT_HOME"], "workers", "mat-local.log").read_text()
    assert "git_clone" in log and "FOLLOWED_NOTE_0" in (tmp_path / "corpus" / "corpus.txt").read_text()


def test_worker_stop_ends_every_worker_within_seconds(worker: int) -> None:
    started = time.monotonic()
    stopped = run_mat("worker", "stop", env=session_env())
    assert stopped.returncode == 0, stopped.stderr
    assert f"worker for mat-local (pid {worker}) stopped" in stopped.stdout  # SIGTERM was enough
    assert time.monotonic() - started < 30
    assert worker_pids(Path(session_env()["MAT_HOME"])) == []
    assert run_mat("worker", "status", env=session_env()).returncode == 1
