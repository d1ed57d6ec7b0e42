"""dockerd for tests: started by the session with its own data root, socket and cgroup; no registry needed.

    daemon = Dockerd.start()                              # overlay2 (vfs when overlay2 will not start)
    image = daemon.import_busybox()                       # busybox-static plus /lib links, imported as a tar
    container = daemon.run_container(image, mounts=[...])  # `sleep infinity`, no network, host dirs read-only
    daemon.stop()                                         # containers removed, dockerd and its children gone

No iptables and no bridge (--iptables=false --bridge=none): containers run with `--network none`. The
image is busybox plus links into /usr, so a container that mounts this machine's /usr (and the project's
Python, read-only) can run Python without any image download.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from tests.support.sshd import Cgroup

BUSYBOX = Path("/bin/busybox")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
IMAGE = "mat-test-busybox:latest"


def missing_prerequisite() -> str | None:
    """Why this machine cannot run dockerd for the tests, or None when it can."""
    if os.geteuid() != 0:
        return "the Docker tests start their own dockerd, which needs root"
    if shutil.which("dockerd") is None:
        return "dockerd is missing (docker.io; scripts/install-system-deps.sh installs it)"
    if not BUSYBOX.is_file():
        return f"{BUSYBOX} is missing (busybox-static; scripts/install-system-deps.sh installs it)"
    return None


def busybox_rootfs() -> bytes:
    """A root file system as a tar: busybox and its applets in /bin, /lib and /lib64 pointing into /usr."""
    buffer = io.BytesIO()
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777), ("usr", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            archive.addfile(info)
        archive.add(str(BUSYBOX), "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                archive.addfile(link)
        for name in ("lib", "lib64"):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, f"usr/{name}"
            archive.addfile(link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


@dataclass
class Dockerd:
    """See the module docstring."""

    root: Path
    proc: subprocess.Popen[bytes]
    cgroup: Cgroup
    storage_driver: str
    cgroup_parent: str
    containers: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    @classmethod
    def start(cls) -> Dockerd:
        errors = []
        for driver in ("overlay2", "vfs"):
            root = Path(tempfile.mkdtemp(prefix="matd-"))  # short: a unix socket path has 108 bytes at most
            try:
                return cls.start_with(root, driver)
            except RuntimeError as exc:
                errors.append(f"{driver}: {exc}")
                shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError("dockerd did not start: " + "; ".join(errors))

    @classmethod
    def start_with(cls, root: Path, driver: str) -> Dockerd:
        cgroup_parent = f"/mat-docker-{secrets.token_hex(4)}"
        command = [
            "dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "dockerd.pid"), "--host", f"unix://{root / 'docker.sock'}",
            "--storage-driver", driver, "--iptables=false", "--ip6tables=false", "--bridge=none",
            "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", cgroup_parent,
        ]  # fmt: skip
        cgroup = Cgroup(f"mat-dockerd-{secrets.token_hex(4)}")
        with (root / "dockerd.log").open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        cgroup.add(proc.pid)
        daemon = cls(root, proc, cgroup, driver, cgroup_parent)
        try:
            daemon.wait_ready()
        except BaseException:
            daemon.stop()
            raise
        return daemon

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "dockerd.log").read_text()[-1500:])
            with (
                contextlib.suppress(docker.errors.DockerException),
                contextlib.closing(self.client()) as client,
            ):
                client.ping()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer on {self.url} after {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=60)

    def import_busybox(self) -> str:
        with contextlib.closing(self.client()) as client:
            client.api.import_image_from_data(busybox_rootfs(), repository=IMAGE.split(":")[0], tag="latest")
        return IMAGE

    def run_container(self, image: str, mounts: list[Path], name: str | None = None) -> Any:
        """A running container (`sleep infinity`, tini as init, no network) with `mounts` read-only."""
        volumes = {str(path): {"bind": str(path), "mode": "ro"} for path in mounts}
        with contextlib.closing(self.client()) as client:
            container = client.containers.run(
                image, ["sleep", "infinity"], name=name or f"mat-test-{secrets.token_hex(3)}", detach=True,
                network_mode="none", init=True, volumes=volumes,
            )  # fmt: skip
        self.containers.append(container)
        return container

    def stop(self) -> None:
        """Remove the containers, stop dockerd (and its containerd), remove its files."""
        with contextlib.suppress(docker.errors.DockerException), contextlib.closing(self.client()) as client:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self.cgroup.remove()
        self.proc.wait()
        self.unmount_leftovers()
        self.remove_cgroup_parents()
        shutil.rmtree(self.root, ignore_errors=True)

    def unmount_leftovers(self) -> None:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)

    def remove_cgroup_parents(self) -> None:
        """The per-container cgroups dockerd made under --cgroup-parent in every hierarchy (empty by now)."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            parent = hierarchy / self.cgroup_parent.lstrip("/")
            if parent.is_dir():
                for child in sorted(parent.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if child.is_dir():
                        with contextlib.suppress(OSError):
                            child.rmdir()
                with contextlib.suppress(OSError):
                    parent.rmdir()
