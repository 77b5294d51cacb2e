"""Every span, attribute, event and metric name sidestream emits, in one place.

GenAI names follow the OpenTelemetry GenAI semantic conventions: v1.41, as shipped in
`opentelemetry-semantic-conventions` 0.66, and the registry of their own repository
(open-telemetry/semantic-conventions-genai, model/gen-ai/registry.yaml) where the two differ;
the comments below say which version each name follows. HTTP, URL, client and server names
follow the stable HTTP conventions. sidestream's own names share the `sidestream.` prefix. A
rename is a change to this module only; the telemetry tests check the standard names against
the `opentelemetry-semantic-conventions` package.

Two GenAI names are spelt by `OTEL_SEMCONV_STABILITY_OPT_IN`, read once when telemetry is set
up (`genai_names`), as the Python GenAI instrumentations read it: by default the spelling they
keep for existing users, with `gen_ai_latest_experimental` the registry's. Everything else is
spelt the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# -- GenAI (development status upstream) -----------------------------------------------------
# Defined by v1.30.0 (the version opentelemetry-instrumentation-openai-v2 emits by default) and
# unchanged through the registry.
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
# Values "input", "output". The registry has since dropped it with gen_ai.client.token.usage
# (see the metrics below).
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
# Added after v1.36.0 (by v1.41.0) and unchanged in the registry: with no older spelling, the
# same in both modes.
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # only with capture_content=True


@dataclass(frozen=True, slots=True)
class GenAINames:
    """The GenAI names spelt by OTEL_SEMCONV_STABILITY_OPT_IN (`genai_names`)."""

    provider: str  # on the span and on every GenAI metric
    cache_write_input_tokens: str  # input tokens written to the provider's cache


# Without the opt-in: as the Python GenAI instrumentations emit by default (the conventions'
# transition plan: an instrumentation that emitted v1.36.0 or before keeps it by default).
GENAI_DEFAULT: Final = GenAINames(
    provider="gen_ai.system",  # v1.36.0 and before; v1.37.0 renamed it gen_ai.provider.name
    # v1.41.0: the attribute is newer than v1.36.0, so no older spelling
    cache_write_input_tokens="gen_ai.usage.cache_creation.input_tokens",
)
# OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental: the registry's names.
GENAI_LATEST: Final = GenAINames(
    provider="gen_ai.provider.name",  # v1.37.0 and after, the registry
    # the registry, renamed from cache_creation (semantic-conventions-genai#440); not in
    # `opentelemetry-semantic-conventions` yet
    cache_write_input_tokens="gen_ai.usage.cache_write.input_tokens",
)
SEMCONV_OPT_IN: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
_GENAI_BY_OPT_IN: Final = {"gen_ai_latest_experimental": GENAI_LATEST}


def genai_names(opt_in: str) -> GenAINames:
    """The GenAI names for OTEL_SEMCONV_STABILITY_OPT_IN's value `opt_in`.

    Read as opentelemetry-instrumentation's `_OpenTelemetrySemanticConventionStability` reads
    it: a comma-separated list, each value stripped and compared as it is. With
    `gen_ai_latest_experimental` among them, `GENAI_LATEST`; otherwise (unset, empty, other
    categories' values such as `http/dup`, unknown ones) `GENAI_DEFAULT`. There is no `/dup`
    value for gen_ai: `http/dup` and `database/dup` are those categories' own.
    """
    for value in opt_in.split(","):
        names = _GENAI_BY_OPT_IN.get(value.strip())
        if names is not None:
            return names
    return GENAI_DEFAULT


# -- HTTP, URL, client, server, error (stable) -----------------------------------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
CLIENT_ADDRESS: Final = "client.address"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# -- sidestream's own span attributes --------------------------------------------------------
OUTCOME: Final = "sidestream.outcome"
DIALECT: Final = "sidestream.dialect"
CHUNKS: Final = "sidestream.chunks"
BYTES: Final = "sidestream.bytes"
TOKENS: Final = "sidestream.tokens"  # content-carrying events counted by the dialect
# Where gen_ai.usage.output_tokens came from: "reported" by the server, or "counted" from the
# chunks relayed (a stream that ended before the server's usage chunk).
USAGE_SOURCE: Final = "sidestream.usage.source"
KEEPALIVES: Final = "sidestream.keepalives"
RESUME_STREAM_ID: Final = "sidestream.resume.stream_id"  # resume on: Sidestream-Stream-Id
RESUMES: Final = "sidestream.resume.count"  # resume requests served for the stream
RESUME_END_SEEN: Final = "sidestream.resume.end_seen"  # some reader read the stream's end
RESUME_AFTER: Final = "sidestream.resume.after"  # a resume request's point: events after n
GAP_P50: Final = "sidestream.inter_token_gap.p50"  # seconds
GAP_P99: Final = "sidestream.inter_token_gap.p99"
GAP_MAX: Final = "sidestream.inter_token_gap.max"
TOKENS_PER_SECOND: Final = "sidestream.tokens_per_second"  # after the first token
CANCEL_LATENCY: Final = "sidestream.cancel_latency"  # seconds, stop decided -> app stopped

# -- span events (one each at most; never one per chunk) --------------------------------------
EVENT_FIRST_CHUNK: Final = "sidestream.first_chunk"
EVENT_UPSTREAM_DONE: Final = "sidestream.upstream_done"
EVENT_CLIENT_DISCONNECT: Final = "sidestream.client_disconnect"
# The exception event, as the SDK's Span.record_exception writes it (direct).
EVENT_EXCEPTION: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
EXCEPTION_ESCAPED: Final = "exception.escaped"

# -- metrics ------------------------------------------------------------------------------------
# GenAI: v1.41.0, in both modes; duration and token usage (by gen_ai.token.type) since v1.30.0.
# The registry has since replaced them (gen_ai.client.inference.*, semantic-conventions-genai
# #374 and #521); the Python instrumentations still emit these (opentelemetry-util-genai).
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_STREAMS: Final = "sidestream.streams"  # counter by sidestream.outcome
METRIC_ACTIVE_STREAMS: Final = "sidestream.active_streams"
METRIC_KEEPALIVES: Final = "sidestream.keepalives"
METRIC_CANCELLATIONS: Final = "sidestream.cancellations"  # counter by sidestream.outcome
METRIC_CANCEL_LATENCY: Final = "sidestream.cancel_latency"  # histogram, seconds
# Counter: chunks relayed unchanged to a client that did not ask for usage, because the usage
# forcing caused in them could not be taken out exactly (middleware.usage_hide).
METRIC_USAGE_UNCHANGED: Final = "sidestream.usage.unchanged_chunks"

# The conventions' ExplicitBucketBoundaries. The time metrics share one list: 10 ms
# doubling to 81.92 s (the inter-chunk histogram relies on that, see gaps).
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# The access log: one JSON line per stream.
ACCESS_LOGGER: Final = "sidestream.access"
INSTRUMENTATION_SCOPE: Final = "sidestream"
