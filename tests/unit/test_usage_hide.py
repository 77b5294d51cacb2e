"""What a client that did not ask for usage is shown (`middleware.usage_hide.HideUsage`): the
bytes the server would have sent had usage not been forced, for every SSE framing and any
split across reads; exactly the members forcing caused are taken out, and a chunk whose usage
cannot be taken out exactly goes as it came, counted. Each test runs with the compiled
`hide` and without it (`core`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from middleware import usage_hide
from middleware.usage_examine import examine, walked
from middleware.usage_hide import HOLD_LIMIT, LEFT_UNCHANGED, HideUsage
from tests.support.compiled import built
from tests.support.fuzzing import examples
from tests.support.usage_streams import CRLF, QUIRKS, Framing, Script, scripts

compiled = built("middleware._usage")


@pytest.fixture(params=["compiled", "python"])
def core(request: pytest.FixtureRequest) -> Iterator[str]:
    """The compiled `hide` where it answers, or usage_hide.py alone."""
    saved = usage_hide._compiled
    usage_hide._compiled = compiled if request.param == "compiled" else None
    try:
        yield request.param
    finally:
        usage_hide._compiled = saved


def relayed(hide: HideUsage, reads: list[bytes]) -> bytes:
    """What the client reads, each read edited in turn; never more held than the bound."""
    out = []
    for body in reads:
        out.append(hide(body))
        assert hide.held <= HOLD_LIMIT
    return b"".join(out)


def check(script: Script) -> None:
    """The client reads, forced and continuous, what the server sends a request that did
    not ask; nothing is counted as left unchanged."""
    before = LEFT_UNCHANGED.value
    expected = script.stream(False, False)
    assert relayed(HideUsage(), script.reads(True, False)) == expected
    assert relayed(HideUsage(continuous=True), script.reads(True, True)) == expected
    assert LEFT_UNCHANGED.value == before


@pytest.mark.parametrize("name", list(QUIRKS))
def test_every_quirk_is_hidden_exactly(core: str, name: str) -> None:
    """Each framing quirk of issue 47 (usage null anywhere, in any spacing; no space after
    `data:`; CRLF and lone CR; `id:`, `event:`, `retry:` and comments in the usage event; a
    `[DONE]` framed apart; a usage chunk without choices; a nested null the server always
    writes; a BOM; one byte a read) reaches the client as the unforced stream."""
    check(QUIRKS[name])


@settings(max_examples=examples(600), deadline=None)
@given(scripts())
@example(Script(chunks=CRLF, usage_event=CRLF, cuts=(1, 2, 3)))
def test_any_framing_split_anywhere_is_hidden_exactly(script: Script) -> None:
    """Property: any framing, usage null present or absent, a usage chunk with or without
    choices, cut into reads anywhere: forced and continuous give the unforced bytes."""
    for use in (compiled, None):
        saved, usage_hide._compiled = usage_hide._compiled, use
        try:
            check(script)
        finally:
            usage_hide._compiled = saved


TOKEN = b'data: {"id":"c","choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'


@pytest.mark.parametrize(
    ("chunk", "kept"),
    [
        (b'data: {"a":1, "usage": null}\n\n', b'data: {"a":1}\n\n'),
        (b'data: {"a":1 ,"usage":null }\n\n', b'data: {"a":1 }\n\n'),
        (b'data: {"usage" : null , "b":2}\n\n', b'data: {"b":2}\n\n'),
        (b'data: {"a":1,"usage":null,"b":2}\n\n', b'data: {"a":1,"b":2}\n\n'),
        (b'data: {"usage":null}\n\n', b"data: {}\n\n"),
        (b'data:{"a":1,"usage":null}\r\n\r\n', b'data:{"a":1}\r\n\r\n'),
        (b'data: {"a":{"usage":null},"usage":null}\n\n', b'data: {"a":{"usage":null}}\n\n'),
    ],
)
def test_the_null_member_goes_with_one_comma_and_nothing_else(
    core: str, chunk: bytes, kept: bytes
) -> None:
    """A top-level `usage: null` goes with the comma that joins it to the next member (to the
    one before, when last) and the blanks on that side; a nested one stays."""
    assert HideUsage()(chunk) == kept


@pytest.mark.parametrize(
    "chunk",
    [
        b'data: {"choices":[{"delta":{}}],"usage":{"total_tokens":5}}\n\n',  # beside choices
        b'data: {"choices":[],"usage":null,"usage":null}\n\n',  # a member twice
        b'data: {"choices":[],\ndata: "usage":null}\n\n',  # over two data lines
        b'data: {"usage":null,,}\n\n',  # not JSON
        b'data: {"choices":[],"usage":{"t":1}}\ndata: [DONE]\n\n',  # the chunk and more
    ],
)
def test_usage_it_cannot_take_out_exactly_is_relayed_unchanged_and_counted(
    core: str, chunk: bytes
) -> None:
    """A chunk whose usage is not exactly what forcing adds is relayed as it came, and
    counted in `LEFT_UNCHANGED` (the `sidestream.usage.unchanged_chunks` metric)."""
    before = LEFT_UNCHANGED.value
    assert HideUsage()(chunk) == chunk
    assert LEFT_UNCHANGED.value == before + 1


@pytest.mark.parametrize(
    "chunk",
    [
        b'data: {"choices":[{"delta":{"content":"\\"usage\\":null"}}]}\n\n',
        b': "usage":null\n\n',
        b'event: x\ndata: ["usage", null]\n\n',
        b'data: {"\\u0075sage":null}\n\n',  # spelt with an escape: not looked for
        b"data: [DONE]\n\n",
    ],
)
def test_what_forcing_did_not_cause_is_left_alone_uncounted(core: str, chunk: bytes) -> None:
    """Usage in a token's text, a comment, an array, or spelt with escapes is not a member
    forcing caused: relayed as it is, not counted."""
    before = LEFT_UNCHANGED.value
    assert HideUsage()(chunk) == chunk
    assert LEFT_UNCHANGED.value == before


def test_a_block_past_the_hold_limit_is_relayed_as_it_comes(core: str) -> None:
    """A block still undecided past `HOLD_LIMIT` bytes (here a data line that never ends)
    is let go, counted once, and the rest of it follows as it comes: held bytes are bounded."""
    hide, before = HideUsage(), LEFT_UNCHANGED.value
    start = b'data: {"pad":"' + b"x" * (HOLD_LIMIT // 2)
    assert hide(start) == b""
    more = b"y" * HOLD_LIMIT
    assert hide(more) == start + more
    assert hide(b'","usage":null}\n\n') == b'","usage":null}\n\n'
    assert hide.held == 0 and LEFT_UNCHANGED.value == before + 1
    assert hide(TOKEN) == TOKEN.replace(b',"usage":null', b"")  # the next block as usual


def test_a_data_line_that_is_no_object_goes_out_before_its_end(core: str) -> None:
    """`[DONE]` (or any data not starting `{`) cannot be the usage chunk: its bytes go out
    as they come, not held for its line end."""
    hide = HideUsage()
    assert hide(b"data: [DO") == b"data: [DO"
    assert hide(b"NE]\n\n") == b"NE]\n\n"


def test_undo_forgets_the_last_call(core: str) -> None:
    """`undo` (the server refused the bytes; the same read comes again) restores what was
    held and what was counted: the stream reads as if the call had not been made."""
    stream = QUIRKS["crlf"].stream(True, False)
    expected = QUIRKS["crlf"].stream(False, False)
    hide, out = HideUsage(), []
    before = LEFT_UNCHANGED.value
    for at in range(0, len(stream), 5):
        body = stream[at : at + 5]
        hide(body)
        hide.undo()
        out.append(hide(body))
    assert b"".join(out) == expected
    assert LEFT_UNCHANGED.value == before
    counted = HideUsage()
    counted(b'data: {"choices":[{}],"usage":{}}\r\n\r\n')
    counted.undo()
    assert LEFT_UNCHANGED.value == before


def test_an_id_before_the_usage_chunk_goes_with_it(core: str) -> None:
    """The usage chunk's block goes whole, its `id:` line too: the client's last event id is
    the one it would have had (the server would not have sent that block)."""
    script = Script(chunks=Framing(before=(b"id: 1",)), usage_event=Framing(before=(b"id: 2",)))
    out = relayed(HideUsage(), script.reads(True, False))
    assert out == script.stream(False, False) and b"id: 2" not in out


_KEYS = ['"usage"', '"choices"', '"id"', '"\\u0075sage"', '"cho\\u0069ces"', '"a"']
_VALUES = ["null", "{}", '{"t":1}', '{"t": {"u":1}}', "[]", '[{"d":1}]', '"x}"', '{"usage":null}']


@st.composite
def objects(draw: st.DrawFn) -> bytes:
    """A JSON object's bytes: chosen keys (duplicates, escaped spellings) and values, random
    spacing; sometimes cut, or with junk after it."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), max_size=5))
    if draw(st.booleans()):  # the usual chunk's place for it, mostly
        pairs.append(('"usage"', draw(st.sampled_from(["null", '{"t":1}', '{"a": 2 ,"b":3}']))))
    blank = st.sampled_from(["", " ", "  ", "\t"])
    text = draw(blank) + "{" + draw(blank)
    for n, (key, value) in enumerate(pairs):
        text += ("," + draw(blank) if n else "") + key + draw(blank) + ":" + draw(blank) + value
        text += draw(blank)
    text += "}" + draw(st.sampled_from(["", " ", " x", "}"]))
    data = text.encode()
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


