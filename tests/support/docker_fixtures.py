"""Session fixtures for tests that run things in containers: dockerd and the busybox image (tests/support).

Import them into a conftest (`from tests.support.docker_fixtures import busybox_image, dockerd`); dockerd is
stopped at the end with every container it ran. Skipped where dockerd cannot run (see dockerd.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import dockerd as dockerd_support
from tests.support.dockerd import Dockerd


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """dockerd for the session (own data root and socket, no iptables, no bridge)."""
    reason = dockerd_support.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    daemon = Dockerd.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def busybox_image(dockerd: Dockerd) -> str:
    """busybox plus links into /usr, imported without a registry."""
    return dockerd.import_busybox()
