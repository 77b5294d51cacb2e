"""Telemetry's process-wide part: providers, instruments, Prometheus text, the access logger.

A `Pipeline` is built once per process (tracer, meter, instruments, logger); its subclass
`middleware.telemetry.Telemetry` is what `StreamGuard(..., telemetry=...)` takes (`None`
there means off and costs nothing per chunk). Each request runs as an
`observed.ObservedCycle` with a `record.StreamRecord`. Names live in
`middleware.telemetry.semconv`.

Deliberate choices (do not "fix" these):

- `from_env` exports over OTLP/HTTP only where an OTLP endpoint is configured
  (`OTEL_EXPORTER_OTLP_ENDPOINT` or the per-signal `..._TRACES_ENDPOINT` /
  `..._METRICS_ENDPOINT`), or `OTEL_{TRACES,METRICS}_EXPORTER=otlp` says so explicitly; the
  SDK's own default (localhost:4318) would log a connection error every few seconds on every
  install without a collector. With no trace exporter no spans are made at all; metrics and
  the access log still work (Prometheus text is always there).
- The per-stream instruments are not SDK instruments: they are aggregated here
  (`instruments`, and `gaps` for `time_per_output_chunk`) and added to every
  collection and export by `instruments.WithLocal` and `metrics()`. Only the active-streams gauge, an
  observable read at collection, is the SDK's own.
- `from_env` makes direct spans (`direct`), not SDK `Span` objects: the same exported span
  for a fraction of the CPU; code inside the guard cannot add to it. Where the installed
  OpenTelemetry is not a version `otel_sdk` was checked against, SDK spans and the SDK's own
  OTLP exporter instead (one warning says so).
- A stream's end is a `summary.Summary` handed to sinks (`sinks`): the span, the metrics, the
  access line. `sinks=` (or `SIDESTREAM_TELEMETRY_SINKS=span,metrics,access`, `none` for
  none; unset, all three) chooses them; Prometheus text keeps the active-streams gauge
  whatever is chosen.
- Each request is classified once, at its end (`kinds`): a stream, a GenAI call that did not
  stream, or other traffic. Every request gets a span; GenAI metrics and names are for
  streams and calls; `sidestream.streams` and the active-streams gauge count streams alone;
  other traffic (a CORS preflight, a model listing) gets an access line only with
  `access_all` (`SIDESTREAM_TELEMETRY_ACCESS_ALL`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from opentelemetry import propagate
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Tracer

from middleware.registry import StreamRegistry
from middleware.telemetry import otel_sdk, semconv
from middleware.telemetry.access_handler import configure_access_log
from middleware.telemetry.direct import DirectSpans
from middleware.telemetry.gaps import ChunkHistogram
from middleware.telemetry.instruments import LocalCounter, LocalHistogram, WithLocal
from middleware.telemetry.kinds import streams_in
from middleware.telemetry.prometheus import CONTENT_TYPE, exposition
from middleware.telemetry.sinks import ACCESS_ALL, SINKS, chosen_sinks, parse_sinks, parse_switch
from middleware.telemetry.sinks.access import AccessSink
from middleware.telemetry.sinks.metrics import MetricsSink
from middleware.telemetry.sinks.span import SpanSink
from middleware.usage_hide import LEFT_UNCHANGED

if TYPE_CHECKING:
    from middleware.telemetry.summary import Summary

__all__ = [
    "CONTENT_TYPE",
    "Pipeline",
    "SpanKind",
    "configure_access_log",
    "prometheus_text",
]

logger = logging.getLogger("sidestream")


def _observe_usage_unchanged(options: CallbackOptions) -> Iterable[Observation]:
    yield Observation(LEFT_UNCHANGED.value)


class Pipeline:
    """Process-wide telemetry: providers, instruments, the access logger, the chunk histogram.

    Spans: `span_processor` gets direct spans (`direct`: written at the stream's
    end, sampled and identified as `tracer_provider`'s configuration says — a provider from
    the OTEL_* variables when none is given — and handed to this processor only, not to the
    provider's others); `tracer_provider` alone makes SDK spans, for every processor it has;
    neither, no spans. (Without `otel_sdk.checked()`, `span_processor` is added to the
    provider and SDK spans are made.) `metric_readers` are extra plain readers (tests);
    `metric_exporters` are exported periodically with the chunk histogram added. `sinks`
    names the outputs of a stream's end in use (`sinks.SINKS`: span, metrics, access).
    `semconv_opt_in` is OTEL_SEMCONV_STABILITY_OPT_IN's value (read from the environment when
    None), which spells some GenAI names (`semconv.genai_names`). `access_all`: an access line
    for every request, not only for streams and GenAI calls (`kinds`).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        span_processor: SpanProcessor | None = None,
        metric_readers: Sequence[MetricReader] = (),
        metric_exporters: Sequence[MetricExporter] = (),
        resource: Resource | None = None,
        span_kind: SpanKind = SpanKind.SERVER,
        server_address: str | None = None,
        server_port: int | None = None,
        provider_name: str | None = None,
        capture_content: bool = False,
        capture_limit: int = 4096,
        propagator: TextMapPropagator | None = None,
        sinks: Collection[str] = SINKS,
        semconv_opt_in: str | None = None,
        access_all: bool = False,
    ) -> None:
        self.sink_names = chosen_sinks(sinks)
        self.access_all = access_all
        if semconv_opt_in is None:
            semconv_opt_in = os.environ.get(semconv.SEMCONV_OPT_IN, "")
        # Read once, here: the GenAI names every stream is reported under.
        self.genai_names = semconv.genai_names(semconv_opt_in)
        self.span_kind = span_kind
        self.server_address = server_address
        self.server_port = server_port
        self.provider_name = provider_name
        self.capture_content = capture_content
        self.capture_limit = capture_limit
        self.propagator = propagator if propagator is not None else propagate.get_global_textmap()
        self.propagation_fields = frozenset(f.encode() for f in self.propagator.fields)
        resource = resource or Resource.create()
        self.tracer: Tracer | None = None
        self.direct: DirectSpans | None = None
        spans = "span" in self.sink_names
        if span_processor is not None:
            if tracer_provider is None:
                tracer_provider = TracerProvider(resource=resource)
            tracer_provider.add_span_processor(span_processor)  # flushed and shut down with it
            if spans and otel_sdk.checked():
                self.direct = DirectSpans(tracer_provider, span_processor, span_kind)
        if spans and tracer_provider is not None and self.direct is None:
            self.tracer = tracer_provider.get_tracer(semconv.INSTRUMENTATION_SCOPE)
        self.tracer_provider = tracer_provider
        start = time.time_ns()
        self.chunks = ChunkHistogram(start)
        self.duration = LocalHistogram(
            semconv.METRIC_OPERATION_DURATION,
            "s",
            "GenAI operation duration.",
            semconv.DURATION_BUCKETS,
            start,
        )
        self.ttfc = LocalHistogram(
            semconv.METRIC_TIME_TO_FIRST_CHUNK,
            "s",
            "Time to receive the first chunk, from request arrival.",
            semconv.DURATION_BUCKETS,
            start,
        )
        self.token_usage = LocalHistogram(
            semconv.METRIC_TOKEN_USAGE,
            "{token}",
            "Number of input and output tokens used.",
            semconv.TOKEN_BUCKETS,
            start,
        )
        self.streams = LocalCounter(
            semconv.METRIC_STREAMS, "{stream}", "Streams ended, by outcome.", start
        )
        self.keepalives = LocalCounter(
            semconv.METRIC_KEEPALIVES, "{keepalive}", "SSE keep-alive comments injected.", start
        )
        self.cancellations = LocalCounter(
            semconv.METRIC_CANCELLATIONS,
            "{stream}",
            "Streams whose producer the guard cancelled, by outcome.",
            start,
        )
        self.cancel_latency = LocalHistogram(
            semconv.METRIC_CANCEL_LATENCY,
            "s",
            "From the decision to stop a stream to its producer having stopped.",
            semconv.DURATION_BUCKETS,
            start,
        )
        self._local: tuple[LocalHistogram | LocalCounter | ChunkHistogram, ...] = (
            self.duration,
            self.ttfc,
            self.token_usage,
            self.chunks,
            self.streams,
            self.keepalives,
            self.cancellations,
            self.cancel_latency,
        )
        self._reader = InMemoryMetricReader()  # Prometheus text
        readers: list[MetricReader] = [self._reader, *metric_readers]
        readers += [
            PeriodicExportingMetricReader(WithLocal(e, self.local_metrics))
            for e in metric_exporters
        ]
        self.meter_provider = MeterProvider(metric_readers=readers, resource=resource)
        meter = self.meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE)
        self._registries: list[StreamRegistry] = []
        meter.create_observable_gauge(
            semconv.METRIC_ACTIVE_STREAMS,
            callbacks=[self._observe_active],
            unit="{stream}",
            description="Streams in flight through the guard.",
        )
        meter.create_observable_counter(
            semconv.METRIC_USAGE_UNCHANGED,
            callbacks=[_observe_usage_unchanged],
            unit="{chunk}",
            description="Chunks whose forced usage could not be hidden exactly, relayed unchanged.",
        )
        self.access_log = logging.getLogger(semconv.ACCESS_LOGGER)
        made: list[SpanSink | MetricsSink | AccessSink] = []
        if spans:
            made.append(SpanSink(self.direct, self.genai_names))
        if "metrics" in self.sink_names:
            made.append(
                MetricsSink(
                    duration=self.duration,
                    ttfc=self.ttfc,
                    chunks=self.chunks,
                    token_usage=self.token_usage,
                    streams=self.streams,
                    keepalives=self.keepalives,
                    cancellations=self.cancellations,
                    cancel_latency=self.cancel_latency,
                )
            )
        if "access" in self.sink_names:
            made.append(AccessSink(self.access_log, every=access_all))
        # What `finish` hands each stream's summary to, in this order.
        self.sinks: tuple[Callable[[Summary], None], ...] = tuple(sink.emit for sink in made)

    @classmethod
    def from_env(
        cls,
        span_kind: SpanKind = SpanKind.SERVER,
        *,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Self | None:
        """Telemetry configured by the standard OTEL_* variables; None if OTEL_SDK_DISABLED.

        `options` go to the constructor (server_address, server_port, provider_name,
        capture_content, capture_limit, sinks, semconv_opt_in, access_all). Exporters:
        OTLP/HTTP protobuf, batched direct spans, periodic metrics (the span exporter is the
        SDK's with a faster encoder, `otlp`; the SDK's own where `otel_sdk.checked()` is
        false); the SDK reads endpoint, headers, timeout, sampler and resource variables itself.
        `SIDESTREAM_TELEMETRY_SINKS` chooses the sinks (`sinks.parse_sinks`) unless `sinks` is
        given, `OTEL_SEMCONV_STABILITY_OPT_IN` the GenAI names (`semconv.genai_names`) unless
        `semconv_opt_in` is, `SIDESTREAM_TELEMETRY_ACCESS_ALL` (`on`/`off`) `access_all`
        unless it is.
        """
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        if protocol != "http/protobuf":
            logger.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: only http/protobuf is used", protocol)
        attributes = {} if "OTEL_SERVICE_NAME" in env else {"service.name": "sidestream"}
        resource = Resource.create(attributes)
        options.setdefault("sinks", parse_sinks(env.get("SIDESTREAM_TELEMETRY_SINKS")))
        options.setdefault("semconv_opt_in", env.get(semconv.SEMCONV_OPT_IN, ""))
        options.setdefault("access_all", parse_switch(ACCESS_ALL, env.get(ACCESS_ALL)))
        processor = None
        if _wanted(env, "TRACES") and "span" in options["sinks"]:
            processor = BatchSpanProcessor(_span_exporter())
        exporters: list[MetricExporter] = []
        if _wanted(env, "METRICS"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporters.append(OTLPMetricExporter())
        return cls(
            span_processor=processor,
            metric_exporters=exporters,
            resource=resource,
            span_kind=span_kind,
            **options,
        )

    # -- per request ----------------------------------------------------------------------------

    def watch(self, registry: StreamRegistry) -> None:
        """Report `registry`'s in-flight requests as the active-streams gauge."""
        if registry not in self._registries:
            self._registries.append(registry)

    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(sum(streams_in(r) for r in self._registries))

    # -- export -------------------------------------------------------------------------------

    def metrics(self) -> list[Metric]:
        """Every metric as collected now (cumulative), the chunk histogram included."""
        data = self._reader.get_metrics_data()
        found = [
            m
            for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics
            for m in sm.metrics
        ]
        return [*found, *self.local_metrics()]

    def local_metrics(self) -> list[Metric]:
        """The metrics aggregated here (`instruments`), as collected now."""
        now = time.time_ns()
        return [m for m in (local.metric(now) for local in self._local) if m is not None]

    def prometheus_text(self, registry: StreamRegistry | None = None) -> bytes:
        return prometheus_text(registry, self)

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(timeout_millis)
        self.meter_provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush the access log, flush and stop the exporters (blocking: call it off the
        event loop or at exit)."""
        for handler in self.access_log.handlers:
            handler.flush()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def prometheus_text(registry: StreamRegistry | None, telemetry: Pipeline | None) -> bytes:
    """Prometheus text for the admin /metrics; `sidestream_active_streams` even when off."""
    active = streams_in(registry) if registry is not None else 0
    if telemetry is not None and registry is None:
        active = sum(streams_in(r) for r in telemetry._registries)
    lines = [
        "# HELP sidestream_active_streams Streams in flight through the guard.",
        "# TYPE sidestream_active_streams gauge",
        f"sidestream_active_streams {active}",
    ]
    if telemetry is not None:
        skip = frozenset({semconv.METRIC_ACTIVE_STREAMS})
        lines += exposition(telemetry.metrics(), skip=skip)
    return ("\n".join(lines) + "\n").encode()


def _span_exporter() -> SpanExporter:
    """sidestream's OTLP/HTTP span exporter, or the SDK's own without `otel_sdk.checked()`."""
    if otel_sdk.checked():
        from middleware.telemetry.otlp import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as SDK

    return SDK()


def _wanted(env: Mapping[str, str], signal: str) -> bool:
    exporter = env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if exporter:
        return "otlp" in exporter.split(",")
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )
