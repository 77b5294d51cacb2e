"""Forced usage's pure parts (`middleware.usage`): which request bodies are rewritten and
how, and what the client is shown of the usage chunk it did not ask for."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from middleware import usage
from middleware.usage import BODY_LIMIT, HideUsage, rewrite

ASKED = b'"stream_options":{"include_usage":true}'


def test_a_streaming_body_without_stream_options_gets_it_inserted_and_nothing_else_changes() -> (
    None
):
    """The field is inserted before the closing brace: every other byte stays as the client
    wrote it (spacing, number spelling, key order, non-ASCII text)."""
    body = '{"model": "m", "stream": true, "temperature": 1.0e0, "messages": [{"content": "héllo ☃"}]}\n'.encode()
    out = rewrite(body, "force")
    assert out == body.rstrip()[:-1] + b"," + ASKED + b"}\n"
    assert json.loads(out)["stream_options"] == {"include_usage": True}


def test_continuous_mode_also_asks_for_per_chunk_usage() -> None:
    """`continuous` asks vLLM for `continuous_usage_stats` too."""
    out = rewrite(b'{"stream":true}', "continuous")
    assert out is not None
    assert json.loads(out)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


def test_existing_stream_options_are_amended_in_place() -> None:
    """Options the client set are kept, the key keeps its place, non-ASCII stays as text."""
    body = '{"stream":true,"stream_options":{"include_usage":false,"x":1},"n":"é"}'.encode()
    out = rewrite(body, "force")
    assert out == '{"stream":true,"stream_options":{"include_usage":true,"x":1},"n":"é"}'.encode()


def test_a_client_that_asked_for_usage_is_left_alone() -> None:
    """The client asked itself: its request is forwarded unchanged (and its usage chunk is its own)."""
    assert rewrite(b'{"stream":true,"stream_options":{"include_usage":true}}', "force") is None


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'[{"stream": true}]',
        b'{"stream": "yes"}',
        b'{"stream": false}',
        b'{"messages": []}',
        b'{"stream": true, "stream": true}',  # duplicate keys: which one counts is ambiguous
        b'{"stream": true, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deep nesting
        b'{"stream": true, "x": "\xff\xfe"}',  # not UTF-8
        b'{"stream": true, "stream_options": "odd"}',
        b'{"stream": true, "pad": "' + b"x" * BODY_LIMIT + b'"}',  # over the parse limit
    ],
    ids=[
        "not-json",
        "array",
        "stream-yes",
        "stream-false",
        "no-stream",
        "duplicate-keys",
        "deep-nesting",
        "invalid-utf8",
        "odd-options",
        "huge",
    ],
)
def test_odd_and_hostile_bodies_are_forwarded_unchanged(body: bytes) -> None:
    """Anything but a plain streaming JSON object within the limit is not rewritten (and
    nothing raises)."""
    assert rewrite(body, "force") is None


TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = (
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,'
    b'"total_tokens":5}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_the_usage_chunk_is_hidden_and_every_other_byte_relayed() -> None:
    """The usage-only event goes; the finish event and `[DONE]` in the same read stay, and a
    token chunk is returned as the very object it was (no copy per token)."""
    hide = HideUsage()
    assert hide(TOKEN) is TOKEN
    assert hide(FINISH + USAGE + DONE) == FINISH + DONE
    assert hide(USAGE) == b""


def test_a_usage_null_field_per_chunk_is_dropped() -> None:
    """OpenAI's API adds `"usage":null` to every chunk once usage is asked: removed again."""
    chunk = TOKEN.replace(b"}]}", b'}],"usage":null}')
    assert HideUsage()(chunk) == TOKEN


def test_continuous_usage_is_hidden_from_each_chunk() -> None:
    """In continuous mode each chunk's usage object is removed, with its comma: the chunk is
    the one the server sends unasked, byte for byte."""
    chunk = TOKEN.replace(
        b"}]}", b'}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
    )
    assert HideUsage(continuous=True)(chunk) == TOKEN


def test_a_usage_event_split_across_reads_is_held_and_dropped() -> None:
    """A usage event cut in two reads is held (a block undecided is not sent) and dropped
    whole once its end shows it is the usage chunk; the next event goes as it came."""
    hide = HideUsage()
    assert hide(USAGE[:30]) == b""
    assert hide(USAGE[30:] + DONE) == DONE


