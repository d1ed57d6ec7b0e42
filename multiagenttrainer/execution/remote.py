"""What the ssh and docker executors share: the layout on the target, the session helper, copying and logs.

On the target, a run's files live under one directory per run and machine:

    <remote_dir>/<run id>/<machine>/workspace/          the copy of the workspace (no .git, no links)
    <remote_dir>/<run id>/<machine>/.mat/session.pyz    session.py + processes.py, run by the target's Python
    <remote_dir>/<run id>/<machine>/.mat/sessions/<id>  the training sessions in flight (see session.py)

Copying compares fingerprints (session.tree_state) of the local workspace with the target's and sends only
the files that differ; links and special files are never sent. Copying back checks every path: relative,
no `..`, a regular file, landing inside the workspace (a link in the local workspace is replaced, never
followed). The training output reaches the log as it arrives, line by line; the helper's protocol lines
(heartbeats, the outcome) are told apart by a random nonce and never reach the log.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import secrets
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from multiagenttrainer import processes
from multiagenttrainer.config import RemoteExecution
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.execution import session
from multiagenttrainer.execution.base import RunOutcome

GRACE_S = 5.0  # between SIGTERM and SIGKILL on the target
HELPER_NAME = "session.pyz"
PYTHON_NAME = re.compile(r"python[0-9.]*")
KILLED_LINE = "[mat] killed after {:.0f} s: the run exceeded its time limit"
PENDING_MAX_BYTES = 1 << 16  # a partial line longer than this is written out without waiting for its end


class Readable(Protocol):
    """A binary file opened for reading (a local file, an SFTP file, a tar member)."""

    def read(self, size: int = -1, /) -> bytes: ...


# ---------------------------------------------------------------- layout and commands


@dataclass(frozen=True)
class Layout:
    """Where a run's files are on the target (POSIX paths)."""

    root: PurePosixPath

    @classmethod
    def for_run(cls, base: str, workspace: Path, machine: str) -> Layout:
        """`<base>/<run id>/<machine>`: the run id is the name of the workspace's run directory."""
        run_id = workspace.absolute().parent.name
        return cls(PurePosixPath(base) / safe_name(run_id) / safe_name(machine))

    @property
    def workspace(self) -> PurePosixPath:
        return self.root / "workspace"

    @property
    def helper(self) -> PurePosixPath:
        return self.root / ".mat" / HELPER_NAME

    @property
    def sessions(self) -> PurePosixPath:
        return self.root / ".mat" / "sessions"


def safe_name(name: str) -> str:
    """A run or machine name as one safe path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "run"


@functools.cache
def session_zip() -> bytes:
    """session.py and processes.py as a zip that `python3 session.pyz ACTION` runs (standard library only)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", "import sys\nfrom multiagenttrainer.execution import session\n"
                         "sys.exit(session.main())\n")  # fmt: skip
        archive.writestr("multiagenttrainer/__init__.py", "")
        archive.writestr("multiagenttrainer/execution/__init__.py", "")
        archive.write(processes.__file__, "multiagenttrainer/processes.py")
        archive.write(session.__file__, "multiagenttrainer/execution/session.py")
    return buffer.getvalue()


def helper_argv(python: str, layout: Layout, action: str, *args: str) -> list[str]:
    """The command that runs one action of the session helper on the target."""
    return [python, "-I", "-S", str(layout.helper), action, *args]


def target_command(command: list[str], python: str) -> list[str]:
    """The training command for the target: an absolute path to a Python of this machine (the interpreter
    mat runs under, as the built-in template's command has it) becomes the target's `python`."""
    first = command[0] if command else ""
    if first == sys.executable or (os.path.isabs(first) and PYTHON_NAME.fullmatch(os.path.basename(first))):
        return [python, *command[1:]]
    return list(command)


def target_env(workspace_env: Mapping[str, str], cfg: RemoteExecution) -> dict[str, str]:
    """The workspace's variables, the forwarded local ones that are set, then `execution.env`."""
    forwarded = {name: os.environ[name] for name in cfg.forward_env if name in os.environ}
    return {**workspace_env, **forwarded, **cfg.env}


def run_argv(
    cfg: RemoteExecution, layout: Layout, command: list[str], env: Mapping[str, str], run: RunSettings
) -> list[str]:
    """The session helper's `run` with everything it needs."""
    args = ["--sessions", str(layout.sessions), "--cwd", str(layout.workspace), "--nonce", run.nonce]
    args += ["--timeout-s", f"{run.timeout_s:g}"]
    args += ["--grace-s", f"{run.grace_s:g}", "--heartbeat-s", f"{run.heartbeat_s:g}"]
    for name, value in target_env(env, cfg).items():
        args += ["--env", f"{name}={value}"]
    return helper_argv(cfg.python, layout, "run", *args, "--", *target_command(command, cfg.python))


def stop_argv(cfg: RemoteExecution, layout: Layout, grace_s: float) -> list[str]:
    """The session helper's `stop`."""
    return helper_argv(
        cfg.python, layout, "stop", "--sessions", str(layout.sessions), "--grace-s", f"{grace_s:g}"
    )


def state_argv(cfg: RemoteExecution, layout: Layout) -> list[str]:
    """The session helper's `state` of the target's workspace copy."""
    return helper_argv(cfg.python, layout, "state", str(layout.workspace))


# ---------------------------------------------------------------- what to copy


@dataclass
class LocalState:
    """Fingerprints of the local workspace, recomputed only for files whose size or mtime changed."""

    cache: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # path -> (size, mtime_ns, print)

    def of(self, workspace: Path) -> dict[str, str]:
        """{relative path: fingerprint} as session.tree_state computes it, links reported as "other"."""
        state: dict[str, str] = {}
        for relative, path in walk(workspace):
            info = path.lstat()
            cached = self.cache.get(relative)
            if cached and cached[:2] == (info.st_size, info.st_mtime_ns):
                state[relative] = cached[2]
                continue
            state[relative] = session.fingerprint(path, info) if path.is_file() else session.OTHER
            self.cache[relative] = (info.st_size, info.st_mtime_ns, state[relative])
        return state


