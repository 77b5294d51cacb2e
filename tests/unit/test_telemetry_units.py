"""Pure unit tests of telemetry's parts: the inter-token gap histogram, request parsing,
content extraction, and the standard names against opentelemetry-semantic-conventions."""

from __future__ import annotations

import bisect
import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import (
    client_attributes,
    error_attributes,
    http_attributes,
    server_attributes,
    url_attributes,
    user_agent_attributes,
)

from middleware.sse import Event
from middleware.telemetry import semconv
from middleware.telemetry.content import BODY_CAP, event_text, request_attributes
from middleware.telemetry.gaps import BOUNDS, ChunkHistogram, Gaps
from middleware.telemetry.instruments import series


def ev(data: str, event: str = "message") -> Event:
    return Event(event=event, data=data, id=None, retry=None)


def gaps_of(values: list[float]) -> Gaps:
    gaps = Gaps()
    now = 100.0
    gaps.add(now)
    for value in values:
        now += value
        gaps.add(now)
    return gaps


def test_gap_quantiles_are_within_one_bucket_of_the_exact_ones() -> None:
    """p50/p99 from the log buckets are within 12.5% of the exact quantiles; max is exact."""
    rng = random.Random(7)
    values = [rng.lognormvariate(-4, 1) for _ in range(5000)]
    gaps = gaps_of(values)
    ordered = sorted(values)
    for q in (0.5, 0.99):
        exact = ordered[int(q * len(ordered)) - 1]
        got = gaps.quantile(q)
        assert got is not None and abs(got - exact) / exact < 0.125, (q, got, exact)
    assert gaps.max == pytest.approx(max(values))
    assert gaps.count == 5000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 5.0), min_size=1, max_size=300),
    st.lists(st.floats(0.001, 1.0), min_size=1, max_size=4),
)
def test_gap_quantiles_in_one_walk_equal_each_alone(values: list[float], qs: list[float]) -> None:
    """`quantiles` (one walk of the buckets, as `finish` reads p50 and p99) gives what
    `quantile` gives for each q alone, ranks in one bucket and equal qs included."""
    qs.sort()
    gaps = gaps_of(values)
    assert gaps.quantiles(*qs) == [gaps_of(values).quantile(q) for q in qs]


def test_gap_memory_is_bounded_whatever_the_stream_length() -> None:
    """O(1) memory: 100,000 gaps over six decades fit in a few hundred buckets, plus at most
    FOLD_AT chunk times not folded yet."""
    rng = random.Random(1)
    gaps = gaps_of([10 ** rng.uniform(-6, 0) for _ in range(100_000)])
    assert len(gaps.times) < Gaps.FOLD_AT
    gaps.fold()
    assert len(gaps.counts) < 8 * 30 and gaps.count == 100_000


def test_folding_in_batches_counts_every_gap_in_its_own_bucket() -> None:
    """Chunk times are folded FOLD_AT at a time (and on read): the buckets, count, total and
    max are those of every gap bucketed one by one, across batch edges included."""
    rng = random.Random(3)
    values = [rng.lognormvariate(-4, 2) for _ in range(3 * Gaps.FOLD_AT + 17)]
    gaps = gaps_of(values)
    expected: dict[int, int] = {}
    for value in values:
        index = bisect.bisect_left(BOUNDS, value)
        expected[index] = expected.get(index, 0) + 1
    # The same gaps, one bucket off at most where float rounding of the times moved a gap
    # across a bound; the totals are exact.
    got = gaps.buckets()
    assert sum(got.values()) == gaps.count == len(values)
    moved = sum(abs(got.get(i, 0) - n) for i, n in expected.items())
    assert moved <= 2
    assert gaps.max == pytest.approx(max(values)) and gaps.total == pytest.approx(sum(values))


def test_a_gap_on_a_bound_is_counted_below_it_and_above_the_last_in_the_top_bucket() -> None:
    """Buckets are (b[i-1], b[i]] like OTel's: a gap equal to a bound is in the bucket that
    bound closes, one above the last bound in the overflow bucket; runs of equal gaps too."""
    for bound in (BOUNDS[0], 0.01, 0.02, BOUNDS[100], BOUNDS[-1]):
        gaps = Gaps()
        gaps.add(0.0)
        for _ in range(3):
            gaps.add(bound)  # the same time thrice: gaps of bound, then 0 and 0
        expected = {0: 2}  # the zero gaps
        expected[BOUNDS.index(bound)] = expected.get(BOUNDS.index(bound), 0) + 1
        assert gaps.buckets() == expected
    assert gaps_of([2 * BOUNDS[-1]] * 3).buckets() == {len(BOUNDS): 3}