def test_cached_and_reasoning_token_counts_are_read_from_the_usage_details() -> None:
    """OpenAI's and vLLM's usage details give the cache-read input tokens and the reasoning
    output tokens (reported as gen_ai.usage.cache_read.input_tokens and
    gen_ai.usage.reasoning.output_tokens)."""
    from middleware.dialects import StreamStats, select
    from middleware.sse import SSEScanner

    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": 7},
    }
    chunk = {"id": "c", "model": "m", "choices": [], "usage": usage}
    dialect = select("/v1/chat/completions")
    assert dialect is not None
    stats = StreamStats()
    for event in SSEScanner().feed(b"data: " + json.dumps(chunk).encode() + b"\n\n"):
        dialect.observe(event, stats)
    assert (stats.input_tokens, stats.output_tokens) == (30, 12)
    assert (stats.cache_read_tokens, stats.reasoning_tokens) == (16, 7)


_JSONISH = st.lists(
    st.sampled_from(
        [
            "{",
            "}",
            "[",
            "]",
            '"a"',
            '"s"',
            ":",
            ",",
            "1",
            "true",
            "null",
            " ",
            "\n",
            "\t",
            "x",
            "\u00e9",
        ]
    ),
    max_size=14,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_JSONISH | st.text(max_size=12))
@example(' {"a":1} ')
@example('{"a":1,"a":2}')
@example("1 2")
@example("")
@example("NaN")
def test_the_body_is_decoded_as_the_json_decoder_decodes_it(text: str) -> None:
    """One JSON value with whitespace around it, no duplicate key: what
    `JSONDecoder.decode` (with the no-duplicates hook) accepts, the same value; what it
    refuses, refused (ValueError) too. Compared by `repr`: the decoder takes `NaN`, which
    equals nothing, itself included (and `repr` tells 1 from 1.0)."""
    try:
        expected = usage._DECODER.decode(text)
    except ValueError:
        with pytest.raises(ValueError):
            usage._decode(text)
        return
    assert repr(usage._decode(text)) == repr(expected)


@pytest.mark.parametrize("as_list", [True, False], ids=["list", "tuple"])
def test_every_content_length_follows_the_rewritten_body(as_list: bool) -> None:
    """The request's Content-Length is the rewritten body's, every copy of it: in the
    server's own list where the headers are one, in a new list otherwise; no other header
    moves or changes."""
    import asyncio

    body = b'{"stream":true}'
    headers = [
        (b"content-length", b"15"),
        (b"host", b"x"),
        (b"content-length", b"15"),
        (b"content-type", b"application/json"),
    ]
    scope: dict[str, object] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": headers if as_list else tuple(headers),
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def run() -> bytes:
        forcing = usage.prepare(scope, receive, "force")  # type: ignore[arg-type]
        assert forcing is not None
        replay, edit = await forcing
        assert edit is not None
        message = await replay()
        return message["body"]  # type: ignore[no-any-return]

    sent = asyncio.run(run())
    length = str(len(sent)).encode()
    assert sent == rewrite(body, "force")
    assert list(scope["headers"]) == [  # type: ignore[call-overload]
        (b"content-length", length),
        (b"host", b"x"),
        (b"content-length", length),
        (b"content-type", b"application/json"),
    ]
    assert (scope["headers"] is headers) is as_list


@pytest.mark.parametrize(
    ("mode", "method", "path", "forced"),
    [
        ("force", "POST", "/v1/chat/completions", True),
        ("continuous", "POST", "/v1/completions", True),
        ("pass", "POST", "/v1/chat/completions", False),
        ("force", "GET", "/v1/chat/completions", False),
        ("force", "POST", "/v1/messages", False),  # Anthropic's: usage comes with every stream
        ("force", "POST", "/v1/embeddings", False),
    ],
)
def test_only_openai_style_streaming_paths_are_read_before_the_app(
    mode: str, method: str, path: str, forced: bool
) -> None:
    """With usage forced, a POST to an OpenAI chat/completions or completions path has its
    body read and rewritten before the app (a coroutine to await); any other request, and
    any in mode "pass", goes to the app as it came, with nothing to await."""
    import asyncio

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b'{"stream":true}', "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    forcing = usage.prepare(scope, receive, mode)  # type: ignore[arg-type]
    assert (forcing is not None) is forced
    if forcing is not None:
        _, edit = asyncio.run(forcing)
        assert edit is not None
