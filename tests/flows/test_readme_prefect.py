"""The README's Prefect commands work as written on a fresh machine: run one by one, literally, in a new HOME
with nothing of Prefect or mat configured, from the repository root."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.support.prefect_runs import ROOT, task_runs_of, wait_until

pytestmark = pytest.mark.integration
SECTION = "### Prefect: the local server, deployments and workers"
COMMAND_TIMEOUT_S = 420


def readme_commands() -> list[str]:
    """The lines of the first ```bash block of the README's Prefect section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = section[section.index("```bash\n") + len("```bash\n") :]
    return [line for line in block[: block.index("```")].splitlines() if line.strip()]


def fresh_machine_env(home: Path) -> dict[str, str]:
    """A new user's environment: this checkout's venv on PATH, and nothing else of Prefect or mat."""
    keep = {"LANG", "LC_ALL", "TMPDIR", "OMP_NUM_THREADS", "OMP_WAIT_POLICY"}
    env = {name: value for name, value in os.environ.items() if name in keep}
    env.update(
        HOME=str(home), PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", COLUMNS="200"
    )
    return env


def processes_of(home: Path) -> list[int]:
    """Live processes started with this HOME (the server, workers, flow runs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"HOME={home}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def new_user(tmp_path: Path) -> Iterator[Path]:
    """A HOME of its own; whatever the commands left running is stopped afterwards, and must be none."""
    home = tmp_path / "home"
    home.mkdir()
    yield home
    env = fresh_machine_env(home)
    for command in (["mat", "worker", "stop"], ["mat", "server", "stop"]):
        subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    left = processes_of(home)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "the README's commands left processes running"


def test_the_readme_prefect_commands_work_literally(new_user: Path) -> None:
    commands = readme_commands()
    assert [c.split("#")[0].split()[:2] for c in commands] == [
        ["mat", "server"], ["mat", "ingest"], ["mat", "deploy"], ["mat", "worker"],
        ["prefect", "deployment"], ["mat", "ingest"], ["mat", "worker"], ["mat", "server"],
    ]  # fmt: skip
    outputs: list[str] = []
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=fresh_machine_env(new_user), capture_output=True,
            text=True, timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output}"
        assert "Traceback" not in output, f"`{command}`:\n{output}"
        outputs.append(output)
        if command.startswith("mat server start"):
            api_url = json.loads((new_user / ".mat" / "server.json").read_text())["api_url"]
        if command.startswith("prefect deployment run"):
            match = re.search(r"UUID: ([0-9a-f-]{36})", output)
            assert match, output
            assert_served_from_the_cache(api_url, match.group(1))

    server_start, _, deploy, worker_start, watched, followed, worker_stop, server_stop = outputs
    profiles = tomllib.loads((new_user / ".prefect" / "profiles.toml").read_text())
    assert profiles["active"] == "mat" and profiles["profiles"]["mat"]["PREFECT_API_URL"] == api_url
    assert "prefect profile use ephemeral" in server_start and "mat worker start" in server_start
    assert "deployed ingest/ingest" in deploy and "deployed nightly/nightly" in deploy
    assert re.search(r"worker for mat-local started \(pid \d+\)", worker_start)
    assert "Completed" in watched
    assert (
        "multiagenttrainer: unchanged" in followed and "corpus unchanged, kept the existing one" in followed
    )
    assert re.search(r"worker for mat-local \(pid \d+\) stopped", worker_stop)
    assert "Prefect server stopped." in server_stop and "profile `mat` stays" in server_stop


def assert_served_from_the_cache(api_url: str, flow_run_id: str) -> None:
    """The worker's ingest reused what the in-process `mat ingest` fetched and built (its log says so)."""
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)])), limit=200
        )
        states: dict[str, str | None] = {}

        def fetch_recorded() -> bool:  # task runs are recorded from events, a little after the flow run ends
            states.update({run.name: run.state.name for run in task_runs_of(flow_run_id) if run.state})
            return "fetch multiagenttrainer" in states

        wait_until(fetch_recorded, 60, "the fetch task run to be recorded")
    assert states["fetch multiagenttrainer"] == "Cached", states
    messages = [log.message for log in logs]
    assert (
        "multiagenttrainer: unchanged" in messages and "corpus unchanged, kept the existing one" in messages
    )
