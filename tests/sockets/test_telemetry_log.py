"""The access log's handler (`middleware.telemetry.access_handler`): lines gathered, none lost, order kept."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from middleware.telemetry import Telemetry, configure_access_log, semconv
from middleware.telemetry.access_handler import AccessLogHandler, sole
from tests.sockets.test_telemetry_metrics import STREAM, run_streams


@pytest.fixture
def access() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """The access logger configured as the sidecar does, into a buffer; restored after."""
    log = logging.getLogger(semconv.ACCESS_LOGGER)
    saved = (log.handlers[:], log.level, log.propagate)
    out = io.StringIO()
    configure_access_log(out)
    yield log, out
    log.handlers[:], log.level, log.propagate = saved


def alone(log: logging.Logger) -> AccessLogHandler:
    """The access handler, with pytest's own capture handlers (which it adds to every
    logger during a test) taken off the logger, as in the sidecar."""
    log.handlers[:] = [h for h in log.handlers if isinstance(h, AccessLogHandler)]
    handler = sole(log)
    assert handler is not None
    return handler


async def test_stream_lines_arrive_within_the_flush_delay_one_json_object_each(
    access: tuple[logging.Logger, io.StringIO],
) -> None:
    """Rule: with configure_access_log's handler, each stream's line is written within
    FLUSH_S of its end (gathered, not per stream), one JSON object per line, none lost."""
    log, out = access
    alone(log)  # the direct path finish takes
    await run_streams(Telemetry(), [STREAM, STREAM, STREAM])
    await asyncio.sleep(AccessLogHandler.FLUSH_S + 0.1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert [json.loads(line)["outcome"] for line in lines] == ["completed"] * 3
    assert [json.loads(line)["tokens"] for line in lines] == [3, 3, 3]


async def test_lines_wait_for_the_timer_and_keep_their_order_with_logged_records(
    access: tuple[logging.Logger, io.StringIO],
) -> None:
    """Rule: inside an event loop a line is held until the timer (so a burst of streams costs
    one write), and a record logged the usual way joins the same buffer, in order."""
    log, out = access
    handler = alone(log)
    handler.write('{"n":1}')
    log.info('{"n":2}')
    handler.write('{"n":3}')
    assert out.getvalue() == ""
    await asyncio.sleep(AccessLogHandler.FLUSH_S + 0.1)
    assert out.getvalue() == '{"n":1}\n{"n":2}\n{"n":3}\n'


async def test_a_full_buffer_is_written_at_once_and_shutdown_flushes_the_rest(
    access: tuple[logging.Logger, io.StringIO],
) -> None:
    """Rule: MAX_LINES lines are written without waiting (memory stays bounded), and
    Telemetry.shutdown writes what the timer has not (nothing is lost at exit)."""
    log, out = access
    handler = alone(log)
    for n in range(AccessLogHandler.MAX_LINES + 2):
        handler.write(str(n))
    assert len(out.getvalue().splitlines()) == AccessLogHandler.MAX_LINES
    Telemetry().shutdown()
    assert out.getvalue().splitlines() == [str(n) for n in range(AccessLogHandler.MAX_LINES + 2)]


def test_without_an_event_loop_a_line_is_written_at_once(
    access: tuple[logging.Logger, io.StringIO],
) -> None:
    """Rule: no loop, no timer: the line is written before write() returns."""
    log, out = access
    handler = alone(log)
    handler.write('{"n":1}')
    assert out.getvalue() == '{"n":1}\n'


def test_the_direct_path_is_taken_only_where_logging_would_do_the_same(
    access: tuple[logging.Logger, io.StringIO],
) -> None:
    """Rule: finish skips the LogRecord only when the handler is the logger's sole way out;
    a filter, a second handler, propagation or a raised level sends lines through logging."""
    log, _ = access
    handler = alone(log)
    log.propagate = True
    assert sole(log) is None
    log.propagate = False
    log.addFilter(lambda record: True)
    assert sole(log) is None
    log.filters.clear()
    handler.addFilter(lambda record: True)
    assert sole(log) is None
    handler.filters.clear()
    handler.setLevel(logging.WARNING)
    assert sole(log) is None
    handler.setLevel(logging.NOTSET)
    log.addHandler(logging.NullHandler())
    assert sole(log) is None


def test_a_broken_stream_is_reported_not_raised(
    access: tuple[logging.Logger, io.StringIO], capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: a write that fails (stdout closed) goes to logging's error report on stderr;
    the stream's finish, or the timer that flushes, never gets the exception."""
    log, out = access
    handler = alone(log)
    out.close()
    handler.write('{"n":1}')  # no loop: written at once, and the write fails
    assert "Logging error" in capsys.readouterr().err
    assert handler.lines == []
