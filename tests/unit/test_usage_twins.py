"""Forced usage's compiled answers (`middleware/_usage.c`) against `middleware.usage`'s own.

The compiled module answers the two JSON questions of forced usage (where to insert
`stream_options` in a request body; what a chunk of whole events shows a client that did not
ask for usage) without building the JSON's objects, and leaves what lies outside its strict
grammar to usage.py and usage_hide.py (ASK). Rule checked here: every answer it gives is the
one they give, on bodies built to hit its edges (duplicate and escaped keys, whitespace,
non-ASCII and invalid UTF-8, numbers, nesting, cut and spliced bytes, newline runs and CRs
between events); and for plain bodies it does answer (a module that always asked would pass
the first rule alone).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from middleware import usage, usage_hide
from tests.support.compiled import built
from tests.support.fuzzing import examples

compiled = built("middleware._usage")  # that it is built: tests/unit/test_core_twins.py


@contextmanager
def python_only() -> Iterator[None]:
    """usage.py without the compiled module, whatever this run of the suite picked."""
    saved, usage._compiled = usage._compiled, None
    try:
        yield
    finally:
        usage._compiled = saved


def python_rewrite(body: bytes) -> bytes | None:
    with python_only():
        return usage.rewrite(body, "force")


# -- request bodies -----------------------------------------------------------------------------

KEYS = ["stream", "stream_options", "model", "messages", "s", "str\\u0065am", "é", "a\\"]
_scalars = (
    st.booleans()
    | st.none()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _spaced(text: str, blanks: str) -> str:
    return blanks + text + blanks


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A request body: a JSON object of chosen keys (duplicates and escaped keys among them)
    and random values, spelled with random spacing; sometimes cut, spliced or re-encoded."""
    pairs = draw(
        st.lists(
            st.tuples(st.sampled_from(KEYS) | st.text(max_size=5), st.just(True) | _values),
            max_size=6,
        )
    )
    sep, colon = draw(st.sampled_from([(",", ":"), (", ", ": "), (",\n", " :\t")]))
    ascii_only = draw(st.booleans())
    members = []
    for key, value in pairs:
        # a key from KEYS is written as it is (escapes and all), any other one is encoded
        name = f'"{key}"' if key in KEYS else json.dumps(key, ensure_ascii=ascii_only)
        members.append(name + colon + json.dumps(value, ensure_ascii=ascii_only))
    text = _spaced("{" + sep.join(members) + "}", draw(st.sampled_from(["", " ", "\r\n", "\t "])))
    body = text.encode("utf-8")
    edit = draw(st.sampled_from(["none", "none", "cut", "splice", "latin1", "nan", "deep"]))
    if edit == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif edit == "splice":
        at = draw(st.integers(0, len(body)))
        junk = draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\x00", b"01", b",", b"}", b'"']))
        body = body[:at] + junk + body[at:]
    elif edit == "latin1":
        body = text.encode("latin-1", "replace")
    elif edit == "nan" and body.endswith(b"}"):
        body = body[:-1] + (b',"n":NaN}' if len(body) > 2 else b'"n":NaN}')
    elif edit == "deep" and body.endswith(b"}"):
        depth = draw(st.integers(60, 70))
        body = body[:-1] + b',"d":' + b"[" * depth + b"]" * depth + b"}"
    return body