def walk(root: Path, prefix: str = "") -> list[tuple[str, Path]]:
    """(relative path, path) of the entries under `root` that are not directories; links not followed."""
    found: list[tuple[str, Path]] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in session.SKIPPED_NAMES:
            continue
        if entry.is_dir(follow_symlinks=False):
            found += walk(Path(entry.path), prefix + entry.name + "/")
        else:
            found.append((prefix + entry.name, Path(entry.path)))
    return found


def files_to_send(local: Mapping[str, str], remote: Mapping[str, str]) -> list[str]:
    """Regular local files that the target lacks or holds differently (links are never sent)."""
    return sorted(p for p, fp in local.items() if fp != session.OTHER and remote.get(p) != fp)


def parse_state(text: str, where: str) -> dict[str, str]:
    """The JSON printed by the helper's `state`."""
    try:
        state = json.loads(text)
    except ValueError:
        state = None
    if not isinstance(state, dict):
        raise ExperimentError(f"mat's session helper on {where} printed no workspace state: {text[-300:]!r}")
    return {str(k): str(v) for k, v in state.items()}


# ---------------------------------------------------------------- copying back, checked


def checked_relative(path: str) -> PurePosixPath:
    """A workspace-relative path from the target, refused when absolute, empty or going up with `..`."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or not relative.parts or ".." in relative.parts or "\0" in path:
        raise ExperimentError(f"refused to copy back {path!r}: only paths inside the workspace are copied")
    return relative


def local_destination(workspace: Path, relative: PurePosixPath) -> Path:
    """Where a copied-back file goes: directories on the way are made, and must be real directories of the
    workspace (a link there is refused, never followed)."""
    current = workspace.resolve()
    for part in relative.parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise ExperimentError(
                f"refused to copy back {str(relative)!r}: {current} is not a directory of the workspace"
            )
        current.mkdir(exist_ok=True)
    return current / relative.name


def write_file(destination: Path, source: Readable, mode: int = 0o644) -> None:
    """Write `source` to a temporary file beside `destination`, then rename it over (replacing a link)."""
    handle, temp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            for block in iter(lambda: source.read(1 << 16), b""):
                out.write(block)
        os.chmod(temp, mode & 0o755)
        os.replace(temp, destination)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- the run's output


@dataclass(frozen=True)
class RunSettings:
    """One run of the session helper: its nonce, limits and heartbeat."""

    timeout_s: float
    grace_s: float = GRACE_S
    heartbeat_s: float = 0.0
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))


class LogWriter:
    """Writes training output into the log file as it arrives, flushing at every complete line."""

    def __init__(self, log: IO[bytes]) -> None:
        self.log = log
        self.pending = b""

    def feed(self, data: bytes) -> None:
        lines, newline, self.pending = (self.pending + data).rpartition(b"\n")
        if len(self.pending) > PENDING_MAX_BYTES:  # progress bars redrawn with \r never end a line
            lines, newline, self.pending = lines + newline + self.pending, b"", b""
        if lines or newline:
            self.log.write(lines + newline)
            self.log.flush()

    def close(self) -> None:
        if self.pending:
            self.log.write(self.pending)
        self.pending = b""
        self.log.flush()


class ProtocolReader:
    """Reads the helper's stderr: `<nonce> alive`, `<nonce> {outcome}`; anything else goes to the log."""

    def __init__(self, nonce: str, log: LogWriter) -> None:
        self.prefix = nonce.encode() + b" "
        self.log = log
        self.pending = b""
        self.outcome: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            self.line(line)

    def line(self, line: bytes) -> None:
        if not line.startswith(self.prefix):
            self.log.feed(line + b"\n")  # the target's own complaints (python3: not found) are worth keeping
            return
        body = line[len(self.prefix) :].strip()
        if body == b"alive":
            return
        try:
            report = json.loads(body)
        except ValueError:
            report = None
        if isinstance(report, dict):
            self.outcome = report  # the last report counts: the helper writes its own after the command ended
        else:
            self.log.feed(line + b"\n")

    def close(self) -> None:
        if self.pending:
            self.line(self.pending)
        self.pending = b""


def outcome_of(reader: ProtocolReader, exit_status: int | None, duration_s: float, where: str) -> RunOutcome:
    """The RunOutcome from the helper's report; raises when the target's processes would not die."""
    report = reader.outcome
    if report is None:
        error = f"mat's session helper on {where} ended without a report (exit status {exit_status})"
        return RunOutcome(exit_code=exit_status, timed_out=False, duration_s=duration_s, error=error)
    exit_code = report.get("exit_code")
    if not isinstance(exit_code, int) or isinstance(exit_code, bool):
        exit_code = None
    if report.get("survivors"):
        raise ExperimentError(
            f"processes {report['survivors']} of the training session on {where} survived SIGKILL; "
            "kill them by hand"
        )
    if report.get("error"):
        error = f"cannot start the training command on {where}: {report['error']}"
        return RunOutcome(exit_code=127, timed_out=False, duration_s=duration_s, error=error)
    return RunOutcome(exit_code=exit_code, timed_out=report.get("timed_out") is True, duration_s=duration_s)


def append_killed_line(log: IO[bytes], timeout_s: float) -> None:
    """The line a local run's log gets when the run is killed for its time limit."""
    log.write(f"\n{KILLED_LINE.format(timeout_s)}\n".encode())
    log.flush()
