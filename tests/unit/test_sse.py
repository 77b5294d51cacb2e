"""The incremental SSE scanner: WHATWG event-stream interpretation, fed in any chunks."""

from __future__ import annotations

import itertools
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from middleware.sse import Event, LineState, SSEScanner, advance

BOM = b"\xef\xbb\xbf"


def feed_all(chunks: list[bytes], max_line: int = 1 << 20) -> tuple[list[Event], SSEScanner]:
    scanner = SSEScanner(max_line)
    events: list[Event] = []
    for chunk in chunks:
        events.extend(scanner.feed(chunk))
    return events, scanner


def scan(stream: bytes) -> list[Event]:
    return feed_all([stream])[0]


def msg(
    data: str, event: str = "message", id: str | None = None, retry: int | None = None
) -> Event:
    return Event(event, data, id, retry)


# --- a reference parser, written char by char from the spec text, for the property tests ---


def reference(stream: bytes) -> list[Event]:
    """WHATWG "event stream interpretation", straightforwardly, with Event.id/retry per event."""
    text = stream.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[str] = []
    line = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\r":
            lines.append(line)
            line = ""
            if i + 1 < len(text) and text[i + 1] == "\n":
                i += 1
        elif c == "\n":
            lines.append(line)
            line = ""
        else:
            line += c
        i += 1
    # `line` is incomplete: the stream ended inside it, so it is never processed.
    events: list[Event] = []
    data_buffer, event_type, event_id, retry = "", "", None, None
    for line in lines:
        if line == "":
            if data_buffer != "":
                if data_buffer.endswith("\n"):
                    data_buffer = data_buffer[:-1]
                events.append(Event(event_type or "message", data_buffer, event_id, retry))
            data_buffer, event_type, event_id, retry = "", "", None, None
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            colon = line.index(":")
            field, value = line[:colon], line[colon + 1 :]
            if value.startswith(" "):
                value = value[1:]
        else:
            field, value = line, ""
        if field == "event":
            event_type = value
        elif field == "data":
            data_buffer += value + "\n"
        elif field == "id":
            if "\0" not in value:
                event_id = value
        elif field == "retry" and value != "" and all(ch in "0123456789" for ch in value):
            retry = int(value)
    return events


def automaton(stream: bytes, state: LineState = LineState.EVENT) -> LineState:
    """The LineState automaton run byte by byte over the whole stream."""
    for byte in stream:
        if byte == 10:
            state = {
                LineState.CR_LINE: LineState.LINE,
                LineState.CR_EVENT: LineState.EVENT,
                LineState.MID: LineState.LINE,
                LineState.LINE: LineState.EVENT,
                LineState.EVENT: LineState.EVENT,
            }[state]
        elif byte == 13:
            state = LineState.CR_LINE if state == LineState.MID else LineState.CR_EVENT
        else:
            state = LineState.MID
    return state


# --- unit cases ---


def test_typical_openai_chunk() -> None:
    """A whole `data: ...\\n\\n` event in one chunk dispatches one message event."""
    chunk = b'data: {"id":"chatcmpl-1","choices":[{"delta":{"content":"Hi"}}]}\n\n'
    assert scan(chunk) == [msg('{"id":"chatcmpl-1","choices":[{"delta":{"content":"Hi"}}]}')]


def test_each_line_terminator() -> None:
    """LF, CRLF and CR each end a line; mixed in one stream too."""
    for term in (b"\n", b"\r\n", b"\r"):
        assert scan(b"data: a" + term + b"data: b" + term + term) == [msg("a\nb")], term
    assert scan(b"data: a\r\ndata: b\rdata: c\n\r\n") == [msg("a\nb\nc")]


