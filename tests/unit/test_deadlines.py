"""The deadlines as pure functions (`middleware.deadlines`): which one expires when, and when
the timer must look next. No asyncio, no clock: the clocks are given."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from middleware.deadlines import Expiry, Timeouts, expired, next_deadline


@dataclass
class Clocks:
    started: float = 0.0
    first_token_at: float | None = None
    last_chunk: float = 0.0
    last_write: float = 0.0
    sending_since: float | None = None
    sse: bool = True


T = Timeouts(
    keepalive_interval=15, first_token_timeout=300, idle_timeout=120, max_duration=3600,
    send_timeout=60,
)  # fmt: skip


def test_nothing_is_due_at_the_start() -> None:
    """A request that just arrived has no deadline passed."""
    assert expired(T, Clocks(), 0.0) is None


def test_first_token_deadline_holds_until_the_first_token() -> None:
    """Before the first token the first-token timeout applies from arrival; chunks before it
    (role, empty deltas) do not move it, and the idle timeout does not apply yet."""
    c = Clocks(last_chunk=299.0, last_write=299.0)
    assert expired(T, c, 299.9) is None
    assert expired(T, c, 300.0) is Expiry.FIRST_TOKEN


def test_idle_deadline_runs_from_the_last_chunk_after_the_first_token() -> None:
    """After the first token the idle timeout runs from the last chunk, and the first-token
    timeout no longer applies."""
    c = Clocks(first_token_at=1.0, last_chunk=500.0, last_write=619.0)
    assert expired(T, c, 619.9) is None
    assert expired(T, c, 620.0) is Expiry.IDLE


def test_max_duration_wins_over_everything() -> None:
    """The whole-stream limit is checked first, whatever else is due."""
    c = Clocks(first_token_at=1.0, last_chunk=0.0, sending_since=0.0)
    assert expired(T, c, 3600.0) is Expiry.MAX_DURATION


def test_send_timeout_while_a_write_is_under_way() -> None:
    """A write the client has not taken for send_timeout is a slow client; while it waits no
    keep-alive is due (it would queue behind that write)."""
    c = Clocks(first_token_at=1.0, last_chunk=10.0, last_write=10.0, sending_since=10.0)
    assert expired(T, c, 69.9) is None  # a keep-alive would be due at 25 otherwise
    assert expired(T, c, 70.0) is Expiry.SEND


def test_keepalive_is_due_after_an_interval_with_nothing_written() -> None:
    """SSE only: nothing written for keepalive_interval makes a keep-alive due."""
    c = Clocks(first_token_at=1.0, last_chunk=10.0, last_write=10.0)
    assert expired(T, c, 24.9) is None
    assert expired(T, c, 25.0) is Expiry.KEEPALIVE
    assert expired(T, Clocks(first_token_at=1.0, last_write=10.0, sse=False), 25.0) is None


@pytest.mark.parametrize("name", ["keepalive_interval", "idle_timeout", "send_timeout"])
def test_none_turns_a_timeout_off(name: str) -> None:
    """`None` turns a timeout off: it never expires, and the timer's tick ignores it."""
    off = Timeouts(
        **{**{"keepalive_interval": 15, "idle_timeout": 120, "send_timeout": 60}, name: None}
    )
    c = Clocks(first_token_at=1.0, sending_since=None if name != "send_timeout" else 0.0)
    due = {
        "keepalive_interval": Expiry.KEEPALIVE,
        "idle_timeout": Expiry.IDLE,
        "send_timeout": Expiry.SEND,
    }
    assert expired(off, c, 1000.0) is not due[name]


def test_next_deadline_is_the_earliest_and_at_most_a_tick_away() -> None:
    """The timer looks again at the earliest deadline, and no later than one tick (the
    shortest interval) from now, so a deadline a chunk starts is never missed."""
    assert T.tick == 15
    c = Clocks(first_token_at=1.0, last_chunk=100.0, last_write=100.0)
    assert next_deadline(T, c, 100.0) == 115.0  # keep-alive and tick
    c = Clocks(first_token_at=None, started=0.0, last_write=299.0)
    assert next_deadline(T, c, 299.0) == 300.0  # the first-token deadline comes first
    c = Clocks(first_token_at=1.0, last_chunk=0.0, last_write=100.0, sending_since=50.0)
    assert next_deadline(T, c, 100.0) == 110.0  # the send deadline


def test_a_keepalive_already_due_is_next_due_an_interval_on() -> None:
    """When a keep-alive was due but not written (mid-line), the timer comes back an
    interval later instead of spinning at `now`."""
    t = Timeouts(keepalive_interval=15, idle_timeout=None, send_timeout=None)
    c = Clocks(first_token_at=1.0, last_write=0.0)
    assert next_deadline(t, c, 40.0) == 55.0


@pytest.mark.parametrize("value", [0, -1, float("nan")])
def test_a_timeout_must_be_positive(value: float) -> None:
    """Zero, negative or NaN seconds is refused with the setting's name."""
    with pytest.raises(ValueError, match="idle_timeout"):
        Timeouts(idle_timeout=value)