def test_buckets_read_between_chunks_include_every_gap_so_far() -> None:
    """`buckets()` is the stream's dict of non-empty buckets, filled in as gaps are folded
    (in the order buckets were first hit): read, more chunks, read again — every gap is in,
    and the quantiles walk the buckets in ascending order whatever order they came in."""
    gaps = Gaps()
    for at in (0.0, 0.01, 0.02):
        gaps.add(at)
    first = dict(gaps.buckets())
    assert sum(first.values()) == 2 and gaps.buckets() == first
    gaps.add(1.02)  # a 1 s gap, in a bucket of its own
    later = gaps.buckets()
    assert sum(later.values()) == 3 and later != first
    assert gaps.quantiles(1.0) == [pytest.approx(1.0, rel=0.125)]
    for at in (1.021, 1.022, 1.023):  # three 1 ms gaps: a bucket below the others, hit last
        gaps.add(at)
    assert gaps.quantiles(0.5, 0.99) == [
        pytest.approx(0.001, rel=0.125),
        pytest.approx(1.0, rel=0.125),
    ]


def test_added_counts_every_chunk_time_across_folds() -> None:
    """`Gaps.added()` is the number of chunk times added, folded or not: the cycle's frame
    path counts its tokens by it (one time per token, nothing else)."""
    gaps = Gaps()
    assert gaps.added() == 0
    gaps.add(0.0)
    gaps.fold()  # one time folded: no gap yet
    assert gaps.added() == 1 and gaps.count == 0
    for i in range(1, 2 * Gaps.FOLD_AT + 5):
        gaps.add(i / 1000)
        assert gaps.added() == i + 1
    gaps.fold()
    assert gaps.added() == 2 * Gaps.FOLD_AT + 5 == gaps.count + 1


def test_zero_gaps_and_single_tokens() -> None:
    """Chunks read at the same instant give a gap of 0; one chunk gives no gap at all."""
    assert gaps_of([0.0, 0.0]).quantile(0.5) == 0.0
    single = gaps_of([])
    assert single.quantile(0.5) is None and single.tokens_per_second() is None


def test_tokens_per_second_after_the_first_token() -> None:
    """Tokens per second counts the chunks after the first over the time since the first."""
    assert gaps_of([0.1] * 10).tokens_per_second() == pytest.approx(10.0)


def test_chunk_histogram_buckets_are_the_conventions_buckets_exactly() -> None:
    """Folding a stream puts each gap in the bucket the SDK would: (b[i-1], b[i]]."""
    values = [0.005, 0.015, 0.03, 0.05, 0.3, 1.0, 90.0]
    histogram = ChunkHistogram(0)
    histogram.fold(gaps_of(values), series({"a": "b"}))
    metric = histogram.metric(1)
    assert metric is not None
    (point,) = metric.data.data_points  # type: ignore[union-attr]
    expected = [0] * 15
    for v in values:
        expected[next((i for i, b in enumerate(semconv.DURATION_BUCKETS) if v <= b), 14)] += 1
    assert list(point.bucket_counts) == expected  # type: ignore[union-attr]
    assert point.count == len(values) and point.max == pytest.approx(90.0)  # type: ignore[union-attr]


def _point(histogram: ChunkHistogram) -> Any:
    metric = histogram.metric(1)
    assert metric is not None
    (point,) = metric.data.data_points  # type: ignore[union-attr]
    return point


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([0.0, 0.004, 0.01, 0.0100001, 0.02, 0.5, 81.92, 100.0])
        | st.floats(0.0, 200.0),
        min_size=1,
        max_size=Gaps.FOLD_AT - 2,
    )
)
def test_a_sealed_stream_reads_its_gaps_exactly_and_buckets_them_as_folding_does(
    values: list[float],
) -> None:
    """`seal` on a stream shorter than one batch keeps its gaps sorted: p50/p99 are the exact
    nearest-rank quantiles, and the chunk histogram gets the same bucket counts, count, sum
    and max as from the folded log buckets (its min exact, not a bucket's lower bound)."""
    sealed, folded = gaps_of(values), gaps_of(values)
    sealed.seal()
    folded.fold()
    assert sealed.exact is not None and folded.exact is None
    ordered = sorted(sealed.exact)  # the gaps as the clock differences give them
    for q in (0.5, 0.99, 1.0):
        assert sealed.quantile(q) == ordered[max(1, math.ceil(q * len(ordered))) - 1]
    assert sealed.tokens_per_second() == folded.tokens_per_second()
    assert (sealed.count, sealed.max) == (folded.count, folded.max) == (len(values), ordered[-1])
    by_seal, by_fold = ChunkHistogram(0), ChunkHistogram(0)
    by_seal.fold(sealed, series({"a": "b"}))
    by_fold.fold(folded, series({"a": "b"}))
    got, want = _point(by_seal), _point(by_fold)
    assert list(got.bucket_counts) == list(want.bucket_counts)
    assert (got.count, got.max) == (want.count, want.max)
    assert got.sum == pytest.approx(want.sum)
    assert got.min == ordered[0] and want.min <= ordered[0]


