"""The per-chunk core's two twins — Python (`middleware/relaycore.py`, `middleware/frame.py`,
`sidecar/upstream/h1core.py`, http1.nowait's closure)
and compiled (`middleware/_relaycore.c`, `middleware/_frame.c`, `sidecar/_core.c`, and the
OTLP attributes' loop `otlp_attributes.py` as Cython compiles it) — behave alike, each checked
here side by side; the rest of the suite runs with whichever `SIDESTREAM_NO_EXTENSIONS` picks
(`make test` runs it once each way). The head rules' twins (`sidecar/_heads.c`) are held to uvicorn or to the rules one by
one in `test_response_head.py`, `test_read_headers.py` and `test_headers.py`; forced usage's
(`middleware/_usage.c`) to `middleware.usage` in `test_usage_twins.py`."""

from __future__ import annotations

import os
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from middleware import frame, relaycore, speedups
from middleware.phases import Phase
from middleware.sse import LineState, advance
from sidecar.servers.http1 import nowait
from sidecar.upstream import h1core
from tests.support.compiled import built
from tests.support.fuzzing import examples

compiled_relay = built("middleware._relaycore")
compiled_frame = built("middleware._frame")
compiled_sidecar = built("sidecar._core")
compiled_heads = built("sidecar._heads")
compiled_usage = built("middleware._usage")
compiled_otlp = built("middleware.telemetry._otlp")
compiled_stamper = built("middleware.resume._stamper")
TWINS = ["python", "compiled"]


def test_the_run_uses_the_core_it_asked_for() -> None:
    """Without SIDESTREAM_NO_EXTENSIONS the compiled core is built and in use (a failed build
    would otherwise make both runs of the suite pure Python); with it, the Python one is."""
    from middleware import usage
    from middleware.relay import Relay
    from middleware.resume import producer, stamper
    from middleware.telemetry import otlp_encoder
    from sidecar import head_rules, headers
    from sidecar.servers import response_head
    from sidecar.servers.http1 import connection
    from sidecar.upstream.h1 import H1Connection

    if os.environ.get(speedups.DISABLE, "") not in ("", "0"):
        assert Relay.__mro__[1] is relaycore.RelayCore
        assert speedups.Frame is frame.Frame
        assert H1Connection.__mro__[1] is h1core.H1Core
        assert response_head.response_head is head_rules.response_head
        assert headers.request_rules is head_rules.request_rules
        assert headers.response_headers is head_rules.response_headers
        assert connection.read_headers is head_rules.read_headers
        assert usage._compiled is None
        assert otlp_encoder._compiled is None
        assert producer.Stamper is stamper.Stamper
    else:
        built = (compiled_relay, compiled_frame, compiled_sidecar, compiled_heads)
        assert None not in (*built, compiled_usage, compiled_otlp, compiled_stamper), "not built"
        assert Relay.__mro__[1] is compiled_relay.RelayCore
        assert speedups.Frame is compiled_frame.Frame
        assert H1Connection.__mro__[1] is compiled_sidecar.H1Core
        assert response_head.response_head is compiled_heads.response_head
        assert headers.request_rules is compiled_heads.request_rules
        assert headers.response_headers is compiled_heads.response_headers
        assert connection.read_headers is compiled_heads.read_headers
        assert usage._compiled is compiled_usage
        assert otlp_encoder._compiled is compiled_otlp
        assert producer.Stamper is compiled_stamper.Stamper


def test_a_core_that_is_not_built_is_named_where_the_user_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A missing compiled module means its Python twin, no error, and `core()` (the sidecar's
    start line, `sidestream --version`) names it; none built says pure Python."""
    monkeypatch.delenv(speedups.DISABLE, raising=False)
    monkeypatch.setattr(speedups, "_asked", {})
    assert speedups.compiled("middleware._relaycore") is compiled_relay
    assert speedups.core() == "compiled core"
    assert speedups.compiled("middleware._no_such_core") is None
    assert speedups.core() == "compiled core, pure Python for middleware._no_such_core (not built)"
    monkeypatch.setattr(speedups, "_asked", {})
    assert speedups.compiled("middleware._no_such_core") is None
    assert speedups.core() == "pure-Python core: the compiled one is not built"
    monkeypatch.setenv(speedups.DISABLE, "1")
    assert speedups.core() == "pure-Python core: SIDESTREAM_NO_EXTENSIONS=1"


def test_the_switch_turns_the_compiled_core_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIDESTREAM_NO_EXTENSIONS=1 picks the Python core even where the compiled one exists."""
    monkeypatch.setenv(speedups.DISABLE, "1")
    assert speedups.compiled("middleware._relaycore") is None
    monkeypatch.setenv(speedups.DISABLE, "0")
    assert speedups.compiled("middleware._relaycore") is compiled_relay


def _need(module: Any, twin: str) -> None:
    if twin == "compiled" and module is None:
        pytest.fail("the compiled core is not built: `make install` builds it (needs gcc)")


# -- the OTLP attributes' loop (telemetry's per-span encoding) ----------------------------------

_attribute_values = (
    st.text(max_size=6)
    | st.booleans()
    | st.floats(allow_nan=True)
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 0x7F, 0x80, 0x3FFF, 0x4000, 2**63 - 1, 2**63, -1])
    | st.tuples(st.text(max_size=3), st.text(max_size=3))
    | st.tuples(st.integers(0, 3))
    | st.lists(st.integers(0, 3), max_size=2)
    | st.binary(max_size=3)
    | st.none()
    | st.just(object())  # not encodable: logged and skipped, by both
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "gen_ai.response.id", "n"]), _attribute_values),
        max_size=8,
    )
)
def test_the_compiled_attributes_loop_encodes_as_the_python_one(
    items: list[tuple[str, object]],
) -> None:
    """Each attribute's KeyValue field, joined: the compiled loop writes the same bytes as
    the Python one and leaves the same caches, from empty caches (every attribute a miss)
    and again from the caches the first pass filled (hits), for every kind of value (the
    numbers at their varint and range edges, the kinds never cached, one that cannot be
    encoded)."""
    from middleware.telemetry import otlp_attributes, otlp_encoder

    _need(compiled_otlp, "compiled")
    attributes = dict(items)
    encoders = {twin: otlp_encoder.Encoder() for twin in TWINS}
    loops = {"python": otlp_attributes.attributes, "compiled": compiled_otlp.attributes}
    saved = otlp_encoder._attributes
    try:
        for _ in range(2):
            got = {}
            for twin, encoder in encoders.items():
                otlp_encoder._attributes = loops[twin]
                got[twin] = encoder.attributes(b"\x4a", attributes)
            assert got["compiled"] == got["python"]
            assert encoders["compiled"]._tagged == encoders["python"]._tagged
    finally:
        otlp_encoder._attributes = saved


def test_the_compiled_attributes_loop_refuses_what_the_python_one_refuses() -> None:
    """An unhashable tuple is a TypeError from both loops; arguments of the wrong kind are
    a TypeError, not a crash."""
    from middleware.telemetry import otlp_attributes, otlp_encoder

    _need(compiled_otlp, "compiled")
    saved = otlp_encoder._attributes
    try:
        for loop in (compiled_otlp.attributes, otlp_attributes.attributes):
            otlp_encoder._attributes = loop
            with pytest.raises(TypeError):
                otlp_encoder.Encoder().attributes(b"\x4a", {"a": ([1],)})
    finally:
        otlp_encoder._attributes = saved
    with pytest.raises(TypeError):
        compiled_otlp.attributes({}.items(), [], {}, {}, None, None, None, b"")


