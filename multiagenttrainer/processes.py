"""Process groups and sessions: start a command in its own session, find, signal and stop what it spawned.

A command started with `start_in_session` leads a new session and process group (both ids are its pid),
which hold everything it spawns. Members are found by scanning /proc: a process counts when its group
or its session is that id, so a child that moved to a group of its own is still found. Zombies do not
count. Without /proc (not Linux), a signal probe stands in and the leader's pid is the only member known.

A session is not a cage: `setsid`, a double fork or `nohup` leave it. So every contained command also
gets a *scope* that its descendants cannot leave by detaching:
- a cgroup of its own (`mat/<owner pid>-<token>` in the cgroup v2 tree, or the v1 `pids` hierarchy) when
  this process may create one (root, or a delegated subtree), joined before the command starts;
- otherwise (or with MAT_CGROUPS=0) an environment marker (MAT_PROCESS_SCOPE=<owner pid>-<token>) found
  in /proc/<pid>/environ (a descendant has to scrub its environment on purpose to leave it).
Members of the scope count as members of the group, so stopping the group stops them too. The command
itself also dies with the thread that started it (PR_SET_PDEATHSIG), and `stop_orphaned_scopes` ends
what a killed mat left behind (`mat train --resume` calls it).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

POLL_S = 0.05
GONE_TIMEOUT_S = 10.0  # how long SIGKILLed processes get to disappear
SCOPE_VARIABLE = "MAT_PROCESS_SCOPE"
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/pids"))
CGROUP_PARENT = "mat"
PR_SET_PDEATHSIG = 1


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


def read_start_time(pid: int) -> int | None:
    """When a process started (clock ticks after boot, /proc/<pid>/stat field 22); None if it is gone.

    A pid and its start time name one process for good: a reused pid has a later start time.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


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


# ---------------------------------------------------------------- scopes


@dataclass(frozen=True)
class Scope:
    """Everything one contained command started, however it detached (see the module docstring)."""

    name: str  # <owner pid>-<token>
    cgroup: Path | None

    def marker(self) -> bytes:
        return f"{SCOPE_VARIABLE}={self.name}".encode()

    def members(self) -> set[int]:
        """Live processes of the scope (cgroup members, or processes carrying its marker)."""
        if self.cgroup is not None:
            return {pid for pid in cgroup_pids(self.cgroup) if pid_alive(pid)}
        return {pid for pid in live_pids() if carries_marker(pid, self.marker())}


_scopes: dict[int, Scope] = {}  # leader pid -> its scope
_scopes_lock = threading.Lock()


def cgroup_base() -> Path | None:
    """The `mat` cgroup under the first cgroup tree this process may create groups in, or None."""
    if os.environ.get("MAT_CGROUPS") == "0":
        return None
    for root in CGROUP_ROOTS:
        if not (root / "cgroup.procs").is_file():
            continue
        base = root / CGROUP_PARENT
        try:
            base.mkdir(exist_ok=True)
            probe = base / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError:
            continue
        return base
    return None


def new_scope() -> Scope:
    """A fresh scope owned by this process: a cgroup when possible, else an environment marker."""
    name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    base = cgroup_base() if has_proc() else None
    if base is not None:
        with contextlib.suppress(OSError):
            (base / name).mkdir()
            return Scope(name, base / name)
    return Scope(name, None)


def cgroup_pids(cgroup: Path) -> list[int]:
    """The pids in a cgroup (none when it is gone)."""
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def live_pids() -> list[int]:
    """Every live (non-zombie) process."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None and not is_zombie(stat[0]):
                pids.append(int(entry.name))
    return pids


def carries_marker(pid: int, marker: bytes) -> bool:
    """Whether a process's environment holds `marker` (NAME=value)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def scope_of(pgid: int) -> Scope | None:
    with _scopes_lock:
        return _scopes.get(pgid)


def release_scopes() -> None:
    """Forget scopes whose leader is reaped and whose members are all gone; remove their cgroups."""
    with _scopes_lock:
        done = [pgid for pgid, scope in _scopes.items() if not pid_alive(pgid) and not scope.members()]
        for pgid in done:
            scope = _scopes.pop(pgid)
            if scope.cgroup is not None:
                with contextlib.suppress(OSError):
                    scope.cgroup.rmdir()


def orphaned_scope_members() -> dict[str, set[int]]:
    """Processes of scopes whose owning mat process is gone (a killed mat's leftovers), by scope name."""
    found: dict[str, set[int]] = {}
    base = cgroup_base() if has_proc() else None
    for cgroup in base.iterdir() if base is not None else []:
        owner = cgroup.name.split("-", 1)[0]
        if cgroup.is_dir() and owner.isdigit() and not pid_alive(int(owner)):
            found[cgroup.name] = {pid for pid in cgroup_pids(cgroup) if pid_alive(pid)}
    for pid in live_pids() if has_proc() else []:
        name = scope_marker_of(pid)
        if name is not None and not pid_alive(int(name.split("-", 1)[0])):
            found.setdefault(name, set()).add(pid)
    return found


