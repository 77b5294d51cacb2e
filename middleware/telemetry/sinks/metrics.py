"""The metrics sink: a stream's measurements, into the locally aggregated instruments.

For a GenAI operation (`summary.genai`): duration (by error type when it failed), token usage
by type, and for a streamed one the time to first chunk and the gaps between chunks (folded in
at once, `gaps.ChunkHistogram`). For a stream (`kinds.STREAM`) alone: streams and
cancellations by outcome, keep-alives, and how long a cancelled stream took to stop. Other
traffic (a CORS preflight, a model listing, a health probe) records nothing. The instruments
are `Telemetry`'s (`instruments.LocalHistogram`, `LocalCounter`), which every collection and
export reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from middleware.errors import Outcome
from middleware.telemetry import semconv
from middleware.telemetry.instruments import Key, LocalCounter, LocalHistogram, series
from middleware.telemetry.kinds import STREAM
from middleware.telemetry.summary import FAILURE_VALUES

if TYPE_CHECKING:
    from middleware.telemetry.gaps import ChunkHistogram
    from middleware.telemetry.summary import Summary

# The outcomes of a stream whose producer the guard cancelled (by value, as `FAILURE_VALUES`).
_CANCELLED = frozenset(
    FAILURE_VALUES | {Outcome.CLIENT_DISCONNECTED.value, Outcome.SLOW_CLIENT.value}
)


BOUND_MOST = 1024  # attribute sets whose series are kept resolved (`MetricsSink._bind`)


class _Bound:
    """The series of one GenAI attribute set, resolved once: its key (for the chunk histogram
    and the by-error duration) and its aggregations in the duration, time to first chunk and
    token usage (input, output) instruments."""

    __slots__ = ("duration", "input", "key", "output", "ttfc")

    def __init__(self, sink: MetricsSink, key: Key) -> None:
        self.key = key
        self.duration = sink.duration.series_of(key)
        self.ttfc = sink.ttfc.series_of(key)
        attributes = dict(key)
        by_input = series({**attributes, semconv.GEN_AI_TOKEN_TYPE: "input"})
        by_output = series({**attributes, semconv.GEN_AI_TOKEN_TYPE: "output"})
        self.input = sink.token_usage.series_of(by_input)
        self.output = sink.token_usage.series_of(by_output)


class MetricsSink:
    """Records each stream's measurements in the instruments given."""

    name = "metrics"

    def __init__(
        self,
        *,
        duration: LocalHistogram,
        ttfc: LocalHistogram,
        chunks: ChunkHistogram,
        token_usage: LocalHistogram,
        streams: LocalCounter,
        keepalives: LocalCounter,
        cancellations: LocalCounter,
        cancel_latency: LocalHistogram,
    ) -> None:
        self.duration = duration
        self.ttfc = ttfc
        self.chunks = chunks
        self.token_usage = token_usage
        self.streams = streams
        self.keepalives = keepalives
        self.cancellations = cancellations
        self.cancel_latency = cancel_latency
        # A stream's attribute set (`Summary.series`, as built: its items in their order) ->
        # its series, resolved once rather than keyed and looked up per measurement.
        self._bound: dict[tuple[tuple[str, str | int], ...], _Bound] = {}

    def emit(self, summary: Summary) -> None:
        if summary.genai:
            self._genai(summary)
        if summary.kind is STREAM:
            self._stream(summary)

    def _genai(self, summary: Summary) -> None:
        """A GenAI operation's: its duration, its tokens, and a stream's chunk times."""
        attributes = summary.series
        items = tuple(attributes.items())
        bound = self._bound.get(items) or self._bind(items)
        error_type = summary.error_type
        if error_type is not None:
            by_error = series({**attributes, semconv.ERROR_TYPE: error_type})
            self.duration.record(summary.duration, by_error)
        else:
            self.duration.record_in(bound.duration, summary.duration)
        if summary.streaming:
            if summary.ttft is not None:
                self.ttfc.record_in(bound.ttfc, summary.ttft)
            self.chunks.fold(summary.gaps, bound.key)
        input_tokens, output_tokens = summary.input_tokens, summary.output_tokens
        if input_tokens is not None:
            self.token_usage.record_in(bound.input, input_tokens)
        if output_tokens is not None:
            self.token_usage.record_in(bound.output, output_tokens)

    def _bind(self, items: tuple[tuple[str, str | int], ...]) -> _Bound:
        """Resolve the series of a new attribute set. The model is the client's to name, so
        the sets are not bounded: past `BOUND_MOST` the resolved ones are dropped (and are
        resolved again as they recur), as the instruments' series stay."""
        if len(self._bound) >= BOUND_MOST:
            self._bound.clear()
        made = self._bound[items] = _Bound(self, series(dict(items)))
        return made

    def _stream(self, summary: Summary) -> None:
        """A stream's (and only a stream's): its outcome, keep-alives and cancellation."""
        outcome = summary.outcome_value
        by_outcome = ((semconv.OUTCOME, outcome),)
        self.streams.add(1, by_outcome)
        if summary.keepalives:
            self.keepalives.add(summary.keepalives)
        if summary.aborted_at is not None and outcome in _CANCELLED:
            self.cancellations.add(1, by_outcome)
            if summary.cancel_latency is not None:
                self.cancel_latency.record(summary.cancel_latency, by_outcome)
