"""The event stamper (`middleware.resume.stamper`): ids on events only, upstream ids replaced
in place, nothing held back, the same bytes whatever the chunking, and `undo`; compiled by
Cython where built, the same as interpreted."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middleware.resume import stamper as stamper_module
from middleware.resume.producer import Stamper  # the compiled one where built
from middleware.sse import LineState, advance
from middleware.usage_hide import HideUsage
from tests.support.compiled import built
from tests.support.fuzzing import examples

SID = "A" * 22


class ListLog:
    def __init__(self) -> None:
        self.events: list[bytes] = []

    def append(self, event: bytes) -> None:
        self.events.append(event)

    def retract(self, count: int) -> None:
        del self.events[len(self.events) - count :]


def stamp(chunks: list[bytes]) -> tuple[bytes, list[bytes], int]:
    log = ListLog()
    stamper = Stamper(SID, log)
    out = b"".join(stamper(c) for c in chunks)
    return out, log.events, stamper.events


def test_each_event_gets_its_index_and_comments_are_not_events() -> None:
    """Every event gets `id: <sid>:<n>` (1-based); comment-only blocks and lines do not count."""
    out, events, n = stamp([b": hi\n\ndata: a\n\n", b"event: x\ndata: b\n: c\n\n"])
    assert out == (
        b": hi\n\ndata: a\nid: " + SID.encode() + b":1\n\n"
        b"event: x\ndata: b\n: c\nid: " + SID.encode() + b":2\n\n"
    )
    assert n == 2 and events == [
        b"data: a\nid: AAAAAAAAAAAAAAAAAAAAAA:1\n\n",
        b"event: x\ndata: b\n: c\nid: AAAAAAAAAAAAAAAAAAAAAA:2\n\n",
    ]


def test_upstream_ids_are_replaced_in_place() -> None:
    """An upstream `id:` line is replaced by ours on the same line; the rest is byte for byte."""
    out, events, n = stamp([b"id: 7\ndata: a\n\n", b"data: b\r\nid\r\n\r\n"])
    sid = SID.encode()
    assert out == b"id: " + sid + b":1\ndata: a\n\ndata: b\r\nid: " + sid + b":2\r\n\r\n"
    assert n == 2 and len(events) == 2


SAMPLE = (
    b': open\n\ndata: {"a":1}\n\nevent: e\r\ndata: x\r\ndata: y\r\n\r\n'
    b"id: 9\ndata: z\n\n: keep\ndata: w\rid\r\r"
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=12))
def test_any_split_gives_the_same_bytes_and_events(cuts: list[int]) -> None:
    """Chunking never changes the output (beyond an `id` line cut in its first two bytes,
    where our id line at the event's end wins), nothing is held back, and each chunk's output ends at the same kind
    of line boundary as its input."""
    whole, whole_events, whole_n = stamp([SAMPLE])
    undecidable = (b"\ni", b"\nid", b"\ri", b"\rid")  # an id line cut in its first bytes
    bounds = sorted({0, len(SAMPLE), *(c for c in cuts if not SAMPLE[:c].endswith(undecidable))})
    chunks = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    log = ListLog()
    stamper = Stamper(SID, log)
    in_state = out_state = LineState.EVENT
    outs = []
    for chunk in chunks:
        out = stamper(chunk)
        in_state, out_state = advance(in_state, chunk), advance(out_state, out)
        if chunk:
            assert (in_state <= LineState.LINE) == (out_state <= LineState.LINE)
            assert (in_state is LineState.EVENT) == (out_state is LineState.EVENT)
        outs.append(out)
    assert b"".join(outs) == whole
    assert [same_ends(e) for e in log.events] == [same_ends(e) for e in whole_events]
    assert stamper.events == whole_n == 5


def same_ends(event: bytes) -> bytes:
    """CRLF split after a blank line ends the stored event at its CR: the same to a reader."""
    return event.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def test_undo_forgets_the_last_call() -> None:
    """A chunk the server refused comes again (maybe with more): undo takes back its events."""
    log = ListLog()
    stamper = Stamper(SID, log)
    first = stamper(b"data: a\n\ndata: b")
    stamper.undo()
    assert log.events == [] and stamper.events == 0
    again = stamper(b"data: a\n\ndata: b\n\n")
    assert again.startswith(first) and stamper.events == 2 and len(log.events) == 2
    one = stamper(b"data: c\n\n")  # the one-event fast path
    stamper.undo()
    assert stamper.events == 2 and len(log.events) == 2
    assert stamper(b"data: c\n\n") == one and stamper.events == 3


def test_an_edit_before_the_stamp_hides_its_event_from_the_ids_and_undoes_with_it() -> None:
    """Forced usage's hiding runs before the stamp (`Stamper.after`): the hidden usage-only
    chunk takes no id and no place in the log, and `undo` forgets the last call in both."""
    log = ListLog()
    stamper = Stamper(SID, log)
    stamper.after(HideUsage())
    first = stamper(b'data: {"id":"x","choices":[{"delta":{"content":"a"}}],"usage":null}\n\n')
    assert (
        first
        == f'data: {{"id":"x","choices":[{{"delta":{{"content":"a"}}}}]}}\nid: {SID}:1\n\n'.encode()
    )
    usage = b'data: {"id":"x","choices":[],"usage":{"total_tokens":3}}\n\n'
    assert stamper(usage) == b"" and stamper.events == 1 and len(log.events) == 1
    done = stamper(b"data: [DONE]\n\n")
    stamper.undo()
    assert stamper.events == 1 and log.events == [first]
    assert stamper(b"data: [DONE]\n\n") == done == f"data: [DONE]\nid: {SID}:2\n\n".encode()
    assert log.events == [first, done]


# What an upstream may send, in pieces: events, upstream ids (whole and cut), comments, every
# line end, blank lines, usage-free data of any length.
PIECES = st.sampled_from(
    [b"data: x", b"data: ", b"id: 7", b"id", b"i", b": c", b"event: e", b"\n", b"\r", b"\r\n",
     b"\n\n", b'data: {"choices":[{"delta":{"content":"t"}}]}\n\n', b"x" * 40]
)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(PIECES, max_size=40),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    st.sets(st.integers(min_value=0, max_value=12), max_size=4),
    st.integers(min_value=1, max_value=120),
)
def test_the_compiled_stamper_stamps_any_bytes_as_the_python_one(
    pieces: list[bytes], cuts: list[int], undone: set[int], max_event: int
) -> None:
    """Twins: the stamper compiled by Cython (the same source, `setup.py`) gives the same
    bytes, logged events and count as the interpreted one for any input, any split, any
    chunk undone (and sent again), and any bound on an event's size."""
    compiled = built("middleware.resume._stamper")
    if compiled is None:
        pytest.fail("the compiled stamper is not built: `make install` builds it (needs gcc)")
    data = b"".join(pieces)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    runs = []
    for twin in (stamper_module.Stamper, compiled.Stamper):
        log = ListLog()
        stamper = twin(SID, log, max_event)
        outs = []
        for number, chunk in enumerate(chunks):
            if number in undone:
                stamper(chunk)
                stamper.undo()
            outs.append(stamper(chunk))
        runs.append((outs, log.events, stamper.events))
    assert runs[0] == runs[1]
