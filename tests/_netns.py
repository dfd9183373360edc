"""Hosts for the tests: each one a Linux network namespace with an address of its own on one bridge
(10.77.N.0/24, N a /24 no interface here uses), made with Debian's iproute2 (`ip netns`, veth pairs).
The root namespace is the bridge's .1. What listens on loopback only in the root namespace (the
machine's PostgreSQL) is reached from the hosts through `forward`: socat bound on .1, with TCP
keepalives, so a client host that vanishes has its upstream connection closed (its transaction
rolled back) in seconds, as a PostgreSQL with tcp_keepalives_idle set would. `Host.cut` pulls a
host's cable: the root end of its veth goes down and its packets are dropped, nothing is refused.
Needs root; `unavailable()` says why not."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

PREFIX = "10.77"


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None. SME2_TEST_NETNS=0 asks for the
    loopback fallback (to run it where root could make them)."""
    if os.environ.get("SME2_TEST_NETNS") == "0":
        return "SME2_TEST_NETNS=0"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool, package in (("ip", "iproute2"), ("socat", "socat")):
        if shutil.which(tool) is None:
            return f"no `{tool}` (apt-get install {package}; .ci/apt-packages.txt lists it)"
    probe = f"sme2-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    ns: str
    addr: str
    veth: str  # the root namespace's end, on the bridge

    def argv(self, argv: list[str]) -> list[str]:
        """argv run inside this host (its network namespace)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut(self) -> None:
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


class Hosts:
    """A bridge and the hosts on it; close() removes every namespace, link and forwarder it made
    (also after a failed start)."""

    def __init__(self):
        self.tag = secrets.token_hex(2)
        self.bridge = f"s2b{self.tag}"
        self.hosts: dict[str, Host] = {}
        self.forwarders: list[subprocess.Popen] = []
        self.net = f"{PREFIX}.{_free_octet()}"
        self.root = f"{self.net}.1"
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.root}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> Host:
        i = len(self.hosts) + 2
        host = Host(name, f"sme2-{self.tag}-{name}", f"{self.net}.{i}", f"s2{self.tag}v{i}")
        self.hosts[name] = host
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")
        return host

    def forward(self, port: int, upstream: tuple[str, int]) -> tuple[str, int]:
        """The root namespace's upstream (e.g. 127.0.0.1:5432) at (bridge address, port) for the hosts."""
        listen = f"TCP-LISTEN:{port},bind={self.root},reuseaddr,fork,keepalive,keepidle=5,keepintvl=2,keepcnt=3"
        self.forwarders.append(subprocess.Popen(["socat", listen, f"TCP:{upstream[0]}:{upstream[1]}"],
                                                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self.root, port

    def close(self) -> None:
        for p in self.forwarders:
            p.kill()
            p.wait()
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)  # gone with its peer's namespace
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _free_octet() -> int:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for _ in range(64):
        n = 1 + secrets.randbelow(250)
        if f" {PREFIX}.{n}." not in used:
            return n
    raise RuntimeError(f"no free {PREFIX}.N.0/24 here")
