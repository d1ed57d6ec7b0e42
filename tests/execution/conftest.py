"""Session-wide targets for the executor tests: sshd on 127.0.0.1, sshd in a network namespace, dockerd.

Each daemon is started once per session by these fixtures and stopped at the end with everything it ran.
The SSH login is a dedicated user created for the session; it runs this machine's Python (the project's
venv) through sshd, so the directories above that interpreter are made traversable for the session. A
container mounts /usr and that Python read-only, so it trains with the same packages.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.config import DockerExecution, SshExecution
from tests.support import dockerd as dockerd_support
from tests.support import netns as netns_support
from tests.support import sshd as sshd_support
from tests.support.dockerd import Dockerd
from tests.support.netns import Netns
from tests.support.sshd import KeyPair, Sshd, SshUser, traversable

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIRS = [Path(sys.prefix), Path(sys.base_prefix).resolve()]  # the venv and the interpreter under it


def skip_unless(reason: str | None) -> None:
    if reason is not None:
        pytest.skip(reason)


# ---------------------------------------------------------------- ssh


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyPair, Path]:
    """The key mat logs in with: (key pair, private key file)."""
    key = KeyPair.generate()
    return key, key.write(tmp_path_factory.mktemp("ssh-client") / "id_ed25519")


@pytest.fixture(scope="session")
def ssh_user() -> Iterator[SshUser]:
    """A dedicated login for the session, allowed to run this machine's Python."""
    skip_unless(sshd_support.missing_prerequisite())
    user = SshUser.create()
    try:
        with traversable(Path(sys.executable), *PYTHON_DIRS):
            yield user
    finally:
        user.remove()


@pytest.fixture(scope="session")
def sshd(ssh_user: SshUser, client_key: tuple[KeyPair, Path]) -> Iterator[Sshd]:
    """sshd on 127.0.0.1 (a free port) accepting the client key for `ssh_user`."""
    server = Sshd.start(ssh_user, client_key[0].public)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def netns_host(ssh_user: SshUser, client_key: tuple[KeyPair, Path]) -> Iterator[tuple[Netns, Sshd]]:
    """A second host: sshd on port 22 of a network namespace, reached over a veth link."""
    skip_unless(netns_support.missing_prerequisite())
    with Netns.create() as ns:
        server = Sshd.start(ssh_user, client_key[0].public, address=ns.guest_ip, netns=ns.name)
        try:
            yield ns, server
        finally:
            server.stop()


@pytest.fixture
def ssh_config(
    ssh_user: SshUser, client_key: tuple[KeyPair, Path], tmp_path: Path
) -> Callable[..., SshExecution]:
    """`ssh_config(server, **fields)`: SshExecution for a test server, host key known, a new remote_dir."""

    def make(server: Sshd, known: str | None = None, **fields: Any) -> SshExecution:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(server.known_hosts_line if known is None else known)
        values: dict[str, Any] = {
            "type": "ssh",
            "ssh_host": f"{ssh_user.name}@{server.address}:{server.port}",
            "ssh_key": str(client_key[1]),
            "known_hosts": str(known_hosts),
            "remote_dir": str(ssh_user.owned_dir("mat-remote-")),
            "python": sys.executable,
            "connect_timeout": 5,
            "alive_timeout": 5,
        }
        return SshExecution.model_validate({**values, **fields})

    return make


# ---------------------------------------------------------------- docker


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """dockerd for the session (own data root and socket, no iptables, no bridge)."""
    skip_unless(dockerd_support.missing_prerequisite())
    daemon = Dockerd.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def busybox_image(dockerd: Dockerd) -> str:
    return dockerd.import_busybox()


@pytest.fixture(scope="session")
def container(dockerd: Dockerd, busybox_image: str) -> Any:
    """A running container with /usr and this machine's Python mounted read-only."""
    return dockerd.run_container(busybox_image, [Path("/usr"), *PYTHON_DIRS])


@pytest.fixture
def docker_config(dockerd: Dockerd, container: Any, tmp_path: Path) -> Callable[..., DockerExecution]:
    """`docker_config(**fields)`: a DockerExecution for the session's container, a fresh container_dir."""

    def make(**fields: Any) -> DockerExecution:
        values: dict[str, Any] = {
            "type": "docker",
            "container": container.name,
            "container_dir": f"/tmp/mat-runs-{tmp_path.name}",
            "docker_host": dockerd.url,
            "python": sys.executable,
        }
        return DockerExecution.model_validate({**values, **fields})

    return make


# ---------------------------------------------------------------- workspaces


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace at <tmp>/<run id>/workspace, the layout mat's runs have."""
    path = tmp_path / "20250101-000000-test" / "workspace"
    path.mkdir(parents=True)
    return path


# ---------------------------------------------------------------- sources to train on


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 40 KB of mat's own modules: enough to train and evaluate on."""
    root = tmp_path_factory.mktemp("tiny-source")
    modules = (REPO_ROOT / "multiagenttrainer").rglob("*.py")
    files = sorted(p for p in modules if 2000 < p.stat().st_size < 8000)
    for path in files[:10]:
        target = root / path.relative_to(REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return root
