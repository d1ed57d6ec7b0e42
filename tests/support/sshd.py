"""sshd for tests: a dedicated user, its own config and host key, and everything it starts killed at the end.

    user = SshUser.create()                        # useradd, key-only login, /bin/sh, home under /tmp
    server = Sshd.start(user, client_key.public)    # 127.0.0.1:<free port>, or inside a network namespace
    server.known_hosts_line                         # "[127.0.0.1]:PORT ssh-ed25519 AAAA..."
    server.stop(); user.remove()

sshd runs in a cgroup of its own (v1 `pids`, or v2), so at the end every process it forked is found and
killed, including sessions that moved to their own session id (training runs do). The user's leftovers are
swept by uid as well before `userdel`. Needs root (users, cgroups, sshd's privilege separation).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 10.0


def missing_prerequisite() -> str | None:
    """Why this machine cannot run the SSH tests, or None when it can."""
    if os.geteuid() != 0:
        return "the SSH tests create a user and start sshd, which needs root"
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (openssh-server; scripts/install-system-deps.sh installs it)"
    if shutil.which("useradd") is None:
        return "useradd is missing"
    return None


# ---------------------------------------------------------------- keys


@dataclass(frozen=True)
class KeyPair:
    """An Ed25519 key: the private key in OpenSSH format and the public `ssh-ed25519 AAAA...` line."""

    private: bytes
    public: str

    @classmethod
    def generate(cls) -> KeyPair:
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        return cls(private, public.decode())

    def write(self, path: Path) -> Path:
        """Write the private key (mode 0600), as ssh_key expects it."""
        path.write_bytes(self.private)
        path.chmod(0o600)
        return path


# ---------------------------------------------------------------- processes, cgroups


def pids_of_user(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = (entry / "status").read_text()
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            state = next(line for line in status.splitlines() if line.startswith("State:"))
            if int(uid_line.split()[1]) == uid and " Z " not in f" {state.split()[1]} ":
                found.append(int(entry.name))
    return found


def kill_until_gone(list_pids: Callable[[], list[int]], what: str) -> None:
    """SIGKILL what `list_pids()` returns until it returns nothing."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while pids := list_pids():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} would not die: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class Cgroup:
    """A cgroup (v1 `pids` hierarchy, or v2) holding a daemon and everything it forks."""

    def __init__(self, name: str) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        self.path = Path("/sys/fs/cgroup") / ("" if v2 else "pids") / name
        self.path.mkdir()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self) -> None:
        kill_until_gone(self.pids, f"processes of cgroup {self.path}")

    def remove(self) -> None:
        self.kill_all()
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while the last processes are reaped
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


# ---------------------------------------------------------------- the user


@dataclass
class SshUser:
    """A login for the tests: key only, /bin/sh, home in a temporary directory it owns."""

    name: str
    uid: int
    gid: int
    home: Path
    owned: list[Path] = field(default_factory=list)  # directories made by owned_dir, removed with the user

    @classmethod
    def create(cls) -> SshUser:
        name = f"matt{secrets.token_hex(4)}"
        home = Path(tempfile.mkdtemp(prefix=f"{name}-home-"))
        subprocess.run(
            ["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name], check=True, capture_output=True
        )
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)  # "!" counts as locked
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        home.chmod(0o755)
        return cls(name, entry.pw_uid, entry.pw_gid, home)

    def owned_dir(self, prefix: str) -> Path:
        """A new directory under /tmp that the user owns (a remote_dir)."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
        os.chown(path, self.uid, self.gid)
        path.chmod(0o755)
        self.owned.append(path)
        return path

    def processes(self) -> list[int]:
        return pids_of_user(self.uid)

    def remove(self) -> None:
        kill_until_gone(self.processes, f"processes of {self.name}")
        subprocess.run(["userdel", self.name], check=False, capture_output=True)
        for path in [self.home, *self.owned]:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def traversable(*paths: Path) -> Iterator[None]:
    """Let other users traverse the directories above `paths` (/root is 0700), put back afterwards.

    The test user runs this machine's Python (the project's venv) through sshd, so it needs to reach it.
    """
    changed: dict[Path, int] = {}
    for path in paths:
        for directory in [*reversed(path.resolve().parents), path.resolve()]:
            if directory.is_dir() and directory not in changed:
                mode = stat.S_IMODE(directory.stat().st_mode)
                if not mode & stat.S_IXOTH:
                    changed[directory] = mode
                    directory.chmod(mode | stat.S_IXOTH)
    try:
        yield
    finally:
        for directory, mode in changed.items():
            directory.chmod(mode)


# ---------------------------------------------------------------- sshd


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def wait_for_port(address: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {address}:{port} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)


@dataclass
class Sshd:
    """One sshd (`-D -e`) with its own config, host key and authorized_keys; see the module docstring."""

    address: str
    port: int
    host_key: KeyPair
    directory: Path
    proc: subprocess.Popen[bytes]
    cgroup: Cgroup
    log: Path
    netns: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(
        cls, user: SshUser, authorized: str, address: str = "127.0.0.1", netns: str | None = None
    ) -> Sshd:
        os.makedirs("/run/sshd", exist_ok=True)  # the privilege separation directory
        directory = Path(tempfile.mkdtemp(prefix="mat-sshd-"))
        directory.chmod(0o755)  # sshd reads authorized_keys as the user
        host_key = KeyPair.generate()
        host_key.write(directory / "host_ed25519")
        (directory / "authorized_keys").write_text(authorized + "\n")
        (directory / "authorized_keys").chmod(0o644)
        port = free_port() if netns is None else 22
        config = directory / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress {address}\nHostKey {directory / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {directory / 'authorized_keys'}\nPidFile {directory / 'sshd.pid'}\n"
            f"AllowUsers {user.name}\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin no\nStrictModes no\nSubsystem sftp internal-sftp\n"
            "ClientAliveInterval 5\nClientAliveCountMax 2\nMaxStartups 100\nLogLevel VERBOSE\n"
        )
        subprocess.run([SSHD, "-t", "-f", str(config)], check=True, capture_output=True)
        command = [SSHD, "-D", "-e", "-f", str(config)]
        if netns is not None:
            command = ["ip", "netns", "exec", netns, *command]
        log = directory / "sshd.log"
        cgroup = Cgroup(f"mat-sshd-{secrets.token_hex(4)}")
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        cgroup.add(proc.pid)  # before any connection: everything sshd forks lands in the cgroup
        server = cls(address, port, host_key, directory, proc, cgroup, log, netns)
        try:
            wait_for_port(address, port, proc, log)
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def host_name(self) -> str:
        """How known_hosts and ssh name this server."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        return f"{self.host_name} {self.host_key.public}\n"

    def stop(self) -> None:
        """Kill sshd and every process it forked (sessions, training runs), then clean up."""
        self.cgroup.remove()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=KILL_TIMEOUT_S)
        shutil.rmtree(self.directory, ignore_errors=True)
