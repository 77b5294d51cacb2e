"""The end of one request's telemetry: its summary, handed to each sink in use.

Runs once per request, after the cycle has run (terminal event written, app stopped).
`summary.Summary` computes what the stream came to; the sinks (`sinks.span`, `sinks.metrics`,
`sinks.access`, chosen by `Telemetry(sinks=...)`) each report it their way, in that order.
"""

from __future__ import annotations

import time

from middleware.telemetry.summary import Cycle, Record, Summary


def finish(record: Record, cycle: Cycle, failure: BaseException | None) -> None:
    """Summarise the stream `cycle` ran (`failure`: what `cycle.run()` raised, if anything) and
    hand the summary to every sink."""
    summary = Summary(record, cycle, failure, time.monotonic())
    for sink in record.telemetry.sinks:
        sink(summary)
