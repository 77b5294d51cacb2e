"""The probe's analysis as pure functions over synthetic arrival timelines, and its query
bounds."""

from __future__ import annotations

import pytest

from middleware.probe import BadParameter, Shape
from sidecar.probe.analysis import (
    Event,
    Status,
    Timeline,
    bursts,
    check_bunching,
    check_compression,
    check_first_byte,
    check_headers,
    check_idle_cut,
    check_keepalives,
)
from sidecar.probe.client import EventReader, Target

HEADERS = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache, no-transform")]


def timeline(received: list[float], *, interval: float = 0.1, size: int = 300) -> Timeline:
    events = [Event(i, i * interval, at, size) for i, at in enumerate(received)]
    return Timeline(
        status=200,
        http_version="1.1",
        headers=list(HEADERS),
        headers_at=0.01,
        events=events,
        complete=True,
        announced={"events": len(received), "gap_s": 0},
    )


def test_events_one_by_one_are_not_bunching() -> None:
    """Rule: receive spacing that follows send spacing (with jitter) passes."""
    check = check_bunching(timeline([0.02 + i * 0.1 + (0.03 if i % 3 else 0) for i in range(20)]))
    assert check.status is Status.OK


def test_events_released_in_bursts_are_bunching_with_a_size_estimate() -> None:
    """Rule: events held and released together fail, and the buffer estimate is the bytes of
    the bursts a full buffer released (the end's own flush left out)."""
    received = [1.0] * 8 + [2.0] * 8 + [2.5] * 4  # 8 x 300 B per release, then the end
    check = check_bunching(timeline(received))
    assert check.status is Status.FAIL
    assert check.data["buffer_bytes_estimate"] == 8 * 300
    assert check.data["largest_burst_events"] == 8
    assert "proxy_buffering off" in (check.fix or "")


def test_one_late_event_is_jitter_not_bunching() -> None:
    """Rule: a single delayed event (two arrive together once) does not fail the check."""
    received = [i * 0.1 for i in range(20)]
    received[5] = received[6]
    assert check_bunching(timeline(received)).status is Status.OK


def test_bursts_group_collapsed_spacings() -> None:
    """Rule: a burst is a run whose receive spacing is under a quarter of its send spacing."""
    runs = bursts(timeline([0.0, 0.1, 0.5, 0.5, 0.5, 0.6]).events)
    assert [len(r) for r in runs] == [1, 1, 3, 1]


def test_zero_interval_cannot_show_bunching() -> None:
    """Rule: with no send spacing there is nothing to compare: skipped, not passed."""
    assert check_bunching(timeline([0.0] * 5, interval=0)).status is Status.SKIP


def test_added_content_encoding_is_compression() -> None:
    """Rule: any Content-Encoding on the probe (which the origin never sets) fails."""
    t = timeline([0.0])
    assert check_compression(t).status is Status.OK
    t.headers.append(("Content-Encoding", "gzip"))
    assert check_compression(t).status is Status.FAIL


def test_headers_that_show_a_buffering_hop_fail() -> None:
    """Rule: a Content-Length, a lost no-cache or another Content-Type fails the headers check."""
    assert check_headers(timeline([0.0])).status is Status.OK
    t = timeline([0.0])
    t.headers = [("Content-Type", "text/event-stream"), ("Content-Length", "900")]
    check = check_headers(t)
    assert check.status is Status.FAIL and "Content-Length" in check.detail


def test_a_held_first_event_fails_first_byte() -> None:
    """Rule: a first event later than FIRST_EVENT_HELD_S after the head was held."""
    assert check_first_byte(timeline([0.02, 0.12])).status is Status.OK
    assert check_first_byte(timeline([1.5, 1.5])).status is Status.FAIL


def gap_run(*, cut_at: float | None, keepalives: list[float], interval: float | None) -> Timeline:
    t = timeline([0.0, 0.1], interval=0.1)
    t.announced = {"events": 4, "gap_s": 5, "keepalive_interval": interval}
    t.silence_at = t.last_byte_at = 0.1
    t.comments = [(0.1, "silence 5 s")] + [(at, "keep-alive") for at in keepalives]
    if keepalives:
        t.last_byte_at = keepalives[-1]
    if cut_at is None:
        t.events += [Event(2, 5.2, 5.2, 300), Event(3, 5.3, 5.3, 300)]
        t.ended_at = 5.4
    else:
        t.complete, t.ended_at, t.error = False, cut_at, "incomplete chunked read"
    return t


