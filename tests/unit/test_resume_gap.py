"""An event larger than the resume bound (`--resume-max-bytes`): relayed unchanged, never held
whole, logged as `store.LOST`; a reader that comes to it ends with `resume_gap` (issue 56,
item 4). The stamper and the memory store, no I/O."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from middleware.resume.memory import MemoryStore
from middleware.resume.producer import Stamper  # the compiled one where built
from middleware.resume.store import LOST, Limits, ResumeGap

SID = "A" * 22
MOST = 120  # the stamper's bound in these tests


class ListLog:
    def __init__(self) -> None:
        self.events: list[bytes] = []

    def append(self, event: bytes) -> None:
        self.events.append(event)

    def retract(self, count: int) -> None:
        del self.events[len(self.events) - count :]


def held(stamper: Stamper) -> int:
    return sum(map(len, stamper.parts))


SAMPLE = (
    b"data: small\n\n"
    b"event: big\r\ndata: " + b"x" * 300 + b"\r\n: note\r\n\r\n"
    b"id: 7\ndata: " + b"y" * 200 + b"\n\n"
    b": a comment only, " + b"z" * 200 + b"\n\n"
    b"data: after\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=12))
def test_an_event_over_the_bound_is_relayed_as_ever_and_logged_lost(cuts: list[int]) -> None:
    """Rule: however the bytes come, the output is the unbounded stamper's (every event, its
    id included), the stamper never holds more than its bound, and the log has each event
    that fits and `LOST` in place of each that does not (comments are no event). (An `id`
    line cut in its first bytes is the one case chunking changes, as without a bound.)"""
    undecidable = (b"\ni", b"\nid")
    bounds = sorted({0, len(SAMPLE), *(c for c in cuts if not SAMPLE[:c].endswith(undecidable))})
    chunks = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    whole_log, log = ListLog(), ListLog()
    whole = Stamper(SID, whole_log)(SAMPLE)
    stamper = Stamper(SID, log, MOST)
    outs = []
    for chunk in chunks:
        outs.append(stamper(chunk))
        assert held(stamper) <= MOST
    assert b"".join(outs) == whole
    expected = [e if len(e) <= MOST else LOST for e in whole_log.events]
    assert [e.replace(b"\r\n", b"\n") for e in log.events] == [
        e.replace(b"\r\n", b"\n") for e in expected
    ]
    assert expected[1] == expected[2] == LOST and len(expected) == 4
    assert stamper.events == 4


def test_fast_path_events_over_the_bound_are_logged_lost() -> None:
    """Rule: whole events at an event boundary (the per-token fast paths) obey the bound too."""
    log = ListLog()
    stamper = Stamper(SID, log, MOST)
    big = b"data: " + b"x" * MOST + b"\n\n"
    stamper(big)
    stamper(b"data: a\n\n" + big + b"data: b\n\n")
    assert log.events[0] == LOST and log.events[2] == LOST
    assert log.events[1] == f"data: a\nid: {SID}:2\n\n".encode()
    assert log.events[3] == f"data: b\nid: {SID}:4\n\n".encode()


def test_undo_across_the_bound_gives_back_the_held_event() -> None:
    """Rule: a refused chunk (`undo`) that pushed an event past the bound, or ended one,
    leaves the stamper as it was: the chunk again, with more, logs what it would have."""
    log, whole_log = ListLog(), ListLog()
    stamper = Stamper(SID, log, MOST)
    stamper(b"data: " + b"x" * 60)  # held: under the bound
    stamper(b"x" * 100)  # past it: dropped
    stamper.undo()
    assert held(stamper) == 66
    stamper(b"x" * 10 + b"\n\ndata: c")
    stamper.undo()  # the event it ended is taken back and still held
    assert log.events == [] and held(stamper) == 66
    stamper(b"x" * 10 + b"\n\ndata: c\n\n")
    Stamper(SID, whole_log)(b"data: " + b"x" * 70 + b"\n\ndata: c\n\n")
    assert LOST not in whole_log.events and len(whole_log.events) == 2
    assert log.events == whole_log.events


async def test_a_reader_from_before_a_lost_event_ends_with_resume_gap() -> None:
    """Rule: a reader resuming from before a lost event gets the events up to it, then
    `ResumeGap` (410 `resume_gap`: a terminal event once its answer has started), never the
    events past the hole; a reader resuming from it or later reads on to the end."""
    store = MemoryStore(Limits(max_bytes=MOST, memory=10_000, ttl=60))
    log = store.open("s" * 22, "")
    assert log.max_bytes == MOST
    stamper = Stamper("s" * 22, log, log.max_bytes)
    stamper(b"data: a\n\ndata: " + b"x" * 500 + b"\n\ndata: c\n\n")
    log.end(b"", "completed")
    early = await store.attach("s" * 22, 0, "")
    assert await early.read(0) == ([f"data: a\nid: {'s' * 22}:1\n\n".encode()], False)
    with pytest.raises(ResumeGap) as gap:
        await early.read(0)
    assert gap.value.code == "resume_gap"
    late = await store.attach("s" * 22, 2, "")
    assert await late.read(0) == ([f"data: c\nid: {'s' * 22}:3\n\n".encode()], True)
    await store.aclose()
