"""The access log's own handler: each stream's JSON line written within a quarter second,
the lines of that time in one write.

A `logging` record and a write + flush per stream cost as much as the rest of the line's
work together. So `configure_access_log` installs `AccessLogHandler`, and where it is
the access logger's only way out (`sole`), the access sink (`sinks.access`) hands it the
line directly,
without a `LogRecord`; the handler gathers lines and writes them at once, `FLUSH_S` after
the first — nginx's `access_log ... buffer= flush=`. Lines from anywhere else (a record
logged the usual way) go through `emit` into the same buffer, so the order is kept.

Deliberate choices (do not "fix" these):

- The delay is only where an event loop runs in the writing thread (the guard's case):
  there a timer flushes. Without one (a script, another thread) a line is written at once.
- Nothing is lost at exit: `Telemetry.shutdown` flushes, and `logging`'s own exit hook
  flushes every handler; a killed process loses at most the last `FLUSH_S` of lines.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import IO

from middleware.telemetry import semconv

__all__ = ["AccessLogHandler", "configure_access_log", "sole"]


class AccessLogHandler(logging.Handler):
    """Writes whole lines to `stream`, gathered for up to `FLUSH_S` (see the module doc)."""

    FLUSH_S = 0.25
    MAX_LINES = 1024  # written at once beyond this, whatever the timer

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.lines: list[str] = []
        self.timer: asyncio.TimerHandle | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:
            self.handleError(record)

    def write(self, line: str) -> None:
        """Add one line (no line end); written within `FLUSH_S`, or now without a loop."""
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            self.lines.append(line)
            if self.timer is not None:  # a write is due already, unless the buffer is full
                if len(self.lines) >= self.MAX_LINES:
                    self._write_out()
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop, no timer: now
                self._write_out()
                return
            self.timer = loop.call_later(self.FLUSH_S, self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_out()

    def _write_out(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.lines:
            text = "\n".join(self.lines) + "\n"
            self.lines.clear()
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:  # a closed or broken stdout: reported as logging reports it
                self.handleError(logging.makeLogRecord({"msg": text}))

    def close(self) -> None:
        self.flush()
        super().close()


def sole(log: logging.Logger) -> AccessLogHandler | None:
    """`log`'s `AccessLogHandler` when it is the only place a record would go and nothing
    would filter one (so handing it the line is what logging would have done), else None."""
    handlers = log.handlers
    if len(handlers) != 1 or log.propagate or log.filters:
        return None
    handler = handlers[0]
    if type(handler) is not AccessLogHandler or handler.filters or handler.level > logging.INFO:
        return None
    return handler


def configure_access_log(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Send the access log (one JSON object per line, nothing around it) to `stream`, each
    line within a quarter second (`access_handler.AccessLogHandler`)."""
    log = logging.getLogger(semconv.ACCESS_LOGGER)
    handler = AccessLogHandler(stream or sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
