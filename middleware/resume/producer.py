"""One generating stream's resume state: its stamper and log, its readers, its grace period.

The cycle holds it as `resumable` and calls it three times: at the stream's start (made by
the hub), when its client leaves (`reader_left`: the stream goes on into the store with no
one to write to, and the grace period starts once no reader is left), and at its end
(`end`: the log's tail and end). Resume requests on this replica join and leave it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from middleware.dialects import select
from middleware.errors import Cancelled, Outcome, StreamError
from middleware.phases import Phase
from middleware.speedups import compiled

if TYPE_CHECKING:
    from middleware.resume.stamper import Stamper
else:  # stamper.py compiled by Cython (setup.py), where it was built: the same source
    _stamper = compiled("middleware.resume._stamper")
    if _stamper is not None:
        Stamper = _stamper.Stamper
    else:
        from middleware.resume.stamper import Stamper
from middleware.resume.store import ProducerLog
from middleware.sse import LineState
from middleware.stream_response import terminal_event
from middleware.types import Message

if TYPE_CHECKING:
    from middleware.cycle import Cycle

logger = logging.getLogger("sidestream")


class GraceExpired(StreamError):
    """What a reader resuming after the grace period's cancel reads at the end."""

    status = 410
    type = "cancelled"
    code = "resume_grace_expired"
    outcome = Outcome.GRACE_EXPIRED
    default_message = "no reader came back within the grace period; generation was cancelled"


class Cut(StreamError):
    """A stream that ended without its own end (its client left before resume began)."""

    code = "stream_incomplete"
    default_message = "the stream ended before it was complete"


class Ended:
    """A stream's log once the stream has run: what telemetry reads, and nothing else.

    A cycle is a reference cycle (its receiver calls back into it), freed by the collector's
    passes, not at once; the log it pointed to is dropped from it here so that the events
    are freed when the store lets them go, not when the collector comes round."""

    __slots__ = ("end_seen", "max_bytes", "resumes")

    def __init__(self, log: ProducerLog) -> None:
        self.resumes = log.resumes
        self.end_seen = log.end_seen
        self.max_bytes = log.max_bytes

    def append(self, event: bytes) -> None:
        pass

    def retract(self, count: int) -> None:
        pass

    def end(self, tail: bytes, outcome: str) -> None:
        pass

    async def remote_readers(self) -> bool:
        return False


async def _discard(message: Message) -> None:
    """The original client's send once it has left: the stream goes on into the store."""


class Producer:
    """See the module docstring."""

    __slots__ = (
        "_timer",
        "client_saw_end",
        "cycle",
        "ended",
        "grace",
        "live",
        "log",
        "readers",
        "stamper",
        "stream_id",
    )

    def __init__(
        self,
        cycle: Cycle,
        stream_id: str,
        log: ProducerLog,
        grace: float,
        live: dict[str, Producer],
    ) -> None:
        self.cycle: Cycle | None = cycle
        self.stream_id = stream_id
        self.log = log
        self.stamper = Stamper(stream_id, log, log.max_bytes)
        self.grace = grace
        self.live = live  # the hub's producers on this replica, by id
        self.readers = 1  # the original client
        self.ended = False
        self.client_saw_end = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def resumes(self) -> int:
        return self.log.resumes

    @property
    def end_seen(self) -> bool:
        return self.client_saw_end or self.log.end_seen

    def reader_left(self) -> bool:
        """The original client left: no more writes to it, and no cancel yet (True)."""
        cycle = self.cycle
        if cycle is None:
            return False
        cycle.downstream = _discard
        cycle.server_nowait = None
        self.left()
        return True

    def joined(self) -> None:
        self.readers += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def left(self) -> None:
        self.readers -= 1
        if self.readers <= 0 and not self.ended and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.grace, self._grace_over)

    def _grace_over(self) -> None:
        self._timer = None
        asyncio.get_running_loop().create_task(self._check_grace())

    async def _check_grace(self) -> None:
        """No reader here: unless one is attached on another replica, cancel the upstream."""
        try:
            elsewhere = await self.log.remote_readers()
        except Exception:
            elsewhere = False
        if self.ended or self.readers > 0:
            return
        if elsewhere:  # look again in a second
            self._timer = asyncio.get_running_loop().call_later(1.0, self._grace_over)
            return
        if self.cycle is not None:
            self.cycle._abort(Outcome.GRACE_EXPIRED)

    def stop(self) -> None:
        """DELETE: cancel the upstream now; every reader ends with `cancelled`."""
        if self.cycle is not None:
            self.cycle._abort(Cancelled())

    def end(self) -> None:
        """The cycle has run: the log's tail (the terminal event its client did not get
        through the stamper) and its end."""
        if self.ended:
            return
        self.ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.live.pop(self.stream_id, None)
        cycle = self.cycle
        assert cycle is not None
        # No reference back to the cycle once it has run: the cycle holds this producer, and a
        # reference cycle would keep the stream's events alive past the store's bounds until
        # the collector's next full pass.
        self.cycle = None
        # A reader saw the end: the client, still there; or a resumed reader attached here now,
        # which reads the end next (the log's own flag counts those that read it already).
        client = not cycle.receiver.client_gone
        self.client_saw_end = (client and cycle.phase is Phase.DONE) or self.readers > client
        outcome = cycle.outcome
        if cycle.edit is not None and outcome is not Outcome.COMPLETED:
            # The stamper stores it as the stream's last event, like any other.
            error = cycle.error or _error_for(outcome)
            dialect = cycle.dialect or select(cycle.scope.get("path", ""))
            stamper = self.stamper
            stamper.before = stamper.first = None  # its own end: not the client's edit's
            state = LineState.LINE if stamper.at_start else LineState.MID
            if stamper.at_boundary:
                state = LineState.EVENT
            stamper(terminal_event(dialect, error.error_object(), state, sse=True))
        self.log.end(b"", str(outcome))
        self.log = self.stamper.log = Ended(self.log)


def _error_for(outcome: Outcome) -> StreamError:
    if outcome is Outcome.GRACE_EXPIRED:
        return GraceExpired()
    if outcome is Outcome.CANCELLED:
        return Cancelled()
    return Cut()
