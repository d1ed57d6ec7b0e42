"""Everything an experiment starts ends with it: processes the agent or train.py detach with setsid, a double
fork or nohup are gone when the experiment is recorded."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from multiagenttrainer.agents.command import CommandAgent
from tests.support.experiments import (
    REPO_ROOT,
    TRIVIAL_TRAIN_PY,
    install_train_py,
    new_trivial_run,
    processes_with,
)

ESCAPING_TRAIN_PY = TRIVIAL_TRAIN_PY.replace(
    "time.sleep(SLEEP_S)\n",
    """time.sleep(SLEEP_S)
import os
MARK = os.environ["ESCAPE_MARKER"] + "-train"
subprocess.run(["bash", "-c", f'''
setsid bash -c 'exec -a "{MARK}-setsid" sleep 1001' >/dev/null 2>&1 < /dev/null &
( ( exec -a "{MARK}-double-fork" sleep 1002 & ) & )
nohup bash -c 'exec -a "{MARK}-nohup" sleep 1003' >/dev/null 2>&1 &
until [ "$(pgrep -fc {MARK})" -ge 3 ]; do sleep 0.02; done
'''], check=True)
""",
)


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"mat-escape-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("ESCAPE_MARKER", name)
    yield name
    for pid in processes_with(name):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("scopes", ["cgroups", "environment markers"])
def test_detached_processes_of_agent_and_training_end_with_the_experiment(
    tmp_path: Path, corpus_dir: Path, marker: str, scopes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if scopes == "environment markers":
        monkeypatch.setenv("MAT_CGROUPS", "0")
    agent = CommandAgent(str(REPO_ROOT / "tests" / "assets" / "agents" / "escape.sh"), name="escape")
    runner, workspace = new_trivial_run(
        tmp_path / "runs", corpus_dir, "escape", agent=agent, max_experiments=2
    )
    install_train_py(workspace, ESCAPING_TRAIN_PY)
    results = asyncio.run(runner.run_experiments(workspace))
    assert [r.status for r in results] == ["keep", "keep"]  # both trained (0.004 -> 0.002 is better)
    assert processes_with(marker) == []  # six escapees per experiment, none left
