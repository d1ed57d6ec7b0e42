"""Process groups and sessions: start a command in its own session, find, signal and stop what it spawned.

A command started with `start_in_session` leads a new session and process group (both ids are its pid),
which hold everything it spawns. Members are found by scanning /proc: a process counts when its group
or its session is that id, so a child that moved to a group of its own is still found. Zombies do not
count. Without /proc (not Linux), a signal probe stands in and the leader's pid is the only member known.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

POLL_S = 0.05
GONE_TIMEOUT_S = 10.0  # how long SIGKILLed processes get to disappear


def has_proc() -> bool:
    """Whether this system has a Linux-style /proc to scan."""
    return os.path.isdir("/proc/self")


def read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of a process from /proc/<pid>/stat; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[3])  # state, pgrp, session


def is_zombie(state: str) -> bool:
    """Whether a /proc state letter means the process has exited (zombie or dead)."""
    return state in ("Z", "X")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs; a zombie counts as gone (it is never reaped here)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = read_stat(pid)
    return stat is None or not is_zombie(stat[0])


def group_answers(pgid: int) -> bool:
    """Whether a signal probe finds any process in group `pgid` (one we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def session_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in the group or session `pgid`."""
    if not has_proc():
        return [pgid] if group_answers(pgid) else []
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and not is_zombie(stat[0]) and pgid in (stat[1], stat[2]):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process of the group (or its session) is still running."""
    return bool(session_members(pgid))


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to the process group and to any session member that left the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    if has_proc():
        for pid in session_members(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def wait_gone(pgid: int, timeout_s: float, leader: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait until nothing of the group is left (reaping the leader as we go); return whether it is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        if leader is not None:
            leader.poll()  # reap it, or it lingers as a zombie
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def stop_group(
    pgid: int,
    leader: subprocess.Popen[bytes] | None,
    grace_s: float,
    gone_timeout_s: float = GONE_TIMEOUT_S,
) -> list[int]:
    """SIGTERM the group, SIGKILL it after `grace_s`, then verify; return the pids that survived."""
    signal_group(pgid, signal.SIGTERM)
    if wait_gone(pgid, grace_s, leader):
        return []
    signal_group(pgid, signal.SIGKILL)
    if wait_gone(pgid, gone_timeout_s, leader):
        return []
    return session_members(pgid)


def start_in_session(
    command: list[str],
    cwd: Path,
    output: IO[bytes],
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `command` leading a new session, stdin closed, stdout and stderr into `output`."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start_logged(
    command: list[str], cwd: Path, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session with stdout and stderr written to `log_path` (created afresh)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return start_in_session(command, cwd, log, env)
