"""Who may use the admin listener's control endpoints (`POST /drain`, the live view).

The admin port sits on the pod IP in Kubernetes, because the kubelet probes it there. So
the probes and `/metrics` answer anyone who can reach the port, but whatever changes the
sidecar's state or shows its traffic answers only:

- a peer on loopback (127.0.0.0/8, ::1, ::ffff:127.x): the pod's own containers, such as
  the model container's preStop hook, which shares the pod's network namespace, and
  `kubectl port-forward`, which the container runtime dials to localhost inside it;
- anyone else only with `Authorization: Bearer <token>`, the token read from
  `--admin-token-file` at start.

The peer is the connection's own address (ASGI `scope["client"]`), never a header: anyone
can write `X-Forwarded-For: 127.0.0.1`. The token is compared in constant time, as SHA-256
digests, so neither its bytes nor its length leak through timing, and it never appears in
a `repr`, an error message or a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any

from sidecar.settings_values import small_file

TOKEN_MIN = 16  # characters: a shorter token could be guessed over the network
TOKEN_MAX = 4096  # bytes read from the file: a token, not a document


class AdminToken:
    """The admin bearer token. Only its digest is kept, and its repr names the file only."""

    __slots__ = ("_digest", "source")

    def __init__(self, token: bytes, source: str = "") -> None:
        self.source = source
        self._digest = hashlib.sha256(token).digest()

    def matches(self, offered: bytes) -> bool:
        return hmac.compare_digest(hashlib.sha256(offered).digest(), self._digest)

    def __repr__(self) -> str:
        return f"AdminToken(from {self.source!r})"


def token_file(path: str) -> AdminToken:
    """The token in the file at `path`, surrounding whitespace (a trailing newline) removed:
    16 to 4096 visible ASCII characters. A ValueError names the problem, never the token."""
    token = small_file(path, TOKEN_MAX, "token").strip()
    if not token:
        raise ValueError(f"{path!r} is empty; expected a token (e.g. `openssl rand -hex 32`)")
    bad = next((i for i, byte in enumerate(token) if not 0x21 <= byte <= 0x7E), None)
    if bad is not None:
        raise ValueError(
            f"the token in {path!r} has a space or a character that is not visible ASCII "
            f"at position {bad + 1}: it could not be sent in an Authorization header"
        )
    if len(token) < TOKEN_MIN:
        raise ValueError(f"the token in {path!r} is shorter than {TOKEN_MIN} characters")
    return AdminToken(token, path)


def is_loopback(host: object) -> bool:
    """Whether a peer address is loopback: 127.0.0.0/8, ::1, or IPv4-mapped ::ffff:127.x.
    Anything else, unparsable or absent, is not."""
    try:
        address = ipaddress.ip_address(str(host))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def peer(scope: Any) -> str:
    """The connection's peer as HOST:PORT, for a log line."""
    client = scope.get("client")
    if not client:
        return "an unknown peer"
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class AdminAccess:
    """Decides, per request, whether a control endpoint may answer."""

    def __init__(self, token: AdminToken | None = None) -> None:
        self.token = token

    def allows(self, scope: Any) -> bool:
        client = scope.get("client")
        if client and is_loopback(client[0]):
            return True
        return self.token is not None and self._bearer_matches(scope)

    def _bearer_matches(self, scope: Any) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":  # the first one decides, as Starlette's headers do
                scheme, _, credentials = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and self.token.matches(credentials.strip())
        return False