@settings(max_examples=examples(3000), deadline=None)
@given(bodies())
@example(b'{"model":"emulator","messages":[{"role":"user","content":"hi"}],"stream":true}')
@example(b'{"stream":true,"stream":true}')
@example(b'{"stream":true,"x":{"a":1,"a":2}}')
@example(b'{"stream":true,"x":{"a":1,"\\u0061":2}}')
@example(b'{"stream":true,"n":' + b"9" * 4500 + b"}")
@example(b'{"stream":true,"n":-0.5e+3}')
@example(b'{"stream":true,"n":01}')
@example(b'{"stream":true,"t":"\\ud800"}')
@example(b'{"stream":true,"t":"\x1f"}')
@example(b'{"stream":true}\x0b')
@example('{"stream":true,"t":"\U0001f600 \u00e9"}'.encode())
@example(b'{"stream":true,"t":"\xf4\x90\x80\x80"}')
@example(b'\xef\xbb\xbf{"stream":true}')
def test_a_request_decision_given_is_usage_pys(body: bytes) -> None:
    """An offset: usage.py inserts `stream_options` there. UNCHANGED: usage.py forwards the
    body as it is. ASK: usage.py decides, with no answer here to compare."""
    answer = compiled.request(body)
    expected = python_rewrite(body)
    if answer >= 0:
        assert expected == body[:answer] + usage._INSERTED[0] + body[answer:]
    elif answer == compiled.UNCHANGED:
        assert expected is None
    else:
        assert answer == compiled.ASK


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}', "insert"),
        ('{"stream": true, "t": "h\u00e9llo \u2603", "n": [1.5e3, -0, {}]}\n'.encode(), "insert"),
        (b'{"stream":false}', "unchanged"),
        (b'{"messages":[]}', "unchanged"),
        (b"[1, 2]", "unchanged"),
        (b'{"stream":true,"stream":true}', "unchanged"),
        (b'{"stream":true,"x":{"a":1,"a":2}}', "unchanged"),
        (b'{"stream":true,"stream_options":{}}', "ask"),
        (b'{"str\\u0065am":true}', "ask"),
        (b'{"stream":true,"n":NaN}', "ask"),
        (b'{"stream":true,"t":"\xff"}', "ask"),
        (b"not json", "ask"),
    ],
)
def test_plain_bodies_are_answered_and_odd_ones_asked(body: bytes, answer: str) -> None:
    """A plain streaming request is answered with where to insert; a plain request that is
    not one, or a duplicate key, with UNCHANGED; amending, escapes, NaN, bad UTF-8 and
    what is not JSON are left to usage.py."""
    got = compiled.request(body)
    kind = "insert" if got >= 0 else "unchanged" if got == compiled.UNCHANGED else "ask"
    assert kind == answer


def test_a_long_chat_history_is_answered_here() -> None:
    """A 60 KB history of non-ASCII turns is answered here, where usage.py would build it."""
    turn = "Explain this, please: lorem ipsum \u00e9 \u4e2d\u6587 \U0001f600 " * 20
    messages = [{"role": "user", "content": turn} for _ in range(40)]
    body = json.dumps({"model": "m", "messages": messages, "stream": True}).encode()
    at = compiled.request(body)
    assert at == len(body) - 1
    assert usage.rewrite(body, "force") == python_rewrite(body)


# -- chunks to hide the usage event in ------------------------------------------------------------

USAGE_EVENTS = [
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
    b'data: {"id":"c","choices":[ ],"usage":{}}',
    b'data: { "usage" : {"t":1}, "choices" : [] }',
    b'data: {"id":"c","usage":{"t":1}}',  # no choices at all: the usage chunk too
    b'data: {"choices":[],"usage":{"t":1},"usage":null}',  # a member twice: asked
    b'data: {"choices":[1],"choices":[],"usage":{}}',
    b'data: {"choices":[],"usage":{"t":1}}\r',
    b'data: {"choices":[],"\\u0075sage":{}}',  # an escaped key: asked
    b'data: {"choices":[],"usage":{"t":NaN}}',
    b'data: {"choices":[],"usage":[]}',
    b'data: {"choices":[{}],"usage":{}}',
    b'data:{"choices":[],"usage":{}}',
    b'data:  {"choices":[],"usage":{}}',
    b'data: {"choices":[],"usage":{}',
    b'data: ["usage"]',
    b'data: {"choices":[],"usage":{"t":"\xff"}}',
    b'event: x\ndata: {"choices":[],"usage":{}}',
    b'data: {"choices":[],"usage":{}}\ndata: [DONE]',
]
OTHER_EVENTS = [
    b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}]}',
    b'data: {"id":"c","choices":[{"delta":{}}],"usage":null}',
    b'data: {"id":"c", "usage": null, "choices":[{"delta":{}}]}',
    b'data: {"usage":null}',
    b'data: {"a":{"usage":null},"usage" :null }',
    b'data: {"a":{"b":1,"b":2},"usage":null}',  # a nested key twice: asked
    b'data: {"id":"c","choices":[{"delta":{"content":"\\"usage\\""}}]}',
    b'data: {"usage":null,}',
    b"data: [DONE]",
    b"data",
    b": keep-alive",
    b"id: 3",
    b"",
]


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    """Events (usage ones among them) joined by blank lines, two newlines or more, or a CR,
    the last one whole or cut short."""
    events = draw(st.lists(st.sampled_from(USAGE_EVENTS + OTHER_EVENTS), max_size=5))
    out = b""
    for event in events:
        out += event + draw(st.sampled_from([b"\n\n", b"\n\n", b"\n\n\n", b"\n", b"\r\n\r\n"]))
    if out and draw(st.booleans()):
        out = out[: draw(st.integers(0, len(out)))]
    return out


