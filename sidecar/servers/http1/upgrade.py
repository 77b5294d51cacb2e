"""A request that asks to upgrade the connection (`Upgrades`): one for a WebSocket goes to
uvicorn's WebSocket protocol when the server has one (`uvicorn_internals.hand_over`), as
uvicorn's own protocols hand it; any other is warned about and left to the parser, which
stops at it. The sidecar's own app refuses a WebSocket (`sidecar.proxy`); the handover
is kept so the protocol serves any app as uvicorn's own would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sidecar.servers.http1.connection import upgrade
from sidecar.servers.uvicorn_internals import TRACE, Served, hand_over

_NO_LIBRARY = (
    "No supported WebSocket library detected. Please use \"pip install 'uvicorn[standard]'\", "
    "or install 'websockets' or 'wsproto' manually."
)


class Upgrades:
    """The protocol's upgrade decisions and the handover. Its fields are the protocol's."""

    __slots__ = ()

    logger: logging.Logger
    served: Served
    transport: asyncio.Transport
    headers: list[tuple[bytes, bytes]]
    scope: dict[str, Any]
    url: bytes
    _refused: bool
    _trace: Callable[[str], None]

    def _should_upgrade(self) -> bool:
        """The request asks for a WebSocket, and the server has a protocol for it."""
        wanted = upgrade(self.headers) if self.headers else None
        return wanted == b"websocket" and self.served.ws_protocol_class is not None

    def _hand_over(self) -> None:
        if self.logger.level <= TRACE:
            self._trace("Upgrading to WebSocket")
        self.served.connections.discard(self)
        head = [self.scope["method"].encode(), b" ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.scope["headers"]:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        hand_over(self.served, self.transport, b"".join(head))

    def _unsupported_upgrade_warning(self) -> None:
        if self._refused:  # CONNECT already answered: nothing to warn about
            return
        self.logger.warning("Unsupported upgrade request.")
        if self.served.ws_protocol_class is None:
            self.logger.warning(_NO_LIBRARY)