# -- RelayCore ---------------------------------------------------------------------------


class Edit:
    """An edit that upper-cases what it sees, with `ends` as given, and remembers undo."""

    def __init__(self, ends: frozenset[int] | None) -> None:
        self.ends = ends
        self.seen: list[bytes] = []
        self.undone = 0

    def __call__(self, body: bytes) -> bytes:
        self.seen.append(body)
        return body.upper()

    def undo(self) -> None:
        self.undone += 1


def tally(twin: str, folds: list[list[float]], kept: int = 3) -> Any:
    """A `Tally` of `twin`, no frame learned, that folds every `kept` times into `folds`."""
    _need(compiled_relay, twin)
    made = relaycore.Tally if twin == "python" else compiled_relay.Tally
    times: list[float] = []

    def fold() -> None:
        folds.append(list(times))
        times.clear()

    return made(times, kept, fold)


def relay(twin: str, written: list[bytes], *, accept: bool = True, observed: bool = False) -> Any:
    """A RelayCore of `twin` in BODY, writing into `written`, with a `tally` of the same twin
    (folding into `folds`). `observed`: a subclass's `_relayed` (telemetry's cycle has one)
    keeps the chunks that reach it in `relayed`."""
    _need(compiled_relay, twin)
    base = relaycore.RelayCore if twin == "python" else compiled_relay.RelayCore

    class Relay(base):  # type: ignore[misc, valid-type]
        __slots__ = ("folds", "relayed", "scanned")

        def _scan(self, body: bytes, now: float) -> None:
            self.scanned.append(body)

    class Observed(Relay):
        __slots__ = ()

        def _relayed(self, body: bytes, now: float) -> None:
            self.relayed.append(body)

    r = Observed() if observed else Relay()
    r.scanned, r.folds, r.relayed = [], [], []
    r.tally = tally(twin, r.folds)
    r.phase = Phase.BODY
    r.reason = r.sending_since = r.keepalive = r.inflater = r.edit = r.scanner = None
    r.slice_bytes = 0
    r.first_token_at = None
    r.line_state = LineState.EVENT
    r.last_chunk = r.last_write = 0.0

    def server(body: bytes) -> bool:
        if accept:
            written.append(body)
        return accept

    r.server_nowait = server
    return r


@pytest.mark.parametrize("twin", TWINS)
def test_send_nowait_writes_and_accounts(twin: str) -> None:
    """A chunk is written as is; the clocks, the first token and the line state follow it."""
    written: list[bytes] = []
    r = relay(twin, written)
    assert r.send_nowait(b"data: a\n\ndata: b") is True
    assert written == [b"data: a\n\ndata: b"]
    assert r.last_chunk == r.last_write == r.first_token_at > 0
    assert r.line_state is LineState.MID
    assert r.send_nowait(b"\n\n") is True and r.line_state is LineState.EVENT


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "field, value",
    [
        ("phase", Phase.HEADERS),
        ("reason", "stopped"),
        ("sending_since", 1.0),
        ("keepalive", "a task"),
        ("inflater", "an inflater"),
        ("server_nowait", None),
    ],
)
def test_send_nowait_refuses_what_send_must_do(twin: str, field: str, value: object) -> None:
    """Each state in which `send` would do more than write makes `send_nowait` refuse, with
    nothing written and nothing accounted."""
    written: list[bytes] = []
    r = relay(twin, written)
    setattr(r, field, value)
    assert r.send_nowait(b"data: x\n\n") is False
    assert written == [] and r.last_chunk == 0.0 and r.first_token_at is None


@pytest.mark.parametrize("twin", TWINS)
def test_send_nowait_refuses_a_chunk_longer_than_the_slice_bound(twin: str) -> None:
    """With `slice_bytes` set (resume's streams), a longer chunk is refused, for `send` to
    take in slices, and one no longer is written; 0 bounds nothing."""
    written: list[bytes] = []
    r = relay(twin, written)
    r.slice_bytes = 9
    assert r.send_nowait(b"data: x\n\n") is True  # 9 bytes
    assert r.send_nowait(b"data: xy\n\n") is False
    assert written == [b"data: x\n\n"] and r.line_state is LineState.EVENT
    r.slice_bytes = 0
    assert r.send_nowait(b"data: xy\n\n") is True and written[-1] == b"data: xy\n\n"


@pytest.mark.parametrize("twin", TWINS)
def test_a_refused_write_is_not_accounted(twin: str) -> None:
    """The server refusing (flow control) leaves the relay as it was."""
    r = relay(twin, [], accept=False)
    assert r.send_nowait(b"data: x\n\n") is False
    assert r.last_write == 0.0 and r.line_state is LineState.EVENT


@pytest.mark.parametrize("twin", TWINS)
def test_the_edit_sees_only_chunks_its_ends_name(twin: str) -> None:
    """With `ends`, a whole event whose fourth-last byte is not in it goes out uncalled; one
    whose byte is, or a chunk that does not end a line, goes through the edit."""
    written: list[bytes] = []
    r = relay(twin, written)
    edit = Edit(frozenset(b"}"))
    r.edit = edit
    assert r.send_nowait(b'data: {"a":[]}\n\n') and edit.seen == []
    assert r.send_nowait(b'data: {"u":{}}\n\n') and edit.seen == [b'data: {"u":{}}\n\n']
    assert r.send_nowait(b"data: x") and len(edit.seen) == 2
    assert written == [b'data: {"a":[]}\n\n', b'DATA: {"U":{}}\n\n', b"DATA: X"]


@pytest.mark.parametrize("twin", TWINS)
def test_an_edit_without_ends_sees_every_chunk_and_is_undone_on_refusal(twin: str) -> None:
    """`ends` None: every chunk is the edit's; a write the server refuses undoes the edit."""
    r = relay(twin, [], accept=False)
    edit = Edit(None)
    r.edit = edit
    assert r.send_nowait(b"data: a\n\n") is False
    assert edit.seen == [b"data: a\n\n"] and edit.undone == 1
    r.edit = None
    assert r.edit is None


@pytest.mark.parametrize("twin", TWINS)
def test_until_the_first_token_each_chunk_is_scanned(twin: str) -> None:
    """While a scanner is set, `_scan` sees the chunk and decides the first token."""
    r = relay(twin, [])
    r.scanner = "a scanner"
    assert r.send_nowait(b"data: x\n\n")
    assert r.scanned == [b"data: x\n\n"] and r.first_token_at is None


@pytest.mark.parametrize("twin", TWINS)
def test_an_overridden_relayed_is_the_one_called(twin: str) -> None:
    """A subclass's `_relayed` (telemetry's) runs in place of the core's."""
    base = type(relay(twin, []))

    class Observed(base):  # type: ignore[misc, valid-type]
        __slots__ = ("calls",)

        def _relayed(self, body: bytes, now: float) -> None:
            self.calls.append((body, now))

    r = Observed()
    for name in ("reason", "sending_since", "keepalive", "inflater", "edit", "scanner", "tally"):
        setattr(r, name, None)
    r.phase, r.calls, r.server_nowait, r.slice_bytes = Phase.BODY, [], lambda body: True, 0
    assert r.send_nowait(b"x")
    assert r.calls == [(b"x", r.last_write)]