def test_a_time_after_seal_moves_the_sorted_gaps_into_the_buckets() -> None:
    """A sealed Gaps that is added to again stays correct: every gap counted once."""
    gaps = gaps_of([0.02] * 10)
    gaps.seal()
    gaps.add(gaps.last + 0.5)  # type: ignore[operator]
    assert gaps.quantiles(0.5, 1.0) == [
        pytest.approx(0.02, rel=0.125),
        pytest.approx(0.5, rel=0.125),
    ]
    assert gaps.exact is None and gaps.count == 11 == sum(gaps.buckets().values())
    assert gaps.added() == 12


def test_sealing_a_stream_longer_than_a_batch_folds_it() -> None:
    """A stream that has folded a batch already is sealed into the buckets, not sorted."""
    gaps = gaps_of([0.02] * (Gaps.FOLD_AT + 10))
    gaps.seal()
    assert gaps.exact is None and not gaps.times and gaps.count == Gaps.FOLD_AT + 10


def test_request_attributes_from_a_whole_body() -> None:
    """Model, stream and sampling parameters from the top level of the JSON body only."""
    body = {
        "model": "llama",
        "stream": True,
        "max_completion_tokens": 64,
        "temperature": 0,
        "top_p": 1,
        "messages": [{"role": "user", "content": 'say "model": "evil"'}],
        "tools": [{"parameters": {"properties": {"max_tokens": 5}}}],
    }
    assert request_attributes(json.dumps(body).encode(), complete=True) == {
        semconv.GEN_AI_REQUEST_MODEL: "llama",
        semconv.GEN_AI_REQUEST_STREAM: True,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 64,
        semconv.GEN_AI_REQUEST_TEMPERATURE: 0.0,
        semconv.GEN_AI_REQUEST_TOP_P: 1.0,
    }


def test_request_attributes_from_a_truncated_body_ignore_text_in_strings() -> None:
    """A body past BODY_CAP is searched in its prefix; a key quoted inside a string (as
    escaped JSON) does not match."""
    prompt = 'ignore \\"model\\": \\"evil\\" ' + "x" * BODY_CAP
    raw = ('{"messages":[{"content":"' + prompt + '"}],"model":"late"').encode()
    assert request_attributes(raw[:BODY_CAP], complete=False) == {}
    raw = b'{"model": "early", "max_tokens": 9, "messages": [{"content": "' + b"y" * BODY_CAP
    assert request_attributes(raw[:BODY_CAP], complete=False) == {
        semconv.GEN_AI_REQUEST_MODEL: "early",
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 9,
    }


def test_request_attributes_of_tgi_and_junk() -> None:
    """TGI's parameters object counts; a body that is not JSON gives nothing."""
    tgi = b'{"inputs": "hi", "parameters": {"max_new_tokens": 20, "temperature": 0.7}}'
    assert request_attributes(tgi, complete=True) == {
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 20,
        semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7,
    }
    assert request_attributes(b"not json", complete=True) == {}


@pytest.mark.parametrize(
    ("dialect", "event", "text"),
    [
        ("openai.chat", ev('{"choices":[{"delta":{"content":"Hi"}}]}'), "Hi"),
        ("openai.completions", ev('{"choices":[{"text":"Yo"}]}'), "Yo"),
        (
            "openai.responses",
            ev(
                '{"type":"response.output_text.delta","delta":"R"}',
                "response.output_text.delta",
            ),
            "R",
        ),
        (
            "anthropic",
            ev('{"delta":{"type":"text_delta","text":"A"}}', "content_block_delta"),
            "A",
        ),
        ("tgi", ev('{"token":{"text":"T","special":false}}'), "T"),
        ("tgi", ev('{"token":{"text":"</s>","special":true}}'), ""),
        ("openai.chat", ev("[DONE]"), ""),
    ],
)
def test_event_text_per_dialect(dialect: str, event: Event, text: str) -> None:
    """Captured content is the generated text of each dialect's token events, nothing else."""
    assert event_text(dialect, event) == text


