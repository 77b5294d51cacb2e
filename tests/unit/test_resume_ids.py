"""Resume points (`middleware.resume.ids`): `after=<n>` and the `<n>` of `Last-Event-ID:
<stream-id>:<n>` are ASCII digits only; anything else is `InvalidEventId` (answered 400
`invalid_last_event_id`), never another exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middleware.resume.ids import InvalidEventId, parse_after, parse_event_id

STREAM = "AbCdEfGhIjKlMnOpQrStUv"  # 22 characters, as `new_stream_id` makes them
# Each is a digit to `str.isdigit()`; the last four are digits to `int()` as well:
# superscript 3 and 1, circled 1, Arabic-Indic 3, fullwidth 3, Persian 3, Devanagari 3.
UNICODE_DIGITS = ["\u00b3", "\u00b9", "\u2460", "\u0663", "\uff13", "\u06f3", "\u0969"]
NOT_A_POINT = [
    "",
    " ",
    "+3",
    "-3",
    "3 3",
    "1_000",
    "3.0",
    "0x3",
    "1" * 16,  # longer than any stream's event count
    "3\x00",
    "3\n",
]


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_unicode_digit_is_not_a_resume_point(digit: str) -> None:
    """Rule: a Unicode digit (superscript, Arabic-Indic, fullwidth, …), alone or among ASCII
    digits, is InvalidEventId in `after=` and in `Last-Event-ID`, never a ValueError of int()
    nor a point int() would read."""
    for value in (digit, "1" + digit, digit + "2"):
        with pytest.raises(InvalidEventId):
            parse_after(value)
        with pytest.raises(InvalidEventId):
            parse_event_id(f"{STREAM}:{value}")


@pytest.mark.parametrize("value", NOT_A_POINT)
def test_empty_signed_spaced_or_overlong_points_are_refused(value: str) -> None:
    """Rule: an empty, signed, spaced, underscored, non-decimal or longer-than-15-digit
    point is InvalidEventId in `after=` and in `Last-Event-ID`."""
    with pytest.raises(InvalidEventId):
        parse_after(value)
    with pytest.raises(InvalidEventId):
        parse_event_id(f"{STREAM}:{value}")


def test_ascii_points_parse_and_header_whitespace_is_allowed() -> None:
    """Rule: 1 to 15 ASCII digits are the point (leading zeros allowed); a `Last-Event-ID`
    may carry the header's optional whitespace (SP, HTAB) around it, an `after=` none."""
    assert parse_after("0") == 0
    assert parse_after("007") == 7
    assert parse_after("9" * 15) == 10**15 - 1
    assert parse_event_id(f"{STREAM}:12") == (STREAM, 12)
    assert parse_event_id(f" \t{STREAM}:12\t ") == (STREAM, 12)
    with pytest.raises(InvalidEventId):
        parse_after(" 3")
    with pytest.raises(InvalidEventId):
        parse_event_id(f"\u00a0{STREAM}:12")  # NBSP is not the header's whitespace


def test_a_stream_id_of_unicode_letters_or_digits_is_refused() -> None:
    """Rule: the stream id of a `Last-Event-ID` is URL-safe base64 in ASCII only."""
    for stream in ("\uff13" * 22, "\u00e9" * 22, "A" * 21 + "\u0663"):
        with pytest.raises(InvalidEventId):
            parse_event_id(f"{stream}:3")


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=24))
def test_any_text_is_a_point_or_invalid_event_id(value: str) -> None:
    """Rule: no input makes `parse_after` or `parse_event_id` raise anything but
    InvalidEventId, and whatever they accept is ASCII digits naming that very number."""
    for parse, text in ((parse_after, value), (parse_event_id, f"{STREAM}:{value}")):
        try:
            parsed = parse(text)
        except InvalidEventId:
            continue
        point = parsed if isinstance(parsed, int) else parsed[1]
        assert value.strip(" \t").isascii() and int(value.strip(" \t")) == point