@settings(max_examples=examples(300), deadline=None)
@given(
    state=st.sampled_from(list(LineState)),
    chunk=st.binary(max_size=8) | st.lists(st.sampled_from([b"\r", b"\n", b"a"])).map(b"".join),
)
def test_the_compiled_line_state_is_sse_advance(state: LineState, chunk: bytes) -> None:
    """The compiled relay's line state after any chunk, from any state, is `sse.advance`'s."""
    _need(compiled_relay, "compiled")
    r = relay("compiled", [])
    r.first_token_at = 1.0
    r.line_state = state
    r._relayed(chunk, 2.0)
    assert r.line_state is advance(state, chunk)


# -- Frame -------------------------------------------------------------------------------

# A chat stream's token chunk around its content string, as a server writes each one.
PREFIX = (
    b'data: {"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"'
)
MARKER = b'"},"logprobs":null,"finish_reason":null}]'
SUFFIX = MARKER + b"}\n\n"


def token(content: bytes, suffix: bytes = SUFFIX) -> bytes:
    return PREFIX + content + suffix


def make_frame(
    twin: str, prefix: bytes = PREFIX, marker: bytes = MARKER, suffix: bytes = SUFFIX
) -> Any:
    _need(compiled_frame, twin)
    return (frame.Frame if twin == "python" else compiled_frame.Frame)(prefix, marker, suffix)


@pytest.mark.parametrize(
    "prefix, marker, suffix",
    [(PREFIX, MARKER, SUFFIX), (PREFIX, MARKER, MARKER + b',"t":1}\n\n'), (b"", b"", b"")],
)
def test_a_compiled_frame_is_built_as_the_python_one(
    prefix: bytes, marker: bytes, suffix: bytes
) -> None:
    """The same parts and the same lengths derived from them, and no tail seen yet."""
    python = make_frame("python", prefix, marker, suffix)
    compiled = make_frame("compiled", prefix, marker, suffix)
    for name in ("prefix", "marker", "suffix", "start", "shortest", "tail_len", "varies"):
        assert getattr(compiled, name) == getattr(python, name), name


STAMPED = MARKER + b',"t":1730000000}\n\n'  # a tail of its own, as the emulator's stamp


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "body, matches, varies",
    [
        (token(b"hi"), True, False),
        (token(b'\\"'), True, False),  # an escaped quote is content
        (token(b""), False, False),  # "content":""
        (token(b'", "role":"x'), False, False),  # "" then another key
        (token(b"a\n"), False, False),  # a line end: two lines
        (token(b"a\n\ndata: x"), False, False),  # two events
        (PREFIX + SUFFIX[1:], False, False),  # overlapping at the quote
        (PREFIX[1:] + b"x" + SUFFIX, False, False),  # not the prefix
        (token(b"x")[:-1], False, False),  # no event end yet
        (PREFIX + b"x", False, False),  # shorter than any token chunk
        (token(b"x", STAMPED), True, True),  # a tail of its own: learnt that tails vary
        (token(b"x", MARKER + b',"usage":null}\n\n'), True, True),
        (token(b"x", MARKER + b',"usage":{"completion_tokens":1}}\n\n'), False, False),
        (token(b"x", MARKER + b"}\n \n\n"), True, True),  # a line of spaces: no event
        (token(b"x", MARKER + b"}\n\ndata: {}\n\n"), False, False),  # a second event
        (token(b"x", b'"}}]}\n\n'), False, False),  # the choices end otherwise
    ],
)
def test_each_twin_of_frame_matches_one_token_event_of_the_frame(
    twin: str, body: bytes, matches: bool, varies: bool
) -> None:
    """A chunk is one token of the frame when it has the prefix, non-empty content on one
    line, and the suffix, or the marker and a tail without usage (which teaches the frame
    that tails vary): each twin by the rule."""
    f = make_frame(twin)
    assert f.matches(body) is matches
    assert f.varies is varies


@pytest.mark.parametrize("twin", TWINS)
def test_once_tails_vary_every_chunk_takes_the_marker_check(twin: str) -> None:
    """After a tail of its own, the learned suffix still matches and the rule is the same."""
    f = make_frame(twin)
    assert f.matches(token(b"x", STAMPED)) and f.varies
    assert f.matches(token(b"y"))
    assert not f.matches(token(b""))
    assert not f.matches(token(b"a\n"))
    assert f.matches(token(b"z", MARKER + b',"t":2}\n\n'))


def _same(python: Any, compiled: Any, bodies: list[bytes]) -> None:
    for body in bodies:
        assert compiled.matches(body) is python.matches(body), body
        assert compiled.varies is python.varies, body


# What a body is made of around a frame's parts: bytes the rule looks at.
CONTENTS = [b"x", b"", b'"', b'\\"', b"a\n", b"}]", b"\\", b"\r"]
TAILS = [b"", b"}", b',"t":9}', b',"usage":null}', b',"usage":{}}', b'"usage"usage":null}']
ENDS = [b"\n\n", b"\n", b"", b" \n\n", b"\n\t\n\n", b"\n\x0b\n\n", b"\n\x0c\n\n", b"\r\n\r\n"]
ENDS += [b"\n\ndata: x\n\n", b"\n\x1c\n\n"]  # two events; a byte str.strip() takes, not bytes'


@st.composite
def around(draw: st.DrawFn, parts: tuple[bytes, bytes, bytes]) -> bytes:
    """A body around a frame: its prefix (or not quite), content, then the suffix whole or
    cut, or the marker (or not) and a tail, and an event's end (or something like it)."""
    prefix, marker, suffix = parts
    head = draw(st.sampled_from([prefix, prefix, prefix[1:], prefix[:-1], b"d"]))
    content = draw(st.sampled_from(CONTENTS))
    cut = draw(st.integers(0, len(suffix)))
    tail, end = draw(st.sampled_from(TAILS)), draw(st.sampled_from(ENDS))
    ending = draw(
        st.sampled_from(
            [suffix, suffix, suffix[cut:], suffix[:cut], marker + tail + end, tail + end, end]
        )
    )
    return head + content + ending


@settings(max_examples=examples(500), deadline=None)
@given(st.sampled_from([SUFFIX, STAMPED]), st.data())
def test_the_compiled_frame_decides_any_body_as_the_python_one(
    suffix: bytes, data: st.DataObject
) -> None:
    """A chat stream's frame (its suffix learnt with a constant tail or a stamp) and random
    bodies around it, one after another: the compiled frame gives the Python one's answer
    each time, and learns that tails vary at the same chunk."""
    parts = (PREFIX, MARKER, suffix)
    python, compiled = make_frame("python", *parts), make_frame("compiled", *parts)
    _same(python, compiled, data.draw(st.lists(around(parts), max_size=10)))