def test_standard_names_match_the_semantic_conventions_package() -> None:
    """Every GenAI/HTTP name in middleware.telemetry.semconv is the one the conventions define
    (both spellings where OTEL_SEMCONV_STABILITY_OPT_IN chooses one)."""
    pairs = [
        (semconv.GEN_AI_OPERATION_NAME, gen_ai.GEN_AI_OPERATION_NAME),
        (semconv.GENAI_DEFAULT.provider, gen_ai.GEN_AI_SYSTEM),
        (semconv.GENAI_LATEST.provider, gen_ai.GEN_AI_PROVIDER_NAME),
        (
            semconv.GENAI_DEFAULT.cache_write_input_tokens,
            gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        ),
        # GENAI_LATEST.cache_write_input_tokens: the package has no constant for it yet.
        (semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
        (semconv.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, gen_ai.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
        (semconv.GEN_AI_REQUEST_MODEL, gen_ai.GEN_AI_REQUEST_MODEL),
        (semconv.GEN_AI_REQUEST_STREAM, gen_ai.GEN_AI_REQUEST_STREAM),
        (semconv.GEN_AI_REQUEST_MAX_TOKENS, gen_ai.GEN_AI_REQUEST_MAX_TOKENS),
        (semconv.GEN_AI_REQUEST_TEMPERATURE, gen_ai.GEN_AI_REQUEST_TEMPERATURE),
        (semconv.GEN_AI_REQUEST_TOP_P, gen_ai.GEN_AI_REQUEST_TOP_P),
        (semconv.GEN_AI_RESPONSE_ID, gen_ai.GEN_AI_RESPONSE_ID),
        (semconv.GEN_AI_RESPONSE_MODEL, gen_ai.GEN_AI_RESPONSE_MODEL),
        (semconv.GEN_AI_RESPONSE_FINISH_REASONS, gen_ai.GEN_AI_RESPONSE_FINISH_REASONS),
        (semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
        (semconv.GEN_AI_USAGE_INPUT_TOKENS, gen_ai.GEN_AI_USAGE_INPUT_TOKENS),
        (semconv.GEN_AI_USAGE_OUTPUT_TOKENS, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS),
        (semconv.GEN_AI_OUTPUT_MESSAGES, gen_ai.GEN_AI_OUTPUT_MESSAGES),
        (semconv.GEN_AI_TOKEN_TYPE, gen_ai.GEN_AI_TOKEN_TYPE),
        (semconv.HTTP_REQUEST_METHOD, http_attributes.HTTP_REQUEST_METHOD),
        (semconv.HTTP_RESPONSE_STATUS_CODE, http_attributes.HTTP_RESPONSE_STATUS_CODE),
        (semconv.URL_PATH, url_attributes.URL_PATH),
        (semconv.URL_SCHEME, url_attributes.URL_SCHEME),
        (semconv.CLIENT_ADDRESS, client_attributes.CLIENT_ADDRESS),
        (semconv.USER_AGENT_ORIGINAL, user_agent_attributes.USER_AGENT_ORIGINAL),
        (semconv.SERVER_ADDRESS, server_attributes.SERVER_ADDRESS),
        (semconv.SERVER_PORT, server_attributes.SERVER_PORT),
        (semconv.ERROR_TYPE, error_attributes.ERROR_TYPE),
        (semconv.METRIC_OPERATION_DURATION, gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION),
        (
            semconv.METRIC_TIME_TO_FIRST_CHUNK,
            gen_ai_metrics.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
        ),
        (
            semconv.METRIC_TIME_PER_OUTPUT_CHUNK,
            gen_ai_metrics.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
        ),
        (semconv.METRIC_TOKEN_USAGE, gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE),
    ]
    for ours, theirs in pairs:
        assert ours == theirs


@pytest.mark.parametrize(
    ("opt_in", "latest"),
    [
        ("", False),
        ("gen_ai_latest_experimental", True),
        (" gen_ai_latest_experimental ", True),
        ("http/dup,gen_ai_latest_experimental,database", True),
        ("gen_ai_latest_experimental,gen_ai/dup", True),
        ("http/dup,database/dup", False),
        ("gen_ai", False),
        ("gen_ai/dup", False),
        ("GEN_AI_LATEST_EXPERIMENTAL", False),
        ("gen_ai_latest_experimental/dup", False),
        ("gen_ai_latest_experimentalx", False),
    ],
)
def test_the_opt_in_is_read_as_the_python_instrumentations_read_it(
    opt_in: str, latest: bool
) -> None:
    """OTEL_SEMCONV_STABILITY_OPT_IN is a comma-separated list whose values are stripped and
    compared exactly: `gen_ai_latest_experimental` anywhere in it selects the latest names;
    other categories' values, a case change, and `gen_ai/dup` (which no Python
    instrumentation defines) leave the default."""
    expected = semconv.GENAI_LATEST if latest else semconv.GENAI_DEFAULT
    assert semconv.genai_names(opt_in) == expected
