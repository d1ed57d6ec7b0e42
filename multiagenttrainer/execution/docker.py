"""Run training inside a running container (Docker SDK).

    prepare   check that the container runs; put the session helper and the workspace into
              <container_dir>/<run id>/<machine>/ as one tar (put_archive)
    sync      ask the helper for the fingerprints of the copy; put a tar of the files that differ
    run       exec `python3 session.pyz run ...`: output streamed (demuxed) into the local log line by line;
              the helper runs the command in a new session and kills the whole tree on timeout, checked gone
    fetch     get_archive, every member checked before anything is written: only regular files and
              directories under the requested path; absolute paths, `..`, links and devices are refused
    stop      exec `session.pyz stop`: every recorded training session in the container killed, checked gone

A container that is missing or not running is a MachineError naming it and the command that starts it.
Layout in the container, copying rules and the helper's protocol: remote.py and session.py.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import requests

from multiagenttrainer.config import DockerExecution
from multiagenttrainer.errors import ExperimentError, MachineError
from multiagenttrainer.execution.base import RunOutcome
from multiagenttrainer.execution.remote import (
    GRACE_S,
    Layout,
    LocalState,
    LogWriter,
    ProtocolReader,
    RunSettings,
    append_killed_line,
    checked_relative,
    files_to_send,
    local_destination,
    outcome_of,
    parse_state,
    run_argv,
    session_zip,
    state_argv,
    stop_argv,
    write_file,
)

log = logging.getLogger(__name__)

API_TIMEOUT_S = 60  # a silent stream fails after this; the helper's heartbeat keeps a run's stream talking
HEARTBEAT_S = 10.0
DEADLINE_MARGIN_S = 60.0  # beyond timeout + grace, mat stops the run itself
DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


# ---------------------------------------------------------------- tar archives


def add_file(archive: tarfile.TarFile, name: str, data: bytes | None, path: Path | None = None) -> None:
    """Add a regular file from bytes or from `path` (mode and mtime kept, owner root)."""
    info = tarfile.TarInfo(name)
    if path is not None:
        status = path.stat()
        info.size, info.mode, info.mtime = status.st_size, status.st_mode & 0o755, int(status.st_mtime)
        with path.open("rb") as handle:
            archive.addfile(info, handle)
        return
    assert data is not None
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    archive.addfile(info, io.BytesIO(data))


def workspace_tar(workspace: Path, layout: Layout, paths: list[str], helper: bool) -> bytes:
    """A tar to put at `/`: the given workspace files (and the session helper) at their place in `layout`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        if helper:
            add_file(archive, str(layout.helper).lstrip("/"), session_zip())
            directory = tarfile.TarInfo(str(layout.sessions).lstrip("/"))
            directory.type, directory.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(directory)
        for relative in paths:
            add_file(archive, str(layout.workspace / relative).lstrip("/"), None, workspace / relative)
    return buffer.getvalue()


def checked_members(archive: tarfile.TarFile, top: str, where: str) -> list[tarfile.TarInfo]:
    """The members of a copied-back archive, all checked before anything is written.

    Every name must be `top` or lie below it, relative and without `..`; only regular files and directories
    are accepted (symbolic and hard links, devices and fifos are refused).
    """
    members = archive.getmembers()
    for member in members:
        name = member.name
        relative = PurePosixPath(name)
        inside = relative.parts[:1] == (top,) and ".." not in relative.parts and not relative.is_absolute()
        if not inside or name.startswith("/") or ".." in name.split("/"):
            raise ExperimentError(
                f"refused to copy back {name!r} from {where}: it would land outside the workspace"
            )
        if not (member.isreg() or member.isdir()):
            kind = "a link" if (member.issym() or member.islnk()) else "not a regular file"
            raise ExperimentError(f"refused to copy back {name!r} from {where}: it is {kind}")
    return members


def extract_members(
    archive: tarfile.TarFile, members: list[tarfile.TarInfo], workspace: Path, base: PurePosixPath
) -> None:
    """Write the checked regular files under `workspace/base` (directories are made as needed)."""
    for member in members:
        if not member.isreg():
            continue
        destination = local_destination(workspace, checked_relative(str(base / member.name)))
        source = archive.extractfile(member)
        assert source is not None
        write_file(destination, source, member.mode)


# ---------------------------------------------------------------- the executor