def python_hide(body: bytes) -> tuple[bytes, bool]:
    """usage_hide.py's edit of `body` at an event boundary, and whether it holds nothing after."""
    saved, usage_hide._compiled = usage_hide._compiled, None
    try:
        hide = usage_hide.HideUsage()
        out = hide(body)
    finally:
        usage_hide._compiled = saved
    return out, not (hide.block or hide.partial or hide.mid_line or hide.after_cr)


@settings(max_examples=examples(3000), deadline=None)
@given(chunks())
@example(b'data: {"choices":[],"usage":{}}\n\n')
@example(b'x\n\n\ndata: {"choices":[],"usage":{}}\n\n')
@example(b'data: {"choices":[],"usage":{}}\n\n\ndata: [DONE]\n\n')
@example(b'data: {"a":1,"usage":null}\n\ndata: {"choices":[],"usage":{}}')
@example(b'data: {"a":1, "usage" : null }\n\ndata: {"usage":null,"b":[]}\n\n')
def test_a_hidden_chunk_given_is_usage_hides(body: bytes) -> None:
    """Bytes returned: usage_hide.py's `HideUsage` makes the same bytes of it, and holds
    nothing after (the compiled `hide` answers only whole events). None: usage_hide decides."""
    hidden = compiled.hide(body)
    if hidden is not None:
        assert (hidden, True) == python_hide(body)


def test_a_reply_in_one_read_is_answered_here() -> None:
    """A one-token reply's whole answer in one read (its token, finish, usage, `[DONE]`,
    each with `"usage":null` where the server writes it): the usage event and the null
    members go, here; a chunk without usage is the very object it was."""
    token = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"7"}}]}\n\n'
    finish = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    event = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":4,"total_tokens":5}}\n\n'
    done = b"data: [DONE]\n\n"
    null = token.replace(b"]}\n", b'],"usage":null}\n') + finish.replace(
        b"]}\n", b'],"usage":null}\n'
    )
    assert compiled.hide(null + event + done) == token + finish + done
    assert compiled.hide(token) is token
    assert python_hide(null + event + done) == (token + finish + done, True)


@pytest.mark.parametrize(
    "body",
    [
        b'data: {"choices":[],"usage":{"t":NaN}}\n\n',  # outside the grammar here
        b'data: {"id":"c"}\r\n\r\n',  # CRLF
        b'id: 1\ndata: {"usage":null}\n\n',  # a field beside data
        b'data: {"choices":[{}],"usage":{"t":1}}\n\n',  # usage beside choices
        b'data: {"usage":null}\n',  # not at an event boundary
    ],
)
def test_what_the_compiled_hide_asks_about_the_edit_decides_in_python(body: bytes) -> None:
    """A chunk the compiled `hide` leaves to usage_hide.py (outside its grammar or its
    framing) is still edited: `HideUsage` decides it in Python, as without the module."""
    assert compiled.hide(body) is None
    assert usage_hide.HideUsage()(body) == python_hide(body)[0]
