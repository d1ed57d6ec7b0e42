"""Run training on a host over SSH (paramiko), with its host key verified.

    prepare   connect, create <remote_dir>/<run id>/<machine>/, send the session helper and the workspace
    sync      ask the helper for the fingerprints of the remote copy; send the files that differ (train.py,
              or anything a training run changed there, such as the evaluator)
    run       `python3 session.pyz run ...` over one channel: the output streams into the local log line by
              line, the helper enforces the timeout on the host (session killed and checked gone) and sends
              heartbeats; silence for alive_timeout, or a closed connection, ends the run as a crash with the
              reason, and the next call reconnects (connect_attempts tries, with backoff)
    fetch     copy files back over SFTP, every path checked (remote.py)
    stop      `session.pyz stop`: every recorded training session on the host killed and checked gone

Host keys come from ~/.ssh/known_hosts and `execution.known_hosts`. An unknown host is refused with the
`ssh-keyscan` line to run, unless `host_key_policy: accept_new` records its key; a changed key is always
refused. Layout on the host, copying rules and the helper's protocol: remote.py and session.py.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import io
import json
import logging
import select
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

import paramiko

from multiagenttrainer.config import SshExecution, expand_path
from multiagenttrainer.errors import ExperimentError, MachineError
from multiagenttrainer.execution.base import RunOutcome
from multiagenttrainer.execution.remote import (
    GRACE_S,
    KILLED_LINE,
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

T = TypeVar("T")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
BACKOFF_S = 1.0  # first pause between connection attempts; doubled after each
DEADLINE_MARGIN_S = 30.0  # beyond timeout + grace + alive_timeout, mat stops waiting for the host's report
POLL_S = 0.25
NO_KEYS = "No authentication methods available"  # paramiko's words when it has no key to try
TRANSIENT = (EOFError, TimeoutError, ConnectionError, paramiko.SSHException)  # a broken connection


class ConnectionLost(ConnectionError):
    """The connection stopped answering in the middle of a run."""


class RunOverdue(Exception):
    """The host sent no outcome long after the run's time limit (its helper is stuck or gone)."""


class HelperSilent(Exception):
    """The session helper stopped sending heartbeats while the connection still answers (it died)."""