def test_cr_lf_split_across_chunks_is_one_terminator() -> None:
    """A CR ending one chunk and an LF starting the next are one CRLF, not two line ends."""
    events, _ = feed_all([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert events == [msg("a\nb")]
    events, _ = feed_all([b"data: a\r", b"\n", b"\r", b"\n", b"data: c\r\n\r\n"])
    assert events == [msg("a"), msg("c")]


def test_cr_then_cr_is_a_blank_line() -> None:
    """Two CRs are two line ends, split or not: the second one dispatches."""
    assert feed_all([b"data: a\r", b"\r"])[0] == [msg("a")]


def test_bom_whole_and_split() -> None:
    """One leading BOM is ignored, also when its bytes arrive in separate chunks."""
    assert scan(BOM + b"data: x\n\n") == [msg("x")]
    for cut in (1, 2, 3):
        stream = BOM + b"data: x\n\n"
        assert feed_all([stream[:cut], stream[cut:]])[0] == [msg("x")], cut
    assert feed_all([BOM[:1], BOM[1:2], BOM[2:], b"data: x\n\n"])[0] == [msg("x")]


def test_only_one_leading_bom_is_ignored() -> None:
    """A second BOM is part of the first line's field name, so that field is unknown."""
    assert scan(BOM + BOM + b"data: x\n\ndata: y\n\n") == [msg("y")]


def test_partial_bom_is_not_swallowed() -> None:
    """Bytes that start like a BOM but are not one are decoded (as U+FFFD) and kept."""
    assert scan(b"\xef\xbb\ndata: x\n\n") == [msg("x")]
    assert feed_all([b"\xef", b"data: x\n\n"])[0] == []  # "\ufffddata" is no field
    assert feed_all([b"\xef", b"\n", b"data: x\n\n"])[0] == [msg("x")]


def test_comments_are_ignored() -> None:
    """Lines starting with ':' are comments: no field, no dispatch by themselves."""
    assert scan(b": keep-alive\n\n: hi\ndata: x\n: mid\n\n") == [msg("x")]


def test_field_without_colon_has_empty_value() -> None:
    """A line without ':' is a field name with an empty value."""
    assert scan(b"data\n\n") == [msg("")]
    assert scan(b"data\ndata\n\n") == [msg("\n")]
    assert scan(b"event\ndata: x\n\n") == [msg("x")]


def test_spaces_after_colon() -> None:
    """Exactly one space after the colon is removed; no space and two spaces are kept as is."""
    assert scan(b"data:x\n\n") == [msg("x")]
    assert scan(b"data: x\n\n") == [msg("x")]
    assert scan(b"data:  x\n\n") == [msg(" x")]
    assert scan(b"data:x:y\n\n") == [msg("x:y")]


def test_multi_line_data() -> None:
    """Data lines are joined with LF, without a trailing LF."""
    assert scan(b"data: a\ndata:\ndata: b\n\n") == [msg("a\n\nb")]


def test_event_type_id_retry() -> None:
    """event, id and retry fields land on the event they belong to, and reset after it."""
    stream = b"event: ping\nid: 7\nretry: 1500\ndata: x\n\ndata: y\n\n"
    assert scan(stream) == [msg("x", "ping", "7", 1500), msg("y")]


def test_empty_event_type_is_message() -> None:
    """`event:` with an empty value dispatches as a 'message' event."""
    assert scan(b"event:\ndata: x\n\n") == [msg("x")]


def test_id_with_nul_is_ignored() -> None:
    """An id value containing NUL does not set the id."""
    assert scan(b"id: a\x00b\ndata: x\n\n") == [msg("x")]
    assert scan(b"id: 1\nid: a\x00b\ndata: x\n\n") == [msg("x", id="1")]


def test_id_is_per_event_not_persisted() -> None:
    """Event.id is only what the event itself set, and an empty id is kept as ''."""
    assert scan(b"id: 1\n\ndata: x\n\nid:\ndata: y\n\n") == [msg("x"), msg("y", id="")]


def test_retry_non_digit_is_ignored() -> None:
    """retry with anything but ASCII digits (or empty) is ignored."""
    for value in (b"12a", b"-5", b"1.5", b"", b" 5", "\u00b2".encode()):
        assert scan(b"retry: " + value + b"\ndata: x\n\n") == [msg("x")], value
    assert scan(b"retry:0042\ndata: x\n\n") == [msg("x", retry=42)]


def test_empty_data_line_dispatches_empty_data() -> None:
    """`data:` with no value still dispatches an event with data ''."""
    assert scan(b"data:\n\n") == [msg("")]
    assert scan(b"data: \n\n") == [msg("")]


def test_event_without_data_is_not_dispatched() -> None:
    """A blank line with an empty data buffer dispatches nothing and resets the event type."""
    assert scan(b"event: x\nid: 1\n\n") == []
    assert scan(b"event: x\n\ndata: y\n\n") == [msg("y")]


def test_unknown_fields_are_ignored() -> None:
    """Fields other than event/data/id/retry are ignored, also names that merely contain them."""
    assert scan(b"foo: 1\nDATA: 2\ndata : 3\n data: 4\ndata: ok\n\n") == [msg("ok")]


def test_incomplete_event_at_end_is_not_emitted() -> None:
    """An event without its blank line, or a line without its terminator, is never emitted."""
    assert scan(b"data: x\n") == []
    assert scan(b"data: x") == []
    assert feed_all([b"data: x\n", b"\n"])[0] == [msg("x")]


def test_invalid_utf8_is_replaced() -> None:
    """Invalid UTF-8 decodes with U+FFFD replacement, also split across chunks."""
    assert scan(b"data: a\xffb\xe2\x82\n\n") == [msg("a\ufffdb\ufffd")]
    assert feed_all([b"data: \xe2\x82", b"\xac\n\n"])[0] == [msg("\u20ac")]


def test_long_line_truncated_and_scanning_continues() -> None:
    """A line over max_line keeps its first max_line bytes, is counted, and the next line parses."""
    long = b"data: " + b"x" * 100
    for chunks in (
        [long + b"\n\ndata: ok\n\n"],
        [long[:30], long[30:70], long[70:] + b"\r", b"\n\r\ndata: ok\n\n"],
    ):
        events, scanner = feed_all(chunks, max_line=20)
        assert events == [msg("x" * 14), msg("ok")]
        assert scanner.truncated == 1


def test_long_line_memory_is_bounded() -> None:
    """A line that never ends does not grow memory past max_line."""
    scanner = SSEScanner(max_line=64 * 1024)
    chunk = b"y" * 4096
    scanner.feed(b"data: ")
    tracemalloc.start()
    try:
        for _ in range(1024):  # 4 MiB of one line
            scanner.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 512 * 1024
    assert scanner.truncated == 1
    assert scanner.feed(b"\n\ndata: next\n\n") == [msg("y" * (64 * 1024 - 6)), msg("next")]


def test_state_tracks_line_boundaries() -> None:
    """scanner.state says whether a line or an event boundary was just reached."""
    scanner = SSEScanner()
    assert scanner.state == LineState.EVENT
    for chunk, state in [
        (b"data: x", LineState.MID),
        (b"\n", LineState.LINE),
        (b"\r", LineState.CR_EVENT),
        (b"\n", LineState.EVENT),
        (b": c\r", LineState.CR_LINE),
        (b"\n", LineState.LINE),
        (b"", LineState.LINE),
        (b"\n\n", LineState.EVENT),
    ]:
        scanner.feed(chunk)
        assert scanner.state == state, chunk


def test_advance_short_and_long_chunks() -> None:
    """advance uses the previous state for short chunks and only the last 3 bytes otherwise."""
    assert advance(LineState.MID, b"") == LineState.MID
    assert advance(LineState.MID, b"\n") == LineState.LINE
    assert advance(LineState.LINE, b"\n") == LineState.EVENT
    assert advance(LineState.CR_LINE, b"\n") == LineState.LINE
    assert advance(LineState.CR_EVENT, b"\n") == LineState.EVENT
    assert advance(LineState.EVENT, b"\r\n") == LineState.EVENT
    assert advance(LineState.MID, b"\r\n") == LineState.LINE
    assert advance(LineState.EVENT, b"x\r\n") == LineState.LINE
    assert advance(LineState.MID, b"\r\n\r") == LineState.CR_EVENT


def test_advance_exhaustive_over_short_chunks() -> None:
    """advance equals the byte-by-byte automaton for every start state and every chunk of up
    to 5 bytes over {x, CR, LF} (this covers every way the last 3 bytes can look)."""
    for size in range(6):
        for combo in itertools.product(b"x\r\n", repeat=size):
            chunk = bytes(combo)
            for state in LineState:
                assert advance(state, chunk) == automaton(chunk, state), (state, chunk)


# --- property tests ---

TOKENS = [
    b"data",
    b"event",
    b"id",
    b"retry",
    b"foo",
    b":",
    b": ",
    b" ",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    BOM,
    b"x",
    b"42",
    b"\x00",
    "\u00e9".encode(),
    "\u20ac".encode(),
    "\U0001f600".encode(),
    b"\xff",
    b"\xe2\x82",
]
streams = st.lists(
    st.one_of(st.sampled_from(TOKENS), st.binary(min_size=1, max_size=3)), max_size=40
).map(b"".join)


@st.composite
def split(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None)
@given(st.data(), streams, st.integers(1, 24))
def test_any_split_gives_the_same_events(data: st.DataObject, stream: bytes, max_line: int) -> None:
    """Feeding the bytes in any chunks gives the same events, truncations and state as whole."""
    chunks = data.draw(split(stream))
    whole, whole_scanner = feed_all([stream], max_line)
    parts, parts_scanner = feed_all(chunks, max_line)
    assert parts == whole
    assert parts_scanner.truncated == whole_scanner.truncated
    assert parts_scanner.state == whole_scanner.state


@settings(max_examples=300, deadline=None)
@given(st.data(), streams)
def test_events_match_reference_parser(data: st.DataObject, stream: bytes) -> None:
    """The scanner yields exactly what the char-by-char reference WHATWG parser yields."""
    chunks = data.draw(split(stream))
    assert feed_all(chunks)[0] == reference(stream)


@settings(max_examples=300, deadline=None)
@given(st.data(), streams)
def test_advance_matches_automaton(data: st.DataObject, stream: bytes) -> None:
    """advance folded over the chunks == scanner.state == the automaton run byte by byte."""
    chunks = data.draw(split(stream))
    state = LineState.EVENT
    for chunk in chunks:
        state = advance(state, chunk)
    assert state == feed_all(chunks)[1].state == automaton(stream)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(st.binary(max_size=12), max_size=4),
    chunk=st.lists(
        st.binary(max_size=10).map(lambda b: b"data: " + b.replace(b"\n", b"").replace(b"\r", b""))
        | st.sampled_from([b"data: x", b"data: [DONE]", b": c", b"event: e", b"data:x"]),
        min_size=1,
        max_size=3,
    ).map(lambda lines: b"\n\n".join(lines) + b"\n\n")
    | st.binary(max_size=16),
)
def test_whole_events_are_what_feed_would_return(before: list[bytes], chunk: bytes) -> None:
    """`whole_events` takes a chunk only when the scan would give the same events and leave
    the same state, and then gives exactly those; otherwise it feeds nothing (None)."""
    fast, slow = SSEScanner(), SSEScanner()
    for piece in before:
        fast.feed(piece)
        slow.feed(piece)
    events = fast.whole_events(chunk)
    expected = slow.feed(chunk)
    if events is None:
        assert fast.feed(chunk) == expected
    else:
        assert events == expected
    tail = b"data: after\n\n"
    assert fast.feed(tail) == slow.feed(tail) and fast.state == slow.state
