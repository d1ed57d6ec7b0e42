"""Run training on this machine: a subprocess in its own session, killed as a whole group on timeout.

The command starts with `start_new_session=True`, so it leads a new session and process group that
holds everything it spawns (data-loader workers, a shell's children). When it runs past its timeout, or
mat itself is interrupted, the group gets SIGTERM, then SIGKILL after a grace period, and mat checks that
no member is left: not a process of the group, nor of the session (a child that moved to its own group).
`stop(workspace)` does the same to the commands in flight (from another thread, on Ctrl-C or SIGTERM) and
to whatever an earlier, killed mat left working in the workspace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from multiagenttrainer.config import LocalExecution
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.execution.base import RunOutcome
from multiagenttrainer.processes import (
    GONE_TIMEOUT_S,
    group_alive,
    start_logged,
    stop_group,
    terminate_processes_in,
)

log = logging.getLogger(__name__)

GRACE_S = 5.0  # between SIGTERM and SIGKILL


# ---------------------------------------------------------------- process groups


def kill_process_group(
    pgid: int, leader: subprocess.Popen[bytes] | None = None, grace_s: float = GRACE_S
) -> None:
    """SIGTERM the group, SIGKILL it after `grace_s`, then verify that no member survived."""
    survivors = stop_group(pgid, leader, grace_s, GONE_TIMEOUT_S)
    if survivors:
        raise ExperimentError(
            f"processes of training group {pgid} survived SIGKILL (pids {', '.join(map(str, survivors))}); "
            "kill them by hand"
        )


def kill_groups_quietly(groups: set[int], grace_s: float = GRACE_S) -> None:
    """Kill several process groups, logging (not raising) when one will not die."""
    for pgid in sorted(groups):
        try:
            kill_process_group(pgid, grace_s=grace_s)
        except ExperimentError as exc:
            log.error("%s", exc)


# ---------------------------------------------------------------- the executor


def start_command(
    workspace: Path, command: list[str], log_path: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start `command` in its own session with stdout and stderr going to `log_path`."""
    try:
        return start_logged(command, workspace, log_path, {**os.environ, **env})
    except OSError as exc:
        raise ExperimentError(
            f"cannot start training command {command[0]!r} in {workspace}: {exc.strerror}; "
            "check that it is installed and on PATH"
        ) from exc


def append_log_line(log_path: Path, line: str) -> None:
    """Add a line of mat's own to a run log (after the process has ended)."""
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n[mat] {line}\n")


def wait_for_exit(
    proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path, grace_s: float
) -> tuple[int | None, bool]:
    """Wait for the command; on timeout kill its group. Return (exit code or None, timed out)."""
    try:
        exit_code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_process_group(proc.pid, leader=proc, grace_s=grace_s)
        proc.wait()
        append_log_line(log_path, f"killed after {timeout_s:.0f} s: the run exceeded its time limit")
        return None, True
    if group_alive(proc.pid):  # the command exited but left children behind
        kill_process_group(proc.pid, leader=proc, grace_s=grace_s)
    return exit_code, False


class LocalExecutor:
    """Runs training in the workspace on this machine; nothing to copy."""

    def __init__(
        self, cfg: LocalExecution | None = None, machine_name: str = "local", *, grace_s: float = GRACE_S
    ) -> None:
        self.cfg = cfg or LocalExecution()
        self.name = machine_name
        self.grace_s = grace_s  # between SIGTERM and SIGKILL
        self._running: set[int] = set()  # process groups of the commands in flight, for stop()
        self._lock = threading.Lock()

    def prepare(self, workspace: Path) -> None:
        """Check that the workspace exists; local training reads it in place."""
        if not workspace.is_dir():
            raise ExperimentError(f"workspace {workspace} does not exist; set the run up again")

    def sync(self, workspace: Path, paths: list[str]) -> None:
        """Nothing to do: training runs in the workspace itself."""

    def fetch(self, workspace: Path, paths: list[str]) -> None:
        """Nothing to do: outputs are already in the workspace."""

    def cleanup(self) -> None:
        """Nothing to release."""

    def stop(self, workspace: Path) -> None:
        """Kill the commands this executor runs and whatever an earlier mat left working in `workspace`."""
        with self._lock:
            groups = set(self._running)
        kill_groups_quietly(groups, self.grace_s)
        terminate_processes_in(workspace, self.grace_s)

    @contextlib.contextmanager
    def _registered(self, pgid: int) -> Iterator[None]:
        """Track a process group as running for as long as the block lasts."""
        with self._lock:
            self._running.add(pgid)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(pgid)

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome:
        """Run `command` in the workspace, output to `log_path`; kill its group on timeout or interrupt."""
        started = time.monotonic()
        proc = start_command(workspace, command, log_path, env)
        with self._registered(proc.pid):
            try:
                exit_code, timed_out = wait_for_exit(proc, timeout_s, log_path, self.grace_s)
            except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: no orphans
                kill_process_group(proc.pid, leader=proc, grace_s=self.grace_s)
                raise
        return RunOutcome(exit_code=exit_code, timed_out=timed_out, duration_s=time.monotonic() - started)
