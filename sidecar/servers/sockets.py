"""The listening sockets, made by the sidecar itself before any server starts.

Every listener is bound before any listens, and all listen before any serves: a port in use
(or a certificate that does not load) ends start-up while no port accepts, so a client that
connects during a failed start-up is refused, never accepted and then reset. The servers
get the listening sockets (`serve(sockets=[sock])`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl

BACKLOG = 4096


class StartupError(Exception):
    """Start-up cannot go on: one line naming the flag, the address or file, and the cause."""


def bind(flag: str, address: tuple[str, int]) -> socket.socket:
    """A TCP socket bound to `address` (not listening yet); StartupError names `flag`."""
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"--{flag} {format_address(address)}: {exc}") from None
    return sock


def bind_all(addresses: dict[str, tuple[str, int]]) -> dict[str, socket.socket]:
    """Bind one socket per flag, or close those bound and raise for the first that fails."""
    bound: dict[str, socket.socket] = {}
    try:
        for flag, address in addresses.items():
            bound[flag] = bind(flag, address)
    except StartupError:
        for sock in bound.values():
            sock.close()
        raise
    return bound


def listen_all(sockets: dict[str, socket.socket]) -> None:
    for sock in sockets.values():
        sock.listen(BACKLOG)
        sock.setblocking(False)


def check_certificate(certfile: str | None, keyfile: str | None) -> None:
    """Load the traffic listener's certificate and key once, before binding, so a bad file
    ends start-up like a port in use. The message names the files, never their content."""
    if certfile is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:  # before OSError, its base class
        cause = f"not a PEM certificate with its private key ({exc.reason or 'PEM lib'})"
        raise StartupError(f"--certfile {certfile} --keyfile {keyfile}: {cause}") from None
    except OSError as exc:
        cause = exc.strerror or str(exc)
        raise StartupError(
            f"--certfile {certfile} --keyfile {keyfile}: cannot load the certificate and key: "
            f"{cause}"
        ) from None


def format_address(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bound_address(sock: socket.socket) -> str:
    """HOST:PORT the socket is bound to (the port the system chose for port 0)."""
    return format_address(sock.getsockname())


def close_all(sockets: dict[str, socket.socket]) -> None:
    for sock in sockets.values():
        with contextlib.suppress(OSError):
            sock.close()
