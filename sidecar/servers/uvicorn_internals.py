"""Everything the sidecar relies on of uvicorn: what its `Server` asks of the protocol class
handed to it by `Config(http=...)` (the sidecar's own, `sidecar.servers.http1`), and the
servers' main loop.

Checked against uvicorn 0.55.0 (`CHECKED`). Gate: a runtime check, `checked()` — the
version's major.minor is one checked, the `Server` methods replaced here are still there and
a `ServerState` still has the fields the protocol reads. When it says no,
`sidecar.servers.uvicorn_listener` serves with uvicorn's own `http="httptools"` protocol and
main loop, and logs one line at start. A runtime gate, not a bound in pyproject, because that
public path serves every stream correctly: what it loses is the `sidestream.send_nowait` fast
path, the request-head limits and the trailer cap (the body deadline is kept there by
`sidecar.servers.body_deadline`), not the streams' correctness, and an upper bound would
block users from uvicorn's own fixes.

The protocol's contract with `Server` (documented as `Config(http=<class>)`; the rest read in
uvicorn's `server.py`):
- the class is called once per connection with the keywords `config`, `server_state`,
  `app_state` and `_loop` (`Served.make` reads what it needs of them: the loaded app and
  the `Config` fields uvicorn's own protocols read);
- the protocol puts itself in `server_state.connections` while it is open, and each request's
  task in `server_state.tasks` until it is done: `Server.shutdown` waits for both;
- `shutdown()`, called on each open connection when the server stops: close when idle, else
  end keep-alive so the connection closes after its response;
- `server_state.default_headers` written into every response head (set by the main loop),
  and `server_state.total_requests` counted per response;
- uvicorn's loggers, by name (`ERROR_LOG`, `ACCESS_LOG`: an access line per response when
  the access logger has a handler, as uvicorn's protocols write it);
- an upgrade to a WebSocket is handed to `config.ws_protocol_class` as uvicorn's own
  protocols hand it (`hand_over`), with the same keywords.

Private names used (only when the gate says yes, except `capture_signals`): `uvicorn.Server`'s
`capture_signals` (replaced on both paths: uvicorn has no public switch for its signal
handlers, and the sidecar decides what a signal means — drain first), `main_loop` and
`on_tick` (replaced behind the gate: `EventServer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from middleware.types import ASGIApp
from sidecar.servers.listener import ExitEvent

__all__ = [
    "ACCESS_LOG",
    "CHECKED",
    "ERROR_LOG",
    "TRACE",
    "EventServer",
    "QuietServer",
    "Served",
    "checked",
    "hand_over",
]

CHECKED = ("0.55",)  # uvicorn major.minor releases this contract was read in

TRACE = 5  # uvicorn's `--log-level trace` (uvicorn.logging.TRACE_LOG_LEVEL)
# uvicorn's loggers, by name: its log configuration (`--log-level`, `--no-access-log`, a
# `log_config`) applies to the protocol's lines as to its own protocols'.
ERROR_LOG = logging.getLogger("uvicorn.error")
ACCESS_LOG = logging.getLogger("uvicorn.access")

_SERVER_HOOKS = ("capture_signals", "main_loop", "on_tick", "shutdown")
_STATE_FIELDS = ("connections", "tasks", "default_headers", "total_requests")


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed uvicorn) one this contract was checked against,
    with every `Server` method replaced or relied on here, and every `ServerState` field the
    protocol reads, still there?"""
    version = uvicorn.__version__ if version is None else version
    if ".".join(version.split(".")[:2]) not in CHECKED:
        return False
    if not all(callable(getattr(uvicorn.Server, name, None)) for name in _SERVER_HOOKS):
        return False
    state = ServerState()
    return all(hasattr(state, name) for name in _STATE_FIELDS)


class Served:
    """What a server passes each of its connections, read once per server: the protocol class
    keeps the last one it was made for, and a connection of that server shares it."""

    __slots__ = (
        "app",
        "app_state",
        "asgi_version",
        "config",
        "connections",
        "forget",
        "limit_concurrency",
        "loop",
        "reset_contextvars",
        "root_path",
        "state",
        "tasks",
        "timeout_keep_alive",
        "ws_protocol_class",
    )

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.app: ASGIApp = config.loaded_app
        self.loop = loop or asyncio.get_event_loop()
        self.state = server_state
        self.app_state = app_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.forget = self.tasks.discard  # each request task's done callback: one, not one each
        self.root_path: str = config.root_path
        self.asgi_version: str = config.asgi_version
        self.limit_concurrency: int | None = config.limit_concurrency
        self.timeout_keep_alive: float = config.timeout_keep_alive
        self.ws_protocol_class: type[asyncio.Protocol] | None = config.ws_protocol_class
        self.reset_contextvars = bool(getattr(config, "reset_contextvars", False))


def hand_over(served: Served, transport: asyncio.Transport, head: bytes) -> None:
    """A WebSocket upgrade: the connection goes to uvicorn's WebSocket protocol, made as
    uvicorn's own HTTP protocols make it, which reads the request's head again (`head`)."""
    assert served.ws_protocol_class is not None
    protocol = served.ws_protocol_class(  # type: ignore[call-arg]
        config=served.config, server_state=served.state, app_state=served.app_state
    )
    protocol.connection_made(transport)
    transport.set_protocol(protocol)
    protocol.data_received(head)


class QuietServer(ExitEvent, uvicorn.Server):
    """uvicorn without its own signal handlers: the Sidecar decides what a signal means. Its
    main loop is uvicorn's own, which polls `should_exit` (the public path's server)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        self._up = asyncio.Event()
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class EventServer(QuietServer):
    """`QuietServer` without uvicorn's 10 Hz poll of `should_exit`: the main loop waits on
    the event the flag sets, so an idle sidecar is never woken (the wake-ups of two polling
    servers showed up in benchmark windows). uvicorn's tick also refreshes the date header
    once a second; the sidecar sends none."""

    async def main_loop(self) -> None:
        # One tick sets the default headers (none: no date, no server header); uvicorn's other
        # per-tick duty, `limit_max_requests`, is never configured by the sidecar.
        await self.on_tick(0)
        await self._exit.wait()