@st.composite
def odd_frames(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    """Frames no dialect would learn: empty parts, a suffix longer than most bodies, a
    marker longer than the suffix or not at its start."""
    prefix = draw(st.sampled_from([b"", b"d", b'{"c":"', b'"}]', PREFIX]))
    marker = draw(st.sampled_from([b"", b'"', b'"}]', b"}]", MARKER]))
    tail, end = draw(st.sampled_from(TAILS)), draw(st.sampled_from(ENDS))
    suffix = draw(st.sampled_from([b"", marker, marker + tail + end, tail + end, b"0" * 24]))
    return prefix, marker, suffix


@settings(max_examples=examples(1000), deadline=None)
@given(odd_frames(), st.data())
def test_the_compiled_frame_agrees_on_odd_frames_too(
    parts: tuple[bytes, bytes, bytes], data: st.DataObject
) -> None:
    """Odd frames and bodies around them, short ones included, so that the rule's slices
    run off either end of the body: the same answers (the compiled slices clamp and wrap
    as Python's do)."""
    python, compiled = make_frame("python", *parts), make_frame("compiled", *parts)
    _same(python, compiled, data.draw(st.lists(around(parts), max_size=10)))


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "parts, body, matches",
    [
        ((b"d", b"", b"12345"), b"dx\n\n", True),  # the marker's slice starts before 0
        ((b"d", b'"', b"0" * 24), b'dxxx"xxxxxxx\n\n', True),  # ... and ends before 0 too
        ((b'"}]', b"}]", b"}]x\n\n"), b'"}]xy\n\n', False),  # the choices' end in the prefix
    ],
)
def test_a_frame_takes_its_slices_as_python_does(
    twin: str, parts: tuple[bytes, bytes, bytes], body: bytes, matches: bool
) -> None:
    """Where a frame's suffix is longer than the body, its slices count from the end, as
    Python's do; a choices' end (`}]`) inside the prefix is not the marker's."""
    assert make_frame(twin, *parts).matches(body) is matches


# -- first_token ---------------------------------------------------------------------------

_TOKEN_BITS = [
    b'"content":"', b'"content":""', b'"content": "x"', b'"content":null', b'"content"',
    b'"reasoning_content":"r"', b'"reasoning":""', b'"refusal":"no"', b'"arguments":"{}"',
    b'"text":"', b'"text":""', b'"text" : "t"', b'x', b'"', b'\\"', b"\xc3\xa9", b"\xff",
    b"\xc2\xa0", b" ", b"{", b"}", b'"role":"assistant"', b"[DONE]",
]  # fmt: skip


def _first_token_twin(twin: str) -> Any:
    _need(compiled_frame, twin)
    return frame.first_token if twin == "python" else compiled_frame.first_token


@settings(max_examples=examples(3000), deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(_TOKEN_BITS), max_size=6).map(b"".join), max_size=4),
    st.sampled_from(["chat", "completions"]),
)
@example([b'{"delta":{"role":"assistant","content":""}}', b'{"delta":{"content":"Hi"}}'], "chat")
def test_first_token_on_bytes_is_is_token_on_the_events(parts: list[bytes], kind: str) -> None:
    """The first-token check on the events' bytes gives the same answer compiled and in
    Python; and any answer it gives (None: ask the events) is `is_token`'s on the events
    made from those bytes, whatever the bytes (non-ASCII, invalid UTF-8, spaces, the keys
    inside other strings): True when one of them is a token, False when none is."""
    from middleware.dialects import OPENAI_CHAT, OPENAI_COMPLETIONS
    from middleware.sse import message_event

    dialect = OPENAI_CHAT if kind == "chat" else OPENAI_COMPLETIONS
    literal, keys = dialect._literal_bytes, dialect._keys_bytes
    python = frame.first_token(parts, literal, keys)
    if compiled_frame is not None:
        assert compiled_frame.first_token(parts, literal, keys) is python
    if python is not None:
        assert python is any(dialect.is_token(message_event(part)) for part in parts)


@pytest.mark.parametrize("twin", TWINS)
def test_a_role_chunk_then_a_token_is_decided_on_the_bytes(twin: str) -> None:
    """A chat stream's usual start, the role chunk (empty content) and a token: decided on
    the bytes (no event made), not handed back; a reasoning delta is the regex's case."""
    first_token = _first_token_twin(twin)
    from middleware.dialects import OPENAI_CHAT as chat

    role = b'{"choices":[{"delta":{"role":"assistant","content":""}}]}'
    token = b'{"choices":[{"delta":{"content":"Hi"}}]}'
    assert first_token([role], chat._literal_bytes, chat._keys_bytes) is False
    assert first_token([role, token], chat._literal_bytes, chat._keys_bytes) is True
    thinking = b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}'
    assert first_token([thinking], chat._literal_bytes, chat._keys_bytes) is None


# -- RelayCore's token path --------------------------------------------------------------


def learned(twin: str, frame_twin: str, written: list[bytes], *, accept: bool = True) -> Any:
    """A relay past its first token whose stream's frame is learned, with telemetry's
    `_relayed` (the chunks that reach it are kept in `relayed`)."""
    r = relay(twin, written, accept=accept, observed=True)
    r.first_token_at = 1.0
    r.tally.frame = make_frame(frame_twin)
    return r


@pytest.mark.parametrize("frame_twin", TWINS)
@pytest.mark.parametrize("twin", TWINS)
def test_a_token_chunk_of_the_frame_is_tallied_in_place_of_relayed(
    twin: str, frame_twin: str
) -> None:
    """A chunk the tally's frame matches is written and counted by the core itself: the idle
    clock, and in the tally the chunk, its bytes, its time; the subclass's `_relayed` never
    sees it, and the first token and the line state stay as they were (one whole event)."""
    written: list[bytes] = []
    r = learned(twin, frame_twin, written)
    body = token(b"hi")
    assert r.send_nowait(body) is True
    assert written == [body] and r.relayed == []
    assert (r.tally.chunks, r.tally.body_bytes) == (1, len(body))
    assert r.tally.times == [r.last_write] and r.last_chunk == r.last_write > 1.0
    assert r.first_token_at == 1.0 and r.line_state is LineState.EVENT


@pytest.mark.parametrize("frame_twin", TWINS)
@pytest.mark.parametrize("twin", TWINS)
def test_any_other_chunk_goes_to_relayed_untallied(twin: str, frame_twin: str) -> None:
    """A chunk the frame does not match (empty content, two lines, [DONE], half an event)
    goes to `_relayed`, written but not counted by the core."""
    written: list[bytes] = []
    r = learned(twin, frame_twin, written)
    others = [token(b""), token(b"a\n"), b"data: [DONE]\n\n", token(b"x")[:-1]]
    for body in others:
        assert r.send_nowait(body) is True
    assert written == r.relayed == others
    assert (r.tally.chunks, r.tally.body_bytes, r.tally.times) == (0, 0, [])


@pytest.mark.parametrize("twin", TWINS)
def test_without_a_frame_a_token_chunk_goes_to_relayed(twin: str) -> None:
    """No frame learned (not yet, or a read left the stream inside an event): every chunk
    is `_relayed`'s, and the tally counts none."""
    r = relay(twin, [], observed=True)
    assert r.send_nowait(token(b"x")) and r.relayed == [token(b"x")]
    assert (r.tally.chunks, r.tally.times) == (0, [])


