"""A second "host" for tests: a network namespace joined to this one by a veth pair (10.x.y.1 <-> 10.x.y.2).

    with Netns.create() as ns:
        sshd = Sshd.start(user, key, address=ns.guest_ip, netns=ns.name)
        ns.link_down(); ns.link_up()     # the host-side end of the link: packets stop, nothing is reset
        ns.pids()                        # every process running in the namespace

Only the network is separate: processes in the namespace see this machine's files and users. Everything
is removed at the end (processes in the namespace killed, the veth pair and the namespace deleted).
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.sshd import kill_until_gone


def missing_prerequisite() -> str | None:
    """Why this machine cannot create network namespaces, or None when it can."""
    if shutil.which("ip") is None:
        return "ip (iproute2) is missing; scripts/install-system-deps.sh installs it"
    probe = f"matprobe{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def unused_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no interface or route here uses."""
    taken = ip("-4", "route", "show", "table", "all") + ip("-4", "addr", "show")
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if f"{subnet.network_address}".rsplit(".", 1)[0] + "." not in taken:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test namespace")


@dataclass
class Netns:
    """See the module docstring."""

    name: str
    host_if: str
    host_ip: str
    guest_ip: str

    @classmethod
    @contextmanager
    def create(cls) -> Iterator[Netns]:
        token = secrets.token_hex(3)
        subnet = unused_subnet()
        host_ip, guest_ip = str(subnet.network_address + 1), str(subnet.network_address + 2)
        ns = cls(f"matns-{token}", f"mtv{token}a", host_ip, guest_ip)
        guest_if = f"mtv{token}b"
        ip("netns", "add", ns.name)
        try:
            ip("link", "add", ns.host_if, "type", "veth", "peer", "name", guest_if)
            ip("link", "set", guest_if, "netns", ns.name)
            ip("addr", "add", f"{host_ip}/24", "dev", ns.host_if)
            ip("link", "set", ns.host_if, "up")
            ip("-n", ns.name, "addr", "add", f"{guest_ip}/24", "dev", guest_if)
            ip("-n", ns.name, "link", "set", guest_if, "up")
            ip("-n", ns.name, "link", "set", "lo", "up")
            yield ns
        finally:
            ns.remove()

    def pids(self) -> list[int]:
        """Processes running in the namespace."""
        done = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def link_down(self) -> None:
        ip("link", "set", self.host_if, "down")

    def link_up(self) -> None:
        ip("link", "set", self.host_if, "up")

    def remove(self) -> None:
        kill_until_gone(self.pids, f"processes in network namespace {self.name}")
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