# ---------------------------------------------------------------- host keys


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...`, as `ssh-keygen -l` and ssh print it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_hosts_name(host: str, port: int) -> str:
    """How known_hosts names a host: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def keyscan_line(host: str, port: int, known_hosts: str) -> str:
    """The command that records a host's keys in a known_hosts file."""
    target = known_hosts if known_hosts == DEFAULT_KNOWN_HOSTS else shlex.quote(known_hosts)
    return f"ssh-keyscan -p {port} {shlex.quote(host)} >> {target}"


class UnknownHost(Exception):
    """The host is not in any known_hosts file (raised by RefuseUnknown)."""

    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__(fingerprint(key))
        self.key = key


class RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse a host whose key is not known (the default: host_key_policy strict)."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHost(key)


class RecordNew(paramiko.MissingHostKeyPolicy):
    """Accept a host seen for the first time and append its key to a known_hosts file (accept_new)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line()
        assert line is not None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.path.open("a", encoding="ascii") as handle:
            handle.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("recorded the new host key %s of %s in %s", fingerprint(key), hostname, self.path)


# ---------------------------------------------------------------- the connection


@dataclass
class Connection:
    """An open SSH connection with its SFTP session and the absolute base directory on the host."""

    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient
    base: str

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None:
            raise ConnectionLost("the connection is closed")
        return transport

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def shell_command(argv: list[str]) -> str:
    """A command line for the login shell on the host."""
    return " ".join(shlex.quote(arg) for arg in argv)


def describe(exc: BaseException) -> str:
    """A short reason for a connection failure."""
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    return str(exc) or type(exc).__name__


class SshExecutor:
    """Runs training on one SSH host; see the module docstring."""

    def __init__(
        self,
        cfg: SshExecution,
        machine_name: str = "ssh",
        *,
        grace_s: float = GRACE_S,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self.cfg = cfg
        self.name = machine_name
        self.grace_s = grace_s
        self.backoff_s = backoff_s
        user, self.host, self.port = cfg.address()
        self.user = user or getpass.getuser()
        self.where = f"ssh host {self.user}@{known_hosts_name(self.host, self.port)}"
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._local = LocalState()
        self._prepared: set[Path] = set()

    # ------------------------------------------------------------ connecting

    def known_hosts_file(self) -> Path:
        """Where accept_new records keys: execution.known_hosts, else ~/.ssh/known_hosts."""
        return expand_path(self.cfg.known_hosts or DEFAULT_KNOWN_HOSTS)

    def new_client(self) -> paramiko.SSHClient:
        """A client with the known host keys loaded and the configured policy for unknown hosts."""
        client = paramiko.SSHClient()
        try:
            client.load_system_host_keys()
            if self.cfg.known_hosts and self.known_hosts_file().is_file():
                client.load_host_keys(str(self.known_hosts_file()))
        except (OSError, paramiko.SSHException) as exc:
            raise MachineError(f"cannot read the known_hosts files for {self.where}: {exc}") from exc
        accept = self.cfg.host_key_policy == "accept_new"
        client.set_missing_host_key_policy(RecordNew(self.known_hosts_file()) if accept else RefuseUnknown())
        return client

    def key_file(self) -> str | None:
        """execution.ssh_key expanded, checked to exist."""
        if self.cfg.ssh_key is None:
            return None
        path = expand_path(self.cfg.ssh_key)
        if not path.is_file():
            raise MachineError(
                f"ssh_key {self.cfg.ssh_key} of {self.where} is not a file; fix execution.ssh_key"
            )
        return str(path)

    def open_client(self) -> paramiko.SSHClient:
        """Connect and authenticate, host key verified; transient failures raise TRANSIENT or OSError."""
        client, key = self.new_client(), self.key_file()
        timeout = self.cfg.connect_timeout
        try:
            client.connect(
                self.host, self.port, self.user, key_filename=key, look_for_keys=key is None,
                allow_agent=True, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                channel_timeout=timeout,
            )  # fmt: skip
        except BaseException:
            client.close()
            raise
        return client

    def connect_once(self) -> Connection:
        """One connection attempt; host key and authentication problems are MachineErrors at once."""
        try:
            client = self.open_client()
        except UnknownHost as exc:
            raise MachineError(self.unknown_host_message(exc.key)) from None
        except paramiko.BadHostKeyException as exc:
            raise MachineError(self.changed_key_message(exc.key, exc.expected_key)) from None
        except paramiko.PasswordRequiredException as exc:
            raise MachineError(
                f"the ssh_key for {self.where} is encrypted; add it to the SSH agent (ssh-add KEY) "
                "and leave execution.ssh_key unset"
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise MachineError(
                f"{self.where} refused the keys offered ({exc}); add the public key to "
                f"~{self.user}/.ssh/authorized_keys there, or set execution.ssh_key"
            ) from None
        except paramiko.SSHException as exc:
            if NO_KEYS not in str(exc):
                raise
            raise MachineError(
                f"no SSH key to offer {self.where}: set execution.ssh_key, add a key to the SSH agent "
                "(ssh-add), or put one at ~/.ssh/id_ed25519"
            ) from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, int(self.cfg.alive_timeout / 3)))
        sftp = client.open_sftp()
        sftp.get_channel().settimeout(self.cfg.alive_timeout)  # type: ignore[union-attr]
        return Connection(client, sftp, self.remote_base(sftp))

    def remote_base(self, sftp: paramiko.SFTPClient) -> str:
        """remote_dir as an absolute path (`~/x` and relative paths are under the login's home)."""
        remote_dir = self.cfg.remote_dir
        if remote_dir.startswith("/"):
            return remote_dir
        home = sftp.normalize(".")
        return str(PurePosixPath(home) / remote_dir.removeprefix("~").lstrip("/"))

    def unknown_host_message(self, key: paramiko.PKey) -> str:
        line = keyscan_line(self.host, self.port, self.cfg.known_hosts or DEFAULT_KNOWN_HOSTS)
        return (
            f"{self.where} is not in known_hosts (it offers {key.get_name()} key {fingerprint(key)}); "
            f"check that fingerprint, then run `{line}`, or set execution.host_key_policy: accept_new"
        )

    def changed_key_message(self, got: paramiko.PKey, expected: paramiko.PKey) -> str:
        name = shlex.quote(known_hosts_name(self.host, self.port))
        remove = f"ssh-keygen -R {name} -f {self.known_hosts_file()}"
        return (
            f"the host key of {self.where} has CHANGED: it offers {got.get_name()} {fingerprint(got)}, "
            f"known_hosts has {fingerprint(expected)}. Someone may be intercepting the connection; if the "
            f"host was reinstalled, remove the old key with `{remove}` and record the new one"
        )

    def connection(self) -> Connection:
        """The open connection, or a new one (connect_attempts tries, pauses doubling, on network errors)."""
        with self._lock:
            if self._conn is not None and self._conn.alive():
                return self._conn
            self.drop()
            last: BaseException | None = None
            for attempt in range(self.cfg.connect_attempts):
                if attempt:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    self._conn = self.connect_once()
                    return self._conn
                except (*TRANSIENT, OSError) as exc:
                    last = exc
                    log.warning(
                        "connecting to %s failed (attempt %d): %s", self.where, attempt + 1, describe(exc)
                    )
        tries = f"{self.cfg.connect_attempts} attempt{'s' if self.cfg.connect_attempts > 1 else ''}"
        raise MachineError(
            f"cannot reach {self.where}: {describe(last) if last else 'no attempt'} ({tries}); check that "
            "the host is up and sshd listens there"
        ) from last

    def drop(self, conn: Connection | None = None) -> None:
        """Close the connection (the given one, if it is still the current one)."""
        current = self._conn
        if current is not None and (conn is None or conn is current):
            self._conn = None
            current.close()
        elif conn is not None:
            conn.close()

    def with_connection(self, action: str, work: Callable[[Connection], T]) -> T:
        """Run `work` on the connection; when the connection breaks, reconnect and run it once more."""
        for attempt in (1, 2):
            conn = self.connection()
            try:
                return work(conn)
            except TRANSIENT as exc:
                self.drop(conn)
                if attempt == 2:
                    raise MachineError(
                        f"lost the connection to {self.where} while {action}: {describe(exc)}"
                    ) from exc
                log.warning(
                    "lost the connection to %s while %s (%s); reconnecting", self.where, action, describe(exc)
                )
            except OSError as exc:
                raise MachineError(f"{self.where}: {action} failed: {exc}") from exc
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ commands on the host

    def open_channel(self, conn: Connection, argv: list[str]) -> paramiko.Channel:
        """Start `argv` on the host; a host that does not acknowledge within alive_timeout counts as lost."""
        guard = threading.Timer(self.cfg.alive_timeout, conn.close)
        guard.start()
        try:
            channel = conn.transport.open_session(timeout=self.cfg.alive_timeout)
            channel.exec_command(shell_command(argv))
        finally:
            guard.cancel()
        return channel

    def capture(self, conn: Connection, argv: list[str]) -> tuple[int, bytes, bytes]:
        """Run a short command on the host; (exit status, stdout, stderr)."""
        channel = self.open_channel(conn, argv)
        channel.settimeout(self.cfg.alive_timeout)
        try:
            out = b"".join(iter(lambda: channel.recv(1 << 16), b""))
            err = b"".join(iter(lambda: channel.recv_stderr(1 << 16), b""))
            return channel.recv_exit_status(), out, err
        finally:
            channel.close()

    def helper(self, conn: Connection, argv: list[str]) -> bytes:
        """Run a session-helper action; its stdout, or a MachineError saying why it could not run."""
        status, out, err = self.capture(conn, argv)
        if status != 0:
            raise MachineError(
                f"{self.where}: `{self.cfg.python}` could not run mat's session helper (exit {status}: "
                f"{err.decode(errors='replace').strip()[-300:]}); install Python 3 there or set "
                "execution.python"
            )
        return out

    # ------------------------------------------------------------ copying

    def layout(self, conn: Connection, workspace: Path) -> Layout:
        return Layout.for_run(conn.base, workspace, self.name)

    def makedirs(self, conn: Connection, path: PurePosixPath, known: set[str]) -> None:
        """mkdir -p over SFTP, remembering the directories that exist."""
        for directory in [*reversed(path.parents), path]:
            if str(directory) in known or str(directory) == "/":
                continue
            try:
                conn.sftp.stat(str(directory))
            except FileNotFoundError:
                conn.sftp.mkdir(str(directory))
            known.add(str(directory))

    def send(
        self, conn: Connection, workspace: Path, layout: Layout, paths: list[str], remote: dict[str, str]
    ) -> None:
        """Copy files to the host with their mode and mtime; a link or other entry in the way is removed."""
        known: set[str] = set()
        for relative in paths:
            local, target = workspace / relative, layout.workspace / relative
            self.makedirs(conn, target.parent, known)
            if remote.get(relative) == "other":
                conn.sftp.remove(str(target))
            info = local.stat()
            conn.sftp.put(str(local), str(target), confirm=False)
            conn.sftp.utime(str(target), (int(info.st_atime), int(info.st_mtime)))
            conn.sftp.chmod(str(target), info.st_mode & 0o755)
        if paths:
            log.info("sent %d file(s) to %s: %s", len(paths), self.where, ", ".join(paths[:5]))

    def sync_now(self, conn: Connection, workspace: Path) -> None:
        """Send whatever differs between the workspace and its copy on the host."""
        layout = self.layout(conn, workspace)
        remote = parse_state(
            self.helper(conn, state_argv(self.cfg, layout)).decode(errors="replace"), self.where
        )
        self.send(conn, workspace, layout, files_to_send(self._local.of(workspace), remote), remote)

    def prepare_now(self, conn: Connection, workspace: Path) -> None:
        """Create the run's directories, send the session helper, then the workspace."""
        layout = self.layout(conn, workspace)
        known: set[str] = set()
        self.makedirs(conn, layout.sessions, known)
        self.makedirs(conn, layout.workspace, known)
        conn.sftp.putfo(io.BytesIO(session_zip()), str(layout.helper), confirm=False)
        self.sync_now(conn, workspace)

    def prepare(self, workspace: Path) -> None:
        """Make the workspace available on the host: the run's directory, the helper, every file once."""
        if not workspace.is_dir():
            raise ExperimentError(f"workspace {workspace} does not exist; set the run up again")
        self.with_connection("copying the workspace", lambda conn: self.prepare_now(conn, workspace))
        self._prepared.add(workspace)

    def sync(self, workspace: Path, paths: list[str]) -> None:
        """Send the files that differ on the host (train.py, or whatever a run changed there)."""
        if workspace not in self._prepared:
            self.prepare(workspace)
            return
        self.with_connection("copying the workspace", lambda conn: self.sync_now(conn, workspace))

    def fetch_now(self, conn: Connection, workspace: Path, paths: list[str]) -> None:
        layout = self.layout(conn, workspace)
        for path in paths:
            relative = checked_relative(path)
            remote = str(layout.workspace / relative)
            try:
                info = conn.sftp.lstat(remote)
            except FileNotFoundError:
                continue
            if info.st_mode is None or not stat.S_ISREG(info.st_mode):
                raise ExperimentError(
                    f"refused to copy back {path!r} from {self.where}: it is not a regular file"
                )
            destination = local_destination(workspace, relative)
            with conn.sftp.open(remote, "rb") as source:
                write_file(destination, source, info.st_mode)

    def fetch(self, workspace: Path, paths: list[str]) -> None:
        """Copy files back from the host's copy into the workspace (missing ones are skipped)."""
        self.with_connection("copying files back", lambda conn: self.fetch_now(conn, workspace, paths))

    # ------------------------------------------------------------ running

    def stream(
        self,
        conn: Connection,
        channel: paramiko.Channel,
        writer: LogWriter,
        reader: ProtocolReader,
        deadline: float,
    ) -> int | None:
        """Copy the run's output as it arrives until the channel ends; its exit status (None if none came)."""
        with contextlib.closing(channel):
            return self.pump(conn, channel, writer, reader, deadline)

    def pump(
        self,
        conn: Connection,
        channel: paramiko.Channel,
        writer: LogWriter,
        reader: ProtocolReader,
        deadline: float,
    ) -> int | None:
        """The loop of `stream`: read both streams, watch for silence, a closed connection, the deadline."""
        seen = time.monotonic()
        while not (channel.eof_received and not channel.recv_ready() and not channel.recv_stderr_ready()):
            got = False
            while channel.recv_ready():
                writer.feed(channel.recv(1 << 16))
                got = True
            while channel.recv_stderr_ready():
                reader.feed(channel.recv_stderr(1 << 16))
                got = True
            now = time.monotonic()
            seen = now if got else seen
            if not conn.alive():
                raise ConnectionLost("the connection closed")
            if now - seen > self.cfg.alive_timeout:
                self.raise_silence(conn)
            if now > deadline:
                raise RunOverdue()
            if not got:
                select.select([channel], [], [], POLL_S)
        channel.status_event.wait(self.cfg.alive_timeout)
        return channel.exit_status if channel.exit_status_ready() else None

    def raise_silence(self, conn: Connection) -> None:
        """After alive_timeout of silence: HelperSilent if the host still answers, else ConnectionLost."""
        try:
            self.capture(conn, ["true"])
        except (*TRANSIENT, OSError):
            raise ConnectionLost(f"no answer for {self.cfg.alive_timeout:.0f} s") from None
        raise HelperSilent()

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome:
        """Run `command` in the host's copy, output into `log_path`; a lost connection is a crash."""
        started = time.monotonic()
        conn = self.connection()
        settings = RunSettings(timeout_s, self.grace_s, heartbeat_s=self.cfg.alive_timeout / 3)
        argv = run_argv(self.cfg, self.layout(conn, workspace), command, env, settings)
        deadline = started + timeout_s + self.grace_s + self.cfg.alive_timeout + DEADLINE_MARGIN_S
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            writer = LogWriter(log_file)
            reader = ProtocolReader(settings.nonce, writer)
            try:
                status = self.stream(conn, self.open_channel(conn, argv), writer, reader, deadline)
            except (HelperSilent, RunOverdue, *TRANSIENT, OSError) as exc:
                return self.ended_early(exc, conn, workspace, writer, time.monotonic() - started, timeout_s)
            reader.close()
            writer.close()
            outcome = outcome_of(reader, status, time.monotonic() - started, self.where)
            if outcome.timed_out:
                append_killed_line(log_file, timeout_s)
        return outcome

    def ended_early(
        self,
        exc: BaseException,
        conn: Connection,
        workspace: Path,
        writer: LogWriter,
        duration_s: float,
        timeout_s: float,
    ) -> RunOutcome:
        """The outcome of a run that sent no report: overdue (stopped, timed out), its helper silent, or
        its connection lost (dropped; the next call reconnects). The last two are crashes with the reason."""
        if isinstance(exc, RunOverdue):
            self.stop(workspace)
            writer.feed(f"\n{KILLED_LINE.format(timeout_s)}\n".encode())
            writer.close()
            return RunOutcome(exit_code=None, timed_out=True, duration_s=duration_s)
        if isinstance(exc, HelperSilent):
            reason = (
                f"mat's session helper on {self.where} stopped answering while the connection is up; "
                "the next run stops what it left"
            )
        else:
            self.drop(conn)
            reason = f"lost the connection to {self.where} during training: {describe(exc)}"
        writer.feed(f"\n[mat] {reason}\n".encode())
        writer.close()
        log.warning("%s", reason)
        return RunOutcome(exit_code=None, timed_out=False, duration_s=duration_s, error=reason)

    # ------------------------------------------------------------ stopping

    def stop(self, workspace: Path) -> None:
        """Kill the training sessions recorded on the host for this workspace, checked gone; never raises."""
        current = self._conn
        conn = current if current is not None and current.alive() else None
        try:
            conn = conn or self.connect_once()
            status, out, err = self.capture(
                conn, stop_argv(self.cfg, self.layout(conn, workspace), self.grace_s)
            )
            if status != 0:
                if b"can't open file" not in err:  # the helper was never sent: nothing ran there
                    log.error(
                        "stopping training on %s failed: %s", self.where, err.decode(errors="replace")[-300:]
                    )
                return
            report = json.loads(out)
            if report.get("survivors"):
                log.error(
                    "processes %s on %s survived SIGKILL; kill them by hand", report["survivors"], self.where
                )
        except (MachineError, *TRANSIENT, OSError, ValueError) as exc:
            log.error(
                "could not stop the training on %s (%s); its time limit there ends it",
                self.where,
                describe(exc),
            )
        finally:
            if conn is not None and conn is not current:
                conn.close()

    def cleanup(self) -> None:
        """Close the connection; the copy on the host stays for inspection."""
        with self._lock:
            self.drop()