@pytest.mark.parametrize("twin", TWINS)
def test_without_a_tally_nothing_is_counted(twin: str) -> None:
    """Telemetry off: no tally, every chunk is `_relayed`'s (the compiled one keeps the
    guard's state: the idle clock, the line state), and the core counts nothing."""
    r = relay(twin, [])
    r.tally = None
    r.first_token_at = 1.0
    assert r.send_nowait(token(b"x")) and r.line_state is LineState.EVENT
    assert r.send_nowait(b"data: half") and r.line_state is LineState.MID
    assert r.last_chunk == r.last_write > 1.0 and r.tally is None
    assert not any(name in dir(r) for name in ("chunks", "body_bytes", "times", "frame"))


@pytest.mark.parametrize("twin", TWINS)
def test_the_token_times_are_folded_each_kept(twin: str) -> None:
    """The tally's `fold` is called when the times it holds reach `kept`, and only then;
    every token is counted across the folds."""
    r = learned(twin, twin, [])
    for _ in range(7):
        assert r.send_nowait(token(b"x"))
    assert [len(batch) for batch in r.folds] == [3, 3] and len(r.tally.times) == 1
    assert r.tally.chunks == 7 and r.tally.body_bytes == 7 * len(token(b"x"))


@pytest.mark.parametrize("twin", TWINS)
def test_a_token_chunk_the_server_refuses_is_not_tallied(twin: str) -> None:
    """Flow control: the chunk comes again by `send`, so it is counted then, not now."""
    r = learned(twin, twin, [], accept=False)
    assert r.send_nowait(token(b"x")) is False
    assert (r.tally.chunks, r.tally.times, r.relayed) == (0, [], [])


@pytest.mark.parametrize("twin", TWINS)
def test_a_tally_is_made_alike_by_both_twins(twin: str) -> None:
    """`Tally(times, kept, fold)`: the list given (telemetry's `Gaps.times`, appended to in
    place), nothing counted, no frame; its counts writable (telemetry's `_relayed` adds the
    other chunks), and a fold that raises is the caller's error, the time already kept."""
    times: list[float] = []
    made = (relaycore.Tally if twin == "python" else compiled_relay.Tally)(
        times=times, kept=2, fold=lambda: 1 / 0
    )
    assert made.times is times and made.kept == 2 and made.frame is None
    assert (made.chunks, made.body_bytes) == (0, 0)
    made.chunks += 2
    made.body_bytes += 10
    r = relay(twin, [])
    r.tally, made.frame = made, make_frame(twin)
    r._account(token(b"x"), 1.0)
    with pytest.raises(ZeroDivisionError):
        r._account(token(b"y"), 2.0)
    assert times == [1.0, 2.0] and (made.chunks, made.body_bytes) == (4, 10 + 2 * len(token(b"x")))


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.sampled_from([token(b"x"), token(b"longer"), token(b""), b"data: [DONE]\n\n", b"da"]),
        max_size=12,
    )
)
def test_both_twins_tally_any_run_of_chunks_alike(chunks: list[bytes]) -> None:
    """Any run of chunks, token chunks of the frame or not, leaves the two twins' tallies
    alike: the same counts, times and folds, and the same chunks left to `_relayed`."""
    _need(compiled_relay, "compiled")
    seen = []
    for twin in TWINS:
        r = learned(twin, twin, [])
        for at, body in enumerate(chunks):
            r._account(body, float(at))
        t = r.tally
        seen.append((t.chunks, t.body_bytes, t.times, r.folds, r.relayed, r.last_chunk))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("twin", TWINS)
def test_a_tally_that_is_not_one_is_an_error_not_a_crash(twin: str) -> None:
    """The compiled core reads its tally in place: anything but its own `Tally` there is a
    clear error (the Python twin's, an attribute error), never a read of another object."""
    r = relay(twin, [])
    r.tally = SimpleNamespace(chunks=0)
    with pytest.raises((TypeError, AttributeError)):
        r._account(token(b"x"), 1.0)


@pytest.mark.parametrize("twin", TWINS)
def test_account_is_sends_accounting_as_send_nowaits(twin: str) -> None:
    """`_account`, which `send` calls for each body chunk, counts as `send_nowait` does, at
    the time it is given: a token chunk of the frame tallied, any other to `_relayed`."""
    r = learned(twin, twin, [])
    body = token(b"x")
    r._account(body, 5.0)
    tallied = (r.tally.chunks, r.tally.body_bytes, r.last_chunk, r.tally.times)
    assert tallied == (1, len(body), 5.0, [5.0])
    assert r.relayed == [] and r.first_token_at == 1.0
    r._account(b"data: [DONE]\n\n", 6.0)
    assert r.relayed == [b"data: [DONE]\n\n"] and r.tally.chunks == 1


# -- ChunkWriter -------------------------------------------------------------------------


class SlottedFlow:
    """The sidecar's `Flow` as the writer sees it: `write_paused` a slot, the rest a dict."""

    __slots__ = ("__dict__", "write_paused")


class SlottedCycle:
    """The sidecar's `RequestCycle` as the writer sees it: the three fields it reads per
    chunk are slots (read in place by the compiled one), the others in the instance dict."""

    __slots__ = ("__dict__", "chunked_encoding", "disconnected", "response_complete")


class PropertyCycle(SlottedCycle):
    """A subclass that turns one slotted field into a property: the class decides."""

    @property
    def disconnected(self) -> bool:  # type: ignore[override]
        return bool(self.__dict__.get("gone"))


def writer(twin: str, kind: str = "dict", **state: Any) -> tuple[Any, Any, list[bytes]]:
    """A writer into a cycle whose fields are in its dict (`dict`), in slots (`slots`), or
    one of them a property (`property`: set `gone` to disconnect)."""
    written: list[bytes] = []
    fields = dict(disconnected=False, response_complete=False, chunked_encoding=True)
    if kind == "dict":
        flow: Any = SimpleNamespace(write_paused=False)
        cycle: Any = SimpleNamespace(**fields)
    else:
        flow, cycle = SlottedFlow(), SlottedCycle() if kind == "slots" else PropertyCycle()
        flow.write_paused = False
        if kind == "property":
            del fields["disconnected"]
        for key, value in fields.items():
            setattr(cycle, key, value)
    cycle.flow, cycle.transport = flow, SimpleNamespace(write=written.append)
    for key, value in state.items():
        setattr(cycle, key, value)
    if twin == "compiled":
        _need(compiled_sidecar, twin)
        return compiled_sidecar.ChunkWriter(cycle), cycle, written
    saved = nowait.core
    nowait.core = None
    try:
        return nowait.send_nowait(cycle), cycle, written  # type: ignore[arg-type]
    finally:
        nowait.core = saved


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("size", [0, 1, 15, 16, 255, 4096, 70000])
def test_a_chunk_is_framed_as_uvicorn_frames_it(twin: str, size: int) -> None:
    """The write is `%x\\r\\n<body>\\r\\n`, uvicorn's chunked framing, for any size."""
    write, _, written = writer(twin)
    body = b"z" * size
    assert write(body) is True
    assert written == [b"%x\r\n%b\r\n" % (size, body)]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("kind", ["dict", "slots"])
