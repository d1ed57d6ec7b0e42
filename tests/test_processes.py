"""Process containment: what a command detaches (setsid, a double fork, nohup) is still stopped with it,
with cgroups and with the environment-marker fallback, and a killed mat's leftovers are found later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from multiagenttrainer import processes
from tests.support.experiments import processes_with, wait_for

ROOT = Path(__file__).resolve().parents[1]


def escape_script(marker: str, directory: Path, then: str = "") -> list[str]:
    """A command (its marker kept out of its own command line) that leaves three marked sleepers behind
    in three ways, waits until all three run, then runs `then` and exits."""
    script = directory / f"escape-{uuid.uuid4().hex[:6]}.sh"
    script.write_text(
        textwrap.dedent(
            f"""
            setsid bash -c 'exec -a "{marker}-setsid" sleep 1001' >/dev/null 2>&1 < /dev/null &
            ( ( exec -a "{marker}-double-fork" sleep 1002 & ) & )
            nohup bash -c 'exec -a "{marker}-nohup" sleep 1003' >/dev/null 2>&1 &
            until [ "$(pgrep -fc {marker})" -ge 3 ]; do sleep 0.02; done
            {then}
            """
        )
    )
    return ["bash", str(script)]


@pytest.fixture(params=["cgroup", "environment"])
def scope_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both ways of holding a scope; the cgroup kind only where this process may create cgroups."""
    if request.param == "environment":
        monkeypatch.setenv("MAT_CGROUPS", "0")
    elif processes.cgroup_base() is None:
        pytest.skip("this process may not create cgroups (needs root or a delegated cgroup subtree)")
    yield request.param


@pytest.fixture
def marker() -> Iterator[str]:
    name = f"mat-escape-{uuid.uuid4().hex[:10]}"
    yield name
    for pid in processes_with(name):  # never leave a sleeper behind, even when a test fails
        os.kill(pid, signal.SIGKILL)


def test_detached_children_are_members_and_stopped_with_the_group(
    scope_kind: str, marker: str, tmp_path: Path
) -> None:
    with (tmp_path / "out").open("wb") as out:
        leader = processes.start_in_session(escape_script(marker, tmp_path), tmp_path, out)
    assert leader.wait(timeout=30) == 0
    escaped = processes_with(marker)
    assert len(escaped) == 3
    assert set(escaped) <= set(processes.session_members(leader.pid))  # none left the scope
    assert processes.stop_group(leader.pid, leader, grace_s=2.0) == []
    assert processes_with(marker) == []
    processes.release_scopes()
    assert processes.scope_of(leader.pid) is None


def test_an_uncontained_process_is_outside_any_scope(marker: str, tmp_path: Path) -> None:
    with (tmp_path / "out").open("wb") as out:
        leader = processes.start_in_session(escape_script(marker, tmp_path), tmp_path, out, contained=False)
    leader.wait(timeout=30)
    assert processes.scope_of(leader.pid) is None
    assert not set(processes_with(f"{marker}-setsid")) & set(processes.session_members(leader.pid))


def test_a_killed_owners_leftovers_are_stopped_later(scope_kind: str, marker: str, tmp_path: Path) -> None:
    """A mat process (here a child python) starts a contained command and is SIGKILLed: the command's
    leader dies with it (PR_SET_PDEATHSIG), and what it detached is found and stopped afterwards."""
    owner_code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from multiagenttrainer import processes
        out = open({str(tmp_path / "out")!r}, "wb")
        leader = processes.start_in_session({escape_script(marker, tmp_path, "sleep 1000")!r},
                                            Path({str(tmp_path)!r}), out)
        print(leader.pid, flush=True)
        time.sleep(3600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert owner.stdout is not None
    leader_pid = int(owner.stdout.readline())
    wait_for(lambda: len(processes_with(marker)) == 3, 30, "the three detached sleepers")
    owner.kill()
    owner.wait()
    wait_for(lambda: not processes.pid_alive(leader_pid), 10, "the leader to die with its owner")
    assert len(processes_with(marker)) == 3  # the detached ones outlived it...
    left = set(processes_with(marker))
    assert left <= set(processes.stop_orphaned_scopes())
    wait_for(lambda: processes_with(marker) == [], 10, "the leftovers to be gone")  # ...until mat looked


def test_a_live_owners_scopes_are_not_orphans(marker: str, tmp_path: Path) -> None:
    with (tmp_path / "out").open("wb") as out:
        leader = processes.start_in_session(["sleep", "30"], tmp_path, out)
    try:
        assert leader.pid not in processes.stop_orphaned_scopes()
        assert processes.pid_alive(leader.pid)
    finally:
        processes.stop_group(leader.pid, leader, grace_s=1.0)


def test_a_command_whose_owner_dies_before_it_starts_never_runs(marker: str, tmp_path: Path) -> None:
    """mat killed between the fork and the child's request to die with it: the kernel will never send that
    signal, so the child must see for itself that it was orphaned and end before running the command."""
    forked = tmp_path / "forked"
    owner_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from multiagenttrainer import processes
        owner, hook = os.getpid(), processes.die_with_parent_hook()

        def owner_killed_first():  # the window, held open: the owner dies before the hook runs
            with open({str(forked)!r}, "w") as handle:
                handle.write(str(os.getpid()))
            deadline = time.monotonic() + 30
            while os.getppid() == owner and time.monotonic() < deadline:
                time.sleep(0.01)
            hook()

        command = [sys.executable, "-c", "import time; time.sleep(1000)", os.environ["MARKER"]]
        subprocess.Popen(command, preexec_fn=owner_killed_first).wait()
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code], cwd=ROOT, env={**os.environ, "MARKER": marker}
    )
    wait_for(lambda: forked.exists() and forked.read_text() != "", 30, "the owner's fork")
    child = int(forked.read_text())
    owner.kill()
    owner.wait()
    wait_for(lambda: not processes.pid_alive(child), 35, "the orphaned child to end")
    assert processes_with(marker) == []  # the command never ran
