"""Session fixtures for tests that run things over SSH: a login key, a dedicated user, sshd on 127.0.0.1.

Import them into a conftest (`from tests.support.ssh_fixtures import client_key, ssh_user, sshd`). The user
runs this machine's Python (the project's venv) through sshd, so the directories above that interpreter are
made traversable for the session; sshd and everything it started are stopped at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sshd as sshd_support
from tests.support.sshd import KeyPair, Sshd, SshUser, traversable

PYTHON_DIRS = [Path(sys.prefix), Path(sys.base_prefix).resolve()]  # the venv and the interpreter under it


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyPair, Path]:
    """The key mat logs in with: (key pair, private key file)."""
    key = KeyPair.generate()
    return key, key.write(tmp_path_factory.mktemp("ssh-client") / "id_ed25519")


@pytest.fixture(scope="session")
def ssh_user() -> Iterator[SshUser]:
    """A dedicated login for the session, allowed to run this machine's Python."""
    reason = sshd_support.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
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