@pytest.mark.parametrize(
    "state",
    [
        {"disconnected": True},
        {"response_complete": True},
        {"chunked_encoding": None},
        {"chunked_encoding": False},
        {"chunked_encoding": 0},
    ],
)
def test_the_writer_refuses_what_uvicorn_would_not_write(
    twin: str, kind: str, state: dict[str, Any]
) -> None:
    """A gone client, a complete response, or a body not chunked: refused, nothing written,
    whether the cycle keeps its fields in its dict or in slots."""
    write, _, written = writer(twin, kind, **state)
    assert write(b"x") is False and written == []


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("kind", ["dict", "slots"])
def test_the_writer_refuses_while_uvicorn_pauses_writing(twin: str, kind: str) -> None:
    """Flow control: while the transport's buffer is over its mark, refused; after, written.
    The writer reads each field at each write, never a copy made when it was made."""
    write, cycle, written = writer(twin, kind)
    cycle.flow.write_paused = True
    assert write(b"x") is False
    cycle.flow.write_paused = False
    assert write(b"x") is True and written == [b"1\r\nx\r\n"]
    cycle.response_complete = True
    assert write(b"y") is False and written == [b"1\r\nx\r\n"]


@pytest.mark.parametrize("twin", TWINS)
def test_a_field_the_cycle_class_makes_a_property_is_read_through_it(twin: str) -> None:
    """A slot overridden by a subclass's property is read through the property."""
    write, cycle, written = writer(twin, "property")
    assert write(b"x") is True
    cycle.gone = True
    assert write(b"x") is False and written == [b"1\r\nx\r\n"]


@pytest.mark.parametrize("twin", TWINS)
def test_an_unset_slot_raises_as_getattr_does(twin: str) -> None:
    """A slot never set is an AttributeError from both twins, not a crash or a write."""
    write, cycle, written = writer(twin, "slots")
    del cycle.response_complete
    with pytest.raises(AttributeError):
        write(b"x")
    assert written == []


# The write past the transport (`uvloop_internals.direct_fd` gives a descriptor): a real
# socket pair, and a transport that says whether it is closing and how many bytes it holds.


class Past:
    """A transport the writer may write past: its state, and what its own `write` got."""

    def __init__(self, closing: bool = False, held: int = 0) -> None:
        self.closing, self.held = closing, held
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.held

    def write(self, data: bytes) -> None:
        self.written.append(data)


class SlotPast:
    """`Past` whose instances have no `__dict__`, as uvloop's transport: the compiled writer
    calls the type's two methods, looked up once, rather than looking them up per chunk."""

    __slots__ = ("closing", "held", "written")

    def __init__(self, closing: bool = False, held: int = 0) -> None:
        self.closing, self.held = closing, held
        self.written: list[bytes] = []

    is_closing = Past.is_closing
    get_write_buffer_size = Past.get_write_buffer_size
    write = Past.write


class OtherSlotPast(SlotPast):
    """A second such type: the writer remembers one type's methods at a time."""

    __slots__ = ()

    def get_write_buffer_size(self) -> int:
        return self.held + 1  # always holds something: never written past


@pytest.fixture
def pair() -> Any:
    import socket

    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


