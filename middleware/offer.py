"""The server's `SEND_NOWAIT` extension (`middleware.types`), as a request's cycle uses it:
taking its synchronous write, and its `abort` for a client that accepts nothing."""

from __future__ import annotations

import logging
from typing import Any

from middleware.receiver import Receiver
from middleware.types import SEND_NOWAIT, Scope, SendNowait

logger = logging.getLogger("sidestream")


def offer_of(scope: Scope) -> dict[str, Any] | None:
    """The server's `SEND_NOWAIT` extension dict for this request, if it offers one."""
    offer: dict[str, Any] | None = (scope.get("extensions") or {}).get(SEND_NOWAIT)
    return offer


def take_offer(scope: Scope, ours: SendNowait, receiver: Receiver) -> SendNowait | None:
    """The server's synchronous body write, if it offers one; the app gets ours instead (our
    checks first, then the server's), never the server's own. Swapped in the extension's own
    dict rather than in a copy of the scope: a copy costs ~1 KB per open stream, and the
    server never reads the function back. Where the server offers to say when the client
    leaves (`on_disconnect`, still free: an outer guard may have taken it), the receiver
    takes it and needs no watcher task."""
    offer = offer_of(scope)
    if offer is None:
        return None
    server: SendNowait = offer["send"]
    offer["send"] = ours
    if "on_disconnect" in offer and offer["on_disconnect"] is None:
        offer["on_disconnect"] = receiver.left
        receiver.told = True
    return server


def drop_slow_client(scope: Scope, send_timeout: float | None) -> None:
    """The client accepted nothing for send_timeout: close its connection (through the
    server's `abort`, where offered, so the server logs no incomplete response) and say so
    once."""
    offer = offer_of(scope)
    if offer is not None and "abort" in offer:
        offer["abort"]()
    client = scope.get("client")
    logger.info(
        "dropped a slow client %s: it accepted nothing for %s s",
        f"{client[0]}:{client[1]}" if client else "",
        send_timeout,
    )