def test_a_silence_cut_without_keepalives_but_carried_by_them_warns() -> None:
    """Rule: cut after ~3 s bare but surviving with keep-alives is a warning with the fix."""
    plain = gap_run(cut_at=3.1, keepalives=[], interval=1.0)
    kept = gap_run(cut_at=None, keepalives=[1.1, 2.1, 3.1, 4.1], interval=1.0)
    check = check_idle_cut(plain, kept)
    assert check.status is Status.WARN
    assert check.data["cut_after_s"] == pytest.approx(3.0)
    assert check_keepalives(kept).status is Status.OK


def test_a_silence_cut_with_keepalives_too_fails() -> None:
    """Rule: cut both ways is a failure."""
    plain = gap_run(cut_at=3.1, keepalives=[], interval=15.0)
    kept = gap_run(cut_at=3.1, keepalives=[], interval=15.0)
    assert check_idle_cut(plain, kept).status is Status.FAIL
    assert check_keepalives(kept).status is Status.SKIP  # 15 s interval: none due in 5 s


def test_keepalives_released_together_at_the_gaps_end_fail() -> None:
    """Rule: keep-alives that arrive all at once just before the next event were held."""
    kept = gap_run(cut_at=None, keepalives=[5.19, 5.19, 5.19, 5.19], interval=1.0)
    assert check_keepalives(kept).status is Status.FAIL


def test_missing_keepalives_on_a_surviving_stream_fail() -> None:
    """Rule: due keep-alives that never arrive mean a hop drops comment lines."""
    kept = gap_run(cut_at=None, keepalives=[], interval=1.0)
    assert check_keepalives(kept).status is Status.FAIL


def test_the_reader_times_each_event_by_the_read_that_completed_it() -> None:
    """Rule: an event split over two reads is received at the second; its size is its bytes."""
    t = Timeline()
    reader = EventReader(t)
    reader.feed(b'event: start\ndata: {"gap_s":1}\n\nid: 0\nevent: tick\ndata: {"i":0,', 1.0)
    reader.feed(b'"t":0.5}\n\n: silence 1 s', 2.0)
    assert t.silence_at == 2.0  # the open line counts
    reader.feed(b"\n: keep-alive\n", 3.0)
    assert t.events == [Event(0, 0.5, 2.0, len(b'id: 0\nevent: tick\ndata: {"i":0,"t":0.5}\n\n'))]
    assert t.comments == [(3.0, "silence 1 s"), (3.0, "keep-alive")]


@pytest.mark.parametrize(
    ("query", "param"),
    [("events=0", "events"), ("pad=x", "pad"), ("gap_s=-1", "gap_s"), ("nope=1", "nope")],
)
def test_shape_bounds(query: str, param: str) -> None:
    """Rule: each parameter is checked against its named bounds."""
    with pytest.raises(BadParameter) as caught:
        Shape.parse(query)
    assert caught.value.param == param


def test_the_client_adds_the_probe_path_after_a_prefix() -> None:
    """Rule: a base URL (also under an ingress prefix) gets the probe path; a probe URL is kept."""
    assert Target.from_url("http://h:1").url == "http://h:1/sidestream/v1/probe"
    assert Target.from_url("https://h/llm/").url == "https://h/llm/sidestream/v1/probe"
    assert Target.from_url("http://h/sidestream/v1/probe?x=1").url == "http://h/sidestream/v1/probe"


def test_the_probe_annotation_sets_sidestream_probe() -> None:
    """Rule: `sidestream.dev/probe: off` reaches the sidecar as SIDESTREAM_PROBE=off; any other
    word than on/off is refused."""
    from sidecar.injector.settings import InvalidAnnotation, parse_settings

    settings, warnings = parse_settings(
        {"sidestream.dev/upstream-port": "8000", "sidestream.dev/probe": "off"}
    )
    assert {"name": "SIDESTREAM_PROBE", "value": "off"} in settings.env() and warnings == []
    with pytest.raises(InvalidAnnotation):
        parse_settings({"sidestream.dev/upstream-port": "8000", "sidestream.dev/probe": "maybe"})