def past_writer(twin: str, transport: Past, fd: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The writer `send_nowait` makes for a cycle on `transport`, told it may write to `fd`."""
    cycle: Any = SimpleNamespace(disconnected=False, response_complete=False)
    cycle.chunked_encoding, cycle.transport = True, transport
    cycle.flow = SimpleNamespace(write_paused=False)
    monkeypatch.setattr(nowait, "direct_fd", lambda t: fd if t is transport else None)
    if twin == "compiled":
        _need(compiled_sidecar, twin)
    else:
        monkeypatch.setattr(nowait, "core", None)
    return nowait.send_nowait(cycle)


def drain(sock: Any) -> bytes:
    out = b""
    while True:
        try:
            got = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not got:
            return out
        out += got


@pytest.mark.parametrize("twin", TWINS)
def test_a_chunk_goes_to_the_socket_itself_while_the_transport_holds_nothing(
    twin: str, pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing held, not closing: the framed chunk is written to the socket, the transport's
    `write` is not called."""
    ours, peer = pair
    transport = Past()
    write = past_writer(twin, transport, ours.fileno(), monkeypatch)
    assert write(b"hello") is True and write(b"") is True
    assert drain(peer) == b"5\r\nhello\r\n0\r\n\r\n" and transport.written == []


@pytest.mark.parametrize("twin", TWINS)
def test_the_descriptor_is_asked_at_the_first_write_and_only_once(
    twin: str, pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking uvloop's transport for its socket is a system call, and the writer is made on
    the way to the stream's first token: the writer asks for the descriptor at its first
    write (after that token, which `send` writes), once, and not again for later chunks; a
    writer that refuses before it needs the descriptor (the response not started) does not
    ask either."""
    ours, peer = pair
    transport, asked = Past(), []
    cycle: Any = SimpleNamespace(disconnected=False, response_complete=False)
    cycle.chunked_encoding, cycle.transport = None, transport  # the head not yet written
    cycle.flow = SimpleNamespace(write_paused=False)
    monkeypatch.setattr(nowait, "direct_fd", lambda t: asked.append(t) or ours.fileno())
    if twin == "compiled":
        _need(compiled_sidecar, twin)
    else:
        monkeypatch.setattr(nowait, "core", None)
    write = nowait.send_nowait(cycle)
    assert asked == []
    assert write(b"x") is False and asked == []  # refused: the response has not started
    cycle.chunked_encoding = True
    assert write(b"a") is True and write(b"b") is True
    assert asked == [transport] and drain(peer) == b"1\r\na\r\n1\r\nb\r\n"


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("state", [{"held": 1}, {"closing": True}])
@pytest.mark.parametrize("kind", [Past, SlotPast])
def test_a_transport_holding_bytes_or_closing_writes_the_chunk_itself(
    twin: str, kind: Any, state: dict[str, Any], pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes held by the transport go first (the chunk after them, through it), and a
    closing transport's descriptor may be closed or given to another connection: the
    transport's own `write` takes the chunk, nothing goes to the socket. Once it holds
    nothing and is not closing, the next chunk goes to the socket: its state is asked per
    chunk, whether its methods are looked up by name or once for its type."""
    ours, peer = pair
    transport = kind(**state)
    write = past_writer(twin, transport, ours.fileno(), monkeypatch)
    assert write(b"x") is True
    assert transport.written == [b"1\r\nx\r\n"] and drain(peer) == b""
    transport.held, transport.closing = 0, False
    assert write(b"y") is True
    assert transport.written == [b"1\r\nx\r\n"] and drain(peer) == b"1\r\ny\r\n"


@pytest.mark.parametrize("twin", TWINS)
def test_writers_on_transports_of_two_types_each_ask_their_own(
    twin: str, pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer made for a second transport type does not make the first type's writer ask
    the second type's methods (nor the reverse): each transport's own answer decides."""
    ours, peer = pair
    first, other = SlotPast(), OtherSlotPast()
    write_first = past_writer(twin, first, ours.fileno(), monkeypatch)
    write_other = past_writer(twin, other, ours.fileno(), monkeypatch)
    assert write_first(b"a") is True and write_other(b"b") is True and write_first(b"c") is True
    assert drain(peer) == b"1\r\na\r\n1\r\nc\r\n"  # `other` always holds a byte
    assert first.written == [] and other.written == [b"1\r\nb\r\n"]


@pytest.mark.parametrize("twin", TWINS)
def test_what_the_socket_does_not_take_goes_to_the_transport_in_order(
    twin: str, pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket that takes part of a chunk, then none (its buffer full: EAGAIN): the rest of
    the first and all of the next go to the transport, so socket then transport is each
    chunk's framing in order, byte for byte."""
    ours, peer = pair
    transport = Past()
    write = past_writer(twin, transport, ours.fileno(), monkeypatch)
    big, after = bytes(range(256)) * 40000, b"next"  # 10 MB: more than a socket buffer
    assert write(big) is True
    assert len(transport.written) == 1  # the part the socket did not take
    assert write(after) is True  # the socket is full: EAGAIN, all of it to the transport
    framed = b"%x\r\n%b\r\n" % (len(big), big) + b"4\r\nnext\r\n"
    assert drain(peer) + b"".join(transport.written) == framed
    assert transport.written[-1] == b"4\r\nnext\r\n"


@pytest.mark.parametrize("twin", TWINS)
def test_a_socket_error_hands_the_chunk_to_the_transport(
    twin: str, pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer gone (EPIPE): the chunk goes whole to the transport's `write`, which meets
    the error itself and closes as it does for any failed write; no exception here."""
    ours, peer = pair
    peer.close()
    transport = Past()
    write = past_writer(twin, transport, ours.fileno(), monkeypatch)
    assert write(b"x") is True and transport.written == [b"1\r\nx\r\n"]


# -- H1Core ------------------------------------------------------------------------------


class Parser:
    """Stands in for httptools' parser: each feed appends its body pieces, or raises."""

    def __init__(self, conn: Any, pieces: list[bytes], error: Exception | None = None) -> None:
        self.conn, self.pieces, self.error = conn, pieces, error

    def feed_data(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.conn.chunks.extend(self.pieces)


def connection(twin: str, sink: Any = None) -> Any:
    if twin == "compiled":
        _need(compiled_sidecar, twin)
        base = compiled_sidecar.H1Core
    else:
        base = h1core.H1Core

    class Conn(base):  # type: ignore[misc, valid-type]
        __slots__ = ("events",)

        def abort(self) -> None:
            self.events.append("abort")

        def _feed_failed(self, exc: Exception) -> None:
            self.events.append(("failed", exc))

        def _after_feed(self) -> None:
            self.events.append(("after", list(self.chunks)))

    c = Conn()
    c.events, c.chunks, c.complete, c.received, c.sink = [], [], False, False, sink
    c.at_boundary = c.chunk_end = False
    return c


@pytest.mark.parametrize("twin", TWINS)
def test_a_read_the_sink_takes_goes_no_further(twin: str) -> None:
    """Body pieces of one read go to the sink joined, are cleared, and wake nothing."""
    taken: list[bytes] = []
    c = connection(twin, sink=lambda body: taken.append(body) or True)
    c._parser = Parser(c, [b"ab", b"cd"])
    c.data_received(b"...")
    assert taken == [b"abcd"] and c.chunks == [] and c.events == [] and c.received is True


@pytest.mark.parametrize("relay_twin", TWINS)
@pytest.mark.parametrize("twin", TWINS)
def test_the_relays_send_nowait_as_the_sink_takes_or_refuses_each_read(
    twin: str, relay_twin: str
) -> None:
    """With the relay's `send_nowait` as the sink, as the proxy sets it (the compiled
    connection calls a compiled relay's function directly): a whole chunk it takes is
    written and goes no further; one it refuses is left for the reader. A sink set later
    in its place is the one called."""
    written: list[bytes] = []
    r = relay(relay_twin, written)
    c = connection(twin, sink=r.send_nowait)
    c._parser = Parser(c, [], AssertionError("the parser was fed"))
    c.at_boundary = True
    c.data_received(b"5\r\nhello\r\n")
    assert written == [b"hello"] and c.chunks == [] and c.events == []
    r.sending_since = 1.0  # a send under way: it refuses
    c.data_received(b"3\r\nabc\r\n")
    assert written == [b"hello"] and c.events == [("after", [b"abc"])]
    c.chunks.clear()
    taken: list[bytes] = []
    c.sink = lambda body: taken.append(body) or True
    c.data_received(b"2\r\nok\r\n")
    assert taken == [b"ok"] and written == [b"hello"]
    c.sink = r.send_nowait
    r.sending_since = None
    c.data_received(b"1\r\n!\r\n")
    assert written == [b"hello", b"!"] and taken == [b"ok"]


@pytest.mark.parametrize("twin", TWINS)
def test_a_refused_or_sinkless_read_goes_to_after_feed(twin: str) -> None:
    """The sink refusing, or no sink, leaves the pieces for `_after_feed` (the reader)."""
    c = connection(twin, sink=lambda body: False)
    c._parser = Parser(c, [b"ab"])
    c.data_received(b"...")
    assert c.events == [("after", [b"ab"])]
    c = connection(twin)
    c._parser = Parser(c, [b"cd"])
    c.data_received(b"...")
    assert c.events == [("after", [b"cd"])]


@pytest.mark.parametrize("twin", TWINS)
def test_the_end_goes_to_after_feed_even_when_the_sink_took_the_bytes(twin: str) -> None:
    """A read that completes the response is news to the reader, whoever took its bytes."""
    c = connection(twin, sink=lambda body: True)

    class Ending(Parser):
        def feed_data(self, data: bytes) -> None:
            super().feed_data(data)
            self.conn.complete = True

    c._parser = Ending(c, [b"last"])
    c.data_received(b"...")
    assert c.events == [("after", [])]


@pytest.mark.parametrize("twin", TWINS)
def test_bytes_on_an_idle_or_finished_connection_abort_it(twin: str) -> None:
    """No exchange (no parser), or one complete: unasked bytes abort the connection."""
    c = connection(twin)
    c._parser = None
    c.data_received(b"x")
    c._parser, c.complete = Parser(c, []), True
    c.data_received(b"x")
    assert c.events == ["abort", "abort"]


@pytest.mark.parametrize("twin", TWINS)
def test_whole_chunks_at_a_boundary_are_taken_without_the_parser(twin: str) -> None:
    """Where the parser stands between chunks, a read of whole chunks is taken here: its
    payloads to the sink, the parser never fed, and it still stands between chunks."""
    taken: list[bytes] = []
    c = connection(twin, sink=lambda body: taken.append(body) or True)
    c._parser = Parser(c, [], AssertionError("the parser was fed"))
    c.at_boundary = True
    c.data_received(b"5\r\nhello\r\n")
    c.data_received(b"00003\r\nabc\r\nA\r\n0123456789\r\n")
    assert taken == [b"hello", b"abc0123456789"] and c.at_boundary is True
    assert c.events == [] and c.received is True


@pytest.mark.parametrize("sink", ["refuses", "none", "raises"])
@pytest.mark.parametrize("twin", TWINS)
def test_a_whole_chunk_the_sink_does_not_take_is_left_for_the_reader(twin: str, sink: str) -> None:
    """A read of one whole chunk at a boundary that the sink refuses, or with no sink, is in
    `chunks` for `_after_feed` (the reader), after what was already there; when the sink
    raises, the error propagates and the chunk is in `chunks` all the same."""

    def raising(body: bytes) -> bool:
        raise KeyError("sink")

    given = {"refuses": lambda body: False, "none": None, "raises": raising}[sink]
    for before in ([], [b"held"]):
        c = connection(twin, sink=given)
        c._parser = Parser(c, [], AssertionError("the parser was fed"))
        c.at_boundary = True
        c.chunks.extend(before)
        if sink == "raises":
            with pytest.raises(KeyError):
                c.data_received(b"5\r\nhello\r\n")
            assert c.chunks == [*before, b"hello"] and c.events == []
        else:
            c.data_received(b"5\r\nhello\r\n")
            assert c.events == [("after", [*before, b"hello"])]


@pytest.mark.parametrize(
    "data",
    [
        b"5\r\nhel",  # a chunk cut across reads
        b"5\r\nhello\r\n0\r\n\r\n",  # the last chunk
        b"5;ext=1\r\nhello\r\n",  # an extension
        b"+5\r\nhello\r\n",  # not a hex size
        b"123456789\r\n",  # more than eight digits
        b"5\r\nhelloXY",  # no CRLF after the payload
        b"5\r\nhello\r\n3",  # whole chunks, then part of a size
    ],
    ids=repr,
)
@pytest.mark.parametrize("twin", TWINS)
def test_any_other_read_goes_to_the_parser_whole(twin: str, data: bytes) -> None:
    """A read that is not whole chunks is the parser's, all of it (nothing taken here)."""
    fed: list[bytes] = []
    c = connection(twin)

    class Recording(Parser):
        def feed_data(self, data: bytes) -> None:
            fed.append(data)

    c._parser = Recording(c, [])
    c.at_boundary = True
    c.data_received(data)
    assert fed == [data] and c.events == [("after", [])]


@pytest.mark.parametrize(
    ("chunk_end", "data", "boundary"),
    [(True, b"x\r\n", True), (True, b"x\r", False), (False, b"x\r\n", False)],
)
@pytest.mark.parametrize("twin", TWINS)
def test_after_a_feed_the_parser_stands_between_chunks_when_its_last_event_ended_one(
    twin: str, chunk_end: bool, data: bytes, boundary: bool
) -> None:
    """Between chunks after a feed: the parser's last event ended a chunk (or a chunked
    head) and the read ended with its CRLF (a byte after it would be the next size's)."""
    c = connection(twin)

    class Ending(Parser):
        def feed_data(self, data: bytes) -> None:
            self.conn.on_chunk_header()
            if chunk_end:
                self.conn.on_chunk_complete()

    c._parser = Ending(c, [])
    c.data_received(data)
    assert c.at_boundary is boundary


def chunked(payloads: list[bytes], upper: bool, zeros: int) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sizes = [b"0" * zeros + (b"%X" if upper else b"%x") % len(p) for p in payloads]
    return (
        head
        + b"".join(size + b"\r\n" + p + b"\r\n" for size, p in zip(sizes, payloads, strict=True))
        + b"0\r\n\r\n"
    )


@settings(max_examples=examples(300), deadline=None)
@example([b"data: a\n\n", b"data: bc\n\n"], [80, 94, 109], False, 0, "compiled")
@example([b"data: a\n\n", b"data: bc\n\n"], [80, 94, 109], False, 0, "python")
@given(
    st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    st.lists(st.integers(0, 3000), max_size=12),
    st.booleans(),
    st.integers(0, 3),
    st.sampled_from(TWINS),
)
def test_a_chunked_body_cut_anywhere_is_the_body_httptools_reads(
    payloads: list[bytes], cuts: list[int], upper: bool, zeros: int, twin: str
) -> None:
    """A chunked response cut into reads anywhere, through httptools' own parser and the
    whole-chunk reads taken without it: the body is the payloads, in order, and the
    response ends; a read of whole chunks at a boundary never reaches the parser."""
    import httptools

    _need(compiled_sidecar, twin)
    wire = chunked(payloads, upper, zeros)
    points = sorted({0, len(wire), *(cut % (len(wire) + 1) for cut in cuts)})
    reads = [wire[a:b] for a, b in pairwise(points)]
    body: list[bytes] = []
    c = connection(twin, sink=lambda piece: body.append(piece) or True)

    class Protocol:  # httptools' callbacks, as H1Connection has them
        def on_headers_complete(self) -> None:
            c.chunk_end = True  # a chunked head

        def on_body(self, piece: bytes) -> None:
            c.chunks.append(piece)

        def on_chunk_header(self) -> None:
            c.on_chunk_header()

        def on_chunk_complete(self) -> None:
            c.on_chunk_complete()

        def on_message_complete(self) -> None:
            c.complete = True

    parser = httptools.HttpResponseParser(Protocol())
    fed: list[bytes] = []

    class Counting:
        def feed_data(self, data: bytes) -> None:
            fed.append(data)
            parser.feed_data(data)

    c._parser = Counting()
    for data in reads:
        before, count = c.at_boundary, len(fed)
        c.data_received(data)
        taken = before and h1core.whole_chunks(data) is not None
        assert len(fed) == count + (not taken)
    assert b"".join(body) == b"".join(payloads) and c.complete is True


@pytest.mark.parametrize("twin", TWINS)
def test_response_headers_are_kept_in_order_up_to_the_head_limit(twin: str) -> None:
    """Each header httptools reads is kept as (name, value), in order, and counted with its
    ": " and CRLF: a head of exactly `MAX_HEAD_BYTES` is kept whole; one byte more and the
    connection's `_refuse_head` stops the parse, the header past the limit not kept."""
    c = connection(twin)

    class Refused(Exception):
        pass

    def refuse() -> None:
        raise Refused

    c.headers, c._head_bytes, c.events = [], 0, []
    type(c)._refuse_head = lambda self: refuse()
    c.on_header(b"content-type", b"text/event-stream")
    c.on_header(b"x-a", b"")
    assert c.headers == [(b"content-type", b"text/event-stream"), (b"x-a", b"")]
    assert c._head_bytes == len(b"content-type: text/event-stream\r\n") + len(b"x-a: \r\n")
    rest = h1core.MAX_HEAD_BYTES - c._head_bytes - len(b"x-b: \r\n")
    c.on_header(b"x-b", b"v" * rest)  # exactly the limit
    assert c._head_bytes == h1core.MAX_HEAD_BYTES and len(c.headers) == 3
    with pytest.raises(Refused):
        c.on_header(b"x", b"")
    assert len(c.headers) == 3


@pytest.mark.parametrize("twin", TWINS)
def test_a_parse_error_goes_to_feed_failed_and_others_propagate(twin: str) -> None:
    """httptools' parse errors are the connection's to report; anything else is a bug and
    propagates."""
    import httptools

    c = connection(twin)
    error = httptools.HttpParserError("bad")
    c._parser = Parser(c, [], error)
    c.data_received(b"x")
    assert c.events == [("failed", error)]
    c._parser = Parser(c, [], KeyError("bug"))
    with pytest.raises(KeyError):
        c.data_received(b"x")
