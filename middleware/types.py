"""ASGI type aliases, as Starlette spells them, and sidestream's one ASGI extension."""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# `scope["extensions"][SEND_NOWAIT] = {"send": f}`: `f(body) -> bool` writes `body` as one
# more chunk (`more_body=True`) of a response already started, now, without awaiting; or
# writes nothing and returns False (flow control, a client gone, a state it does not handle),
# and the caller sends that chunk with the ASGI `send` instead, which waits as usual. A
# server that offers it writes the response head without waiting for a body byte: with the
# first body write of the loop turn `http.response.start` was sent in, or at that turn's
# end (an app needs no empty body message to get its head out).
# Offered by the sidecar's HTTP/1.1 server, passed on by StreamGuard (its own checks first,
# swapped into the same dict), used by the proxy to relay an upstream read without waking
# the request's task.
# The same dict may hold `"abort": g`: `g()` closes the connection at once and marks the
# response abandoned, so that the server does not log an app that "returned without completing
# the response" (the guard drops a slow client this way, with a line of its own).
# It may hold `"on_disconnect": None`: a slot for one listener, `h()`, that the server calls
# once, synchronously, from its connection-lost callback when the client leaves before the
# response is complete (the guard sets it, and then needs no task reading `receive()` to
# hear the client leave; a guard inside another finds it taken and reads `receive()`).
# The app may put `"stop": k` there: the guard calls `k()` the moment it stops the stream
# (client gone, a timeout, drain), before cancelling the app's task, so that the app's
# upstream is closed in the same loop turn (the proxy closes its HTTP/1.1 connection).
SEND_NOWAIT = "sidestream.send_nowait"
SendNowait = Callable[[bytes], bool]
Abort = Callable[[], None]