@settings(max_examples=examples(2000), deadline=None)
@given(objects(), st.booleans())
@example(b'{"a":1,"usage":null}', False)
@example(b'{"\\u0075sage":null,"a":1,"usage":null}', False)
@example(b'{"choices":[],"choices":[{}],"usage":{"t":1}}', True)
def test_the_usual_chunks_one_parse_answers_as_the_walk(data: bytes, continuous: bool) -> None:
    """`examine` answers the usual chunk (`usage` its last member) with one parse of the
    whole instead of walking its members: the same answer as the walk, for objects built to
    hit its edges (usage null or an object, last or not, spacing, duplicate and escaped
    keys, nesting, cut or trailed by junk)."""
    if data.find(b'"usage"') >= 0:
        assert examine(data, continuous) == walked(data, data.decode("latin-1"), continuous)


def test_a_usage_chunk_over_several_data_lines_goes_whole(core: str) -> None:
    """A usage chunk whose JSON runs over two `data:` lines (the client joins them with a
    newline, JSON's whitespace) is still the usage chunk: its block goes whole, decided at
    its end; the block before it, one data line of a different kind, goes as it came."""
    before = b'data: {"choices":[{"delta":{}}]}\ndata:\n\n'
    usage = b'data: {"id":"c","choices":[],\ndata: "usage":{"t":1}}\n\n'
    hide = HideUsage()
    assert hide(before + usage[:20]) == before
    assert hide(usage[20:] + b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
