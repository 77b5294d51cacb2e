""" "Another pod" for tests of who may reach a listener: a network namespace joined to this
one by a veth pair, made for the test and removed after it. Traffic stays on this machine.

- `host_address`: this machine's address on the pair, a real non-loopback address. A client
  in this process that binds its socket to it reaches a listener on 0.0.0.0 from there.
- `pod_address`: the address inside the namespace. `command(...)` runs a program there, as a
  process in another pod would run; it reaches this machine's listeners at `host_address`.

Making a namespace needs root and iproute2 (`ip`). Where that fails, the machine's own
non-loopback address (the one it would use to reach 10.255.255.255) stands in, and
`command` runs programs here; with no such address either, the test fails saying so.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sidecar.admin_access import is_loopback


@dataclass(frozen=True)
class OtherPod:
    host_address: str
    pod_address: str
    namespace: str | None  # None: no namespace could be made; everything runs here

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside the other pod's namespace."""
        if self.namespace is None:
            return list(argv)
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.200.0.0/16 that no interface here uses (other test runs may hold some)."""
    taken = subprocess.run(
        ["ip", "-4", "-o", "addr"], check=True, capture_output=True, text=True
    ).stdout
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.200.{random.randrange(256)}.{4 * random.randrange(64)}/30")
        if not any(str(host) in taken for host in net.hosts()):
            return net
    raise RuntimeError("no free /30 in 10.200.0.0/16")


@contextlib.contextmanager
def _namespace() -> Iterator[OtherPod]:
    tag = f"{random.getrandbits(32):08x}"
    namespace, host_end, pod_end = f"sidestream-{tag}", f"ssh{tag}", f"ssp{tag}"
    net = _free_subnet()
    host, pod = (str(a) for a in net.hosts())
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", pod_end, "netns", namespace)
        _ip("addr", "add", f"{host}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{pod}/30", "dev", pod_end)
        _ip("-n", namespace, "link", "set", pod_end, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield OtherPod(host, pod, namespace)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=10)


def _own_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # a UDP connect sends nothing
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if is_loopback(address) or address == "0.0.0.0" else address


@contextlib.contextmanager
def other_pod() -> Iterator[OtherPod]:
    """A network namespace as another pod, or this machine's non-loopback address."""
    why = "iproute2's `ip` is not installed"
    if shutil.which("ip") is not None:
        with contextlib.ExitStack() as stack:
            try:
                pod = stack.enter_context(_namespace())
            except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
                why = (getattr(exc, "stderr", None) or str(exc)).strip()
            else:
                yield pod
                return
    address = _own_address()
    if address is None:
        pytest.fail(
            f"no non-loopback address to test from: cannot make a network namespace ({why}) "
            "and this machine has no address but loopback"
        )
    yield OtherPod(address, address, None)