class DockerExecutor:
    """Runs training inside one running container; see the module docstring."""

    def __init__(
        self, cfg: DockerExecution, machine_name: str = "docker", *, grace_s: float = GRACE_S
    ) -> None:
        self.cfg = cfg
        self.name = machine_name
        self.grace_s = grace_s
        self.where = f"container {cfg.container!r}"
        self._client: docker.DockerClient | None = None
        self._local = LocalState()
        self._prepared: set[Path] = set()

    # ------------------------------------------------------------ the daemon and the container

    def client(self) -> docker.DockerClient:
        """A client of the configured daemon (execution.docker_host, else DOCKER_HOST or the default)."""
        if self._client is None:
            try:
                if self.cfg.docker_host:
                    self._client = docker.DockerClient(base_url=self.cfg.docker_host, timeout=API_TIMEOUT_S)
                else:
                    self._client = docker.from_env(timeout=API_TIMEOUT_S)
            except DOCKER_ERRORS as exc:
                raise MachineError(
                    f"cannot reach the Docker daemon for {self.where} ({exc}); start dockerd, or set "
                    "execution.docker_host or DOCKER_HOST"
                ) from exc
        return self._client

    def container(self) -> Any:
        """The container, checked to be running."""
        name = self.cfg.container
        try:
            container = self.client().containers.get(name)
        except docker.errors.NotFound:
            raise MachineError(
                f"there is no {self.where}; start one (`docker run -d --name {name} IMAGE sleep infinity`) "
                "or fix execution.container"
            ) from None
        except DOCKER_ERRORS as exc:
            raise MachineError(f"cannot look up {self.where}: {exc}; check that dockerd runs") from exc
        if container.status != "running":
            raise MachineError(
                f"{self.where} is not running ({container.status}); start it with `docker start {name}`"
            )
        return container

    def api_call(self, action: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """A low-level API call with Docker's errors translated."""
        try:
            return call(*args, **kwargs)
        except docker.errors.NotFound as exc:
            raise MachineError(f"{self.where} is gone ({exc}) while {action}; start it again") from exc
        except DOCKER_ERRORS as exc:
            raise MachineError(f"{action} in {self.where} failed: {exc}") from exc

    def exec_capture(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        """Run a short command in the container; (exit code, stdout, stderr)."""
        api = self.client().api
        exec_id = self.api_call("starting a command", api.exec_create, self.cfg.container, argv)["Id"]
        out, err = self.api_call("running a command", api.exec_start, exec_id, demux=True)
        code = self.api_call("reading an exit code", api.exec_inspect, exec_id)["ExitCode"]
        return int(code if code is not None else -1), out or b"", err or b""

    def helper(self, argv: list[str]) -> bytes:
        """Run a session-helper action; its stdout, or a MachineError saying why it could not run."""
        code, out, err = self.exec_capture(argv)
        if code != 0:
            raise MachineError(
                f"{self.where}: `{self.cfg.python}` could not run mat's session helper (exit {code}: "
                f"{err.decode(errors='replace').strip()[-300:]}); install Python 3 there or set "
                "execution.python"
            )
        return out

    # ------------------------------------------------------------ copying

    def layout(self, workspace: Path) -> Layout:
        return Layout.for_run(self.cfg.container_dir, workspace, self.name)

    def put(self, workspace: Path, paths: list[str], helper: bool) -> None:
        data = workspace_tar(workspace, self.layout(workspace), paths, helper)
        self.api_call("copying the workspace", self.container().put_archive, "/", data)
        if paths:
            log.info("sent %d file(s) to %s: %s", len(paths), self.where, ", ".join(paths[:5]))

    def sync_now(self, workspace: Path) -> None:
        """Put whatever differs between the workspace and its copy in the container."""
        output = self.helper(state_argv(self.cfg, self.layout(workspace))).decode(errors="replace")
        remote = parse_state(output, self.where)
        local = self._local.of(workspace)
        others = [p for p in files_to_send(local, remote) if remote.get(p) == "other"]
        if others:  # a link or directory in the way: tar extraction would follow or keep it
            self.helper(["rm", "-rf", *(str(self.layout(workspace).workspace / p) for p in others)])
        self.put(workspace, files_to_send(local, remote), helper=False)

    def prepare(self, workspace: Path) -> None:
        """Check the container, put the session helper and every workspace file in it."""
        if not workspace.is_dir():
            raise ExperimentError(f"workspace {workspace} does not exist; set the run up again")
        self.container()
        self.put(workspace, [], helper=True)
        self.sync_now(workspace)
        self._prepared.add(workspace)

    def sync(self, workspace: Path, paths: list[str]) -> None:
        """Put the files that differ (train.py, or whatever a run changed there)."""
        if workspace not in self._prepared:
            self.prepare(workspace)
            return
        self.container()
        self.sync_now(workspace)

    def fetch(self, workspace: Path, paths: list[str]) -> None:
        """Copy files or directories back into the workspace, every member checked first."""
        container = self.container()
        for path in paths:
            relative = checked_relative(path)
            try:
                stream, _ = container.get_archive(str(self.layout(workspace).workspace / relative))
            except docker.errors.NotFound:
                continue
            except DOCKER_ERRORS as exc:
                raise MachineError(f"copying {path!r} back from {self.where} failed: {exc}") from exc
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as archive:
                members = checked_members(archive, relative.name, self.where)
                extract_members(archive, members, workspace, relative.parent)

    # ------------------------------------------------------------ running

    def start_run(
        self, workspace: Path, command: list[str], env: dict[str, str], settings: RunSettings
    ) -> tuple[str, Any]:
        """Create and start the helper's exec; (exec id, stream of (stdout, stderr) chunks)."""
        api = self.client().api
        argv = run_argv(self.cfg, self.layout(workspace), command, env, settings)
        workdir = str(self.layout(workspace).workspace)
        exec_id = self.api_call(
            "starting training", api.exec_create, self.cfg.container, argv, workdir=workdir
        )["Id"]
        stream = self.api_call("starting training", api.exec_start, exec_id, stream=True, demux=True)
        return exec_id, stream

    def pump(
        self, chunks: Iterator[tuple[bytes | None, bytes | None]], writer: LogWriter, reader: ProtocolReader
    ) -> None:
        """Copy the run's output into the log as it arrives."""
        for out, err in chunks:
            if out:
                writer.feed(out)
            if err:
                reader.feed(err)

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome:
        """Run `command` in the container's copy, output into `log_path`, the whole tree killed on timeout."""
        started = time.monotonic()
        self.container()
        settings = RunSettings(timeout_s, self.grace_s, heartbeat_s=HEARTBEAT_S)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            writer = LogWriter(log_file)
            reader = ProtocolReader(settings.nonce, writer)
            exec_id, stream = self.start_run(workspace, command, env, settings)
            guard = threading.Timer(timeout_s + self.grace_s + DEADLINE_MARGIN_S, self.stop, [workspace])
            guard.start()
            try:
                self.pump(stream, writer, reader)
            except DOCKER_ERRORS + (OSError,) as exc:
                writer.feed(f"\n[mat] lost the stream from {self.where}: {exc}\n".encode())
            finally:
                guard.cancel()
                stream.close()
            reader.close()
            writer.close()
            code = self.api_call("reading the exit code", self.client().api.exec_inspect, exec_id)["ExitCode"]
            outcome = outcome_of(reader, code, time.monotonic() - started, self.where)
            if outcome.error and reader.outcome is None:
                outcome = self.explain(outcome)
            if outcome.timed_out:
                append_killed_line(log_file, timeout_s)
        return outcome

    def explain(self, outcome: RunOutcome) -> RunOutcome:
        """A run without the helper's report: say so, naming the container when it stopped."""
        try:
            self.container()
        except MachineError as exc:
            return RunOutcome(
                outcome.exit_code, False, outcome.duration_s, error=f"training was cut short: {exc}"
            )
        return outcome

    def stop(self, workspace: Path) -> None:
        """Kill every training session recorded in the container for this workspace (logged, never raised)."""
        try:
            self.container()
            code, out, err = self.exec_capture(stop_argv(self.cfg, self.layout(workspace), self.grace_s))
            if code != 0:
                if b"can't open file" not in err:  # the helper was never put there: nothing ran
                    log.error(
                        "stopping training in %s failed: %s", self.where, err.decode(errors="replace")[-300:]
                    )
                return
            survivors = json.loads(out).get("survivors")
            if survivors:
                log.error("processes %s in %s survived SIGKILL; kill them by hand", survivors, self.where)
        except (MachineError, ValueError) as exc:
            log.error("could not stop the training in %s: %s", self.where, exc)

    def cleanup(self) -> None:
        """Close the client; the copy in the container stays for inspection."""
        if self._client is not None:
            self._client.close()
            self._client = None