def scope_marker_of(pid: int) -> str | None:
    """The scope name a process carries in its environment, if any."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{SCOPE_VARIABLE}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            name = item[len(prefix) :].decode(errors="replace")
            return name if name.split("-", 1)[0].isdigit() else None
    return None


def stop_orphaned_scopes() -> list[int]:
    """SIGKILL what killed mat processes left running in their scopes; return the pids signalled."""
    killed = []
    for name, pids in orphaned_scope_members().items():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        base = cgroup_base()
        if base is not None and (base / name).is_dir():
            deadline = time.monotonic() + GONE_TIMEOUT_S
            while cgroup_pids(base / name) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            with contextlib.suppress(OSError):
                (base / name).rmdir()
    return killed


def session_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in the group or session `pgid`, or in the scope of its leader."""
    if not has_proc():
        return [pgid] if group_answers(pgid) else []
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and not is_zombie(stat[0]) and pgid in (stat[1], stat[2]):
            members.append(int(entry.name))
    scope = scope_of(pgid)
    if scope is not None:
        members.extend(sorted(scope.members() - set(members)))
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


def die_with_parent_hook(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A hook for a child to run before exec (None off Linux): the kernel sends it `sig` when the thread
    that started it dies (PR_SET_PDEATHSIG). A parent killed between the fork and the hook's call is gone
    before the kernel could be asked, so the child then ends itself instead of running its command."""
    if not has_proc():
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # looked up here: the child only makes the calls
    parent = os.getpid()

    def in_child() -> None:
        libc.prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # adopted already: nobody would send the signal
            os._exit(128 + sig)

    return in_child


def contain(scope: Scope) -> Callable[[], None]:
    """What the child runs before exec: join the scope's cgroup, and die with the starting thread."""
    procs = str(scope.cgroup / "cgroup.procs") if scope.cgroup is not None else None
    die_with_parent = die_with_parent_hook()

    def in_child() -> None:
        if procs is not None:
            with contextlib.suppress(OSError):
                fd = os.open(procs, os.O_WRONLY)
                os.write(fd, b"0")  # "0" means the writing process itself
                os.close(fd)
        if die_with_parent is not None:
            die_with_parent()

    return in_child


def working_in(pid: int, root: Path) -> bool:
    """Whether a process's current directory is `root` or below it."""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == root or root in cwd.parents


def groups_working_in(directory: Path) -> set[int]:
    """Process groups of the live processes working in `directory`, except this process's own group and
    session (the user's shell, mat itself, its git commands)."""
    if not has_proc():
        return set()
    root = directory.resolve()
    own = (os.getpgrp(), os.getsid(0))
    groups: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or not working_in(int(entry.name), root):
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and not is_zombie(stat[0]) and stat[1] not in own and stat[2] not in own:
            groups.add(stat[1])
    return groups


def terminate_processes_in(directory: Path, grace_s: float) -> list[int]:
    """Stop the process groups working in `directory` (SIGTERM, SIGKILL after `grace_s`); return them.

    This finds what a killed mat left running in a workspace on this machine (a training run, an agent).
    A group that survives SIGKILL is logged, not raised: stopping goes on with the others.
    """
    groups = sorted(groups_working_in(directory))
    for pgid in groups:
        survivors = stop_group(pgid, None, grace_s)
        if survivors:
            log.error("processes %s working in %s survived SIGKILL; kill them by hand", survivors, directory)
    return groups


def start_in_session(
    command: list[str],
    cwd: Path,
    output: IO[bytes],
    env: Mapping[str, str] | None = None,
    *,
    contained: bool = True,
) -> subprocess.Popen[bytes]:
    """Start `command` leading a new session, stdin closed, stdout and stderr into `output`.

    `contained` (the default): in a scope of its own, so that stopping its group also stops whatever it
    detached, and killed when the thread that started it dies; the caller must wait for it in that
    thread. Only a process meant to outlive mat (the local Prefect server) is started uncontained.
    """
    if not contained:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    release_scopes()
    scope = new_scope()
    scoped_env = {**(os.environ if env is None else env), SCOPE_VARIABLE: scope.name}
    process = subprocess.Popen(
        command, cwd=cwd, env=scoped_env, stdin=subprocess.DEVNULL, stdout=output,
        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=contain(scope),
    )  # fmt: skip
    with _scopes_lock:
        _scopes[process.pid] = scope
    return process


def start_logged(
    command: list[str], cwd: Path, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session with stdout and stderr written to `log_path` (created afresh)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return start_in_session(command, cwd, log, env)
