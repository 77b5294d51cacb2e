"""What a probe's arrival timeline says about the path: pure functions, no I/O.

`client` records a `Timeline` per probe stream (when the headers came, each event's send
and receive time and size, each comment, how the stream ended); `checks` turns the main run
(no keep-alives) and the keep-alive run into one `Check` per question, each failed one with
the usual fix for the common hops.

Times are seconds since the request was sent (receive times) or since the stream began at
the origin (send times); only differences within one clock are ever compared.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from enum import Enum


class Status(Enum):
    OK = "ok"
    WARN = "warn"  # worth knowing; the path still carries streams
    FAIL = "fail"
    SKIP = "skip"  # this run cannot tell


@dataclass(frozen=True, slots=True)
class Event:
    index: int
    sent: float  # origin clock
    received: float  # client clock: the read that completed the event
    size: int  # bytes of the event as the origin wrote it


@dataclass
class Timeline:
    """One probe stream as the client saw it."""

    status: int = 0
    http_version: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    headers_at: float | None = None  # time to first byte (the response head)
    events: list[Event] = field(default_factory=list)
    comments: list[tuple[float, str]] = field(default_factory=list)
    announced: dict[str, object] = field(default_factory=dict)  # the `start` event
    silence_at: float | None = None  # the gap's opening comment arrived
    last_byte_at: float | None = None
    ended_at: float | None = None
    complete: bool = False  # the `end` event arrived
    error: str | None = None  # how the stream broke, when it did
    undecodable: str | None = None  # a content-encoding the client cannot decode

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None
    data: dict[str, object] = field(default_factory=dict)


HEADERS_HELD_S = 1.0  # a response head later than this was held
FIRST_EVENT_HELD_S = 1.0  # a first event this long after the head was held
COLLAPSE = 0.25  # receive spacing under this share of the send spacing: collapsed
MIN_SPACING_S = 0.02  # send spacings under this cannot show collapse
BURST_EVENTS = 4  # a burst this large fails the check (jitter bunches two, maybe three)
COLLAPSED_SHARE = 0.3  # or this share of spacings collapsed

BUFFERING_FIX = (
    "turn buffering off for the stream: nginx `proxy_buffering off;` and do not "
    "`proxy_ignore_headers X-Accel-Buffering` (sidestream sends `X-Accel-Buffering: no`); "
    'ingress-nginx annotation `nginx.ingress.kubernetes.io/proxy-buffering: "off"`; '
    "a CDN: disable caching and compression for the path"
)
GZIP_FIX = (
    "do not compress text/event-stream: nginx `gzip off;` in the location, or drop "
    'text/event-stream from `gzip_types`; ingress-nginx ConfigMap `use-gzip: "false"` '
    "(or remove it from `gzip-types`); a CDN: turn compression off for the path"
)
TIMEOUT_FIX = (
    "raise the hop's idle timeout above the longest silence, or keep sidestream's "
    "--keepalive-interval below it: nginx `proxy_read_timeout`, ingress-nginx annotation "
    "`nginx.ingress.kubernetes.io/proxy-read-timeout`, AWS ALB `idle_timeout.timeout_seconds`"
)


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def check_first_byte(t: Timeline) -> Check:
    if t.headers_at is None:
        return Check("first byte", Status.FAIL, f"no response head: {t.error}")
    ticks = [e for e in t.events if e.index == 0]
    first = ticks[0].received if ticks else None
    data: dict[str, object] = {"ttfb_s": t.headers_at, "first_event_s": first}
    if first is None:
        return Check(
            "first byte", Status.FAIL, f"head after {ms(t.headers_at)}, no event", data=data
        )
    detail = f"head after {ms(t.headers_at)}, first event after {ms(first)}"
    if t.headers_at > HEADERS_HELD_S:
        return Check("first byte", Status.FAIL, detail + ": the head was held", BUFFERING_FIX, data)
    if first - t.headers_at > FIRST_EVENT_HELD_S:
        detail += f": held {first - t.headers_at:.1f} s behind the head"
        return Check("first byte", Status.FAIL, detail, BUFFERING_FIX, data)
    return Check("first byte", Status.OK, detail, data=data)


def check_headers(t: Timeline) -> Check:
    shown = {
        name: t.header(name.lower())
        for name in ("Content-Type", "Content-Encoding", "Cache-Control", "Transfer-Encoding")
    }
    shown["Content-Length"] = t.header("content-length")
    shown["Via"] = t.header("via")
    shown["Server"] = t.header("server")
    parts = [f"HTTP/{t.http_version}"] + [f"{k}: {v}" for k, v in shown.items() if v]
    data: dict[str, object] = {"http_version": t.http_version, **shown}
    problems = []
    kind = (shown["Content-Type"] or "").split(";")[0].strip().lower()
    if kind != "text/event-stream":
        problems.append(f"Content-Type is {shown['Content-Type']!r}, not text/event-stream")
    cache = (shown["Cache-Control"] or "").lower()
    if "no-cache" not in cache and "no-store" not in cache:
        problems.append("Cache-Control no-cache was removed: a cache may hold the stream")
    if shown["Content-Length"]:
        problems.append("Content-Length set: a hop read the whole stream before sending it")
    if problems:
        return Check("headers", Status.FAIL, "; ".join(problems), BUFFERING_FIX, data)
    return Check("headers", Status.OK, ", ".join(parts), data=data)


def bursts(events: list[Event]) -> list[list[Event]]:
    """Runs of consecutive events whose receive spacing collapsed against their send spacing
    (each arrived within COLLAPSE of its send spacing after the one before): what a hop
    released together. Single events are runs of one."""
    runs: list[list[Event]] = []
    for event in events:
        if runs:
            before = runs[-1][-1]
            sent, got = event.sent - before.sent, event.received - before.received
            if sent >= MIN_SPACING_S and got < COLLAPSE * sent:
                runs[-1].append(event)
                continue
        runs.append([event])
    return runs


def check_bunching(t: Timeline) -> Check:
    ticks = sorted(t.events, key=lambda e: e.index)
    pairs = [(a, b) for a, b in itertools.pairwise(ticks) if b.sent - a.sent >= MIN_SPACING_S]
    if len(pairs) < 2:
        return Check(
            "bunching",
            Status.SKIP,
            "too few spaced events arrived to compare (interval_ms 0, or a cut)",
        )
    runs = bursts(ticks)
    held = [run for run in runs if len(run) > 1]
    collapsed = sum(len(run) - 1 for run in held)
    sent_gap = statistics.median(b.sent - a.sent for a, b in pairs)
    got_gap = statistics.median(b.received - a.received for a, b in pairs)
    floor = min(e.received - e.sent for e in ticks)
    hold = max(e.received - e.sent - floor for e in ticks)
    sizes = [sum(e.size for e in run) for run in held]
    # The last burst of a complete stream is released by its end, not by a full buffer.
    filled = sizes[:-1] if len(sizes) > 1 and held[-1] is runs[-1] and t.complete else sizes
    data: dict[str, object] = {
        "events": len(ticks),
        "bursts": len(held),
        "largest_burst_events": max((len(r) for r in held), default=1),
        "collapsed_spacings": collapsed,
        "spacings": len(pairs),
        "sent_spacing_s": sent_gap,
        "received_spacing_s": got_gap,
        "max_hold_s": hold,
        "buffer_bytes_estimate": int(statistics.median(filled)) if filled else 0,
        "largest_burst_bytes": max(sizes, default=0),
    }
    spacing = f"median spacing received {ms(got_gap)} for {ms(sent_gap)} sent"
    largest = max((len(r) for r in held), default=1)
    if largest >= BURST_EVENTS or collapsed >= COLLAPSED_SHARE * len(pairs):
        detail = (
            f"{len(ticks)} events arrived in {len(runs)} releases; {len(held)} bursts "
            f"of ~{data['buffer_bytes_estimate']} bytes (largest {data['largest_burst_bytes']} "
            f"bytes, {largest} events), held up to {hold:.2f} s; {spacing}"
        )
        return Check("bunching", Status.FAIL, detail, BUFFERING_FIX, data)
    return Check(
        "bunching", Status.OK, f"{len(ticks)} events arrived one by one; {spacing}", data=data
    )


def check_compression(t: Timeline) -> Check:
    encoding = (t.header("content-encoding") or "").strip().lower()
    data: dict[str, object] = {"content_encoding": encoding or None}
    if encoding and encoding != "identity":
        detail = f"Content-Encoding: {encoding} added on the way (the origin sends none)"
        if t.undecodable:
            detail += "; the probe cannot decode it, so later checks are incomplete"
        return Check("compression", Status.FAIL, detail, GZIP_FIX, data)
    return Check("compression", Status.OK, "none added", data=data)


def _keepalives(t: Timeline) -> list[float]:
    """Arrival times of keep-alive comments (not the probe's own silence marker)."""
    return [at for at, text in t.comments if not text.startswith("silence")]


def check_keepalives(t: Timeline | None) -> Check:
    if t is None:
        return Check("keep-alives", Status.SKIP, "no gap: run with --gap-s to test them")
    interval = t.announced.get("keepalive_interval")
    gap = _float(t.announced.get("gap_s"))
    seen = _keepalives(t)
    data: dict[str, object] = {"received": len(seen), "origin_interval_s": interval, "gap_s": gap}
    if interval is None:
        return Check(
            "keep-alives",
            Status.WARN,
            "the origin sends none (--keepalive-interval off): every silence is bare",
            TIMEOUT_FIX,
            data,
        )
    if not isinstance(interval, int | float) or interval >= gap:
        detail = (
            f"none due: the origin writes one after {interval} s of silence, longer than the "
            f"{gap:g} s gap (probe with a longer --gap-s to see them)"
        )
        return Check("keep-alives", Status.SKIP, detail, data=data)
    if seen:
        gap_after = (_int(t.announced.get("events")) - 1) // 2
        released = min((e.received for e in t.events if e.index > gap_after), default=None)
        spread = seen[-1] - seen[0]
        detail = f"{len(seen)} arrived during the {gap:g} s gap (the origin writes one every {interval} s)"
        if (
            len(seen) > 1
            and released is not None
            and spread < 0.5 * interval
            and released - seen[-1] < 0.5 * interval
        ):
            detail += ", but all together at its end: a hop held them"
            return Check("keep-alives", Status.FAIL, detail, BUFFERING_FIX, data)
        return Check("keep-alives", Status.OK, detail, data=data)
    if not t.complete:
        return Check(
            "keep-alives", Status.FAIL, "none arrived before the stream was cut", TIMEOUT_FIX, data
        )
    return Check(
        "keep-alives",
        Status.FAIL,
        "none arrived: a hop drops SSE comment lines",
        "let comment lines through (`: keep-alive`); a hop that rewrites SSE must keep them",
        data,
    )


def cut_after(t: Timeline) -> float | None:
    """Seconds of silence after which the stream was cut, or None when it was not."""
    if t.complete or t.ended_at is None:
        return None
    since = t.last_byte_at if t.last_byte_at is not None else t.headers_at or 0.0
    return t.ended_at - since


def check_idle_cut(plain: Timeline, kept: Timeline | None) -> Check:
    gap = _float(plain.announced.get("gap_s"))
    cut = cut_after(plain)
    data: dict[str, object] = {"gap_s": gap, "cut_after_s": cut}
    if cut is None:
        if gap <= 0:
            return Check("idle cut", Status.SKIP, "no gap: run with --gap-s N to test", data=data)
        return Check(
            "idle cut", Status.OK, f"survived {gap:g} s of silence without keep-alives", data=data
        )
    how = f" ({plain.error})" if plain.error else ""
    if gap <= 0 or plain.silence_at is None:
        detail = f"the stream was cut after {len(plain.events)} events{how}"
        return Check("idle cut", Status.FAIL, detail, TIMEOUT_FIX, data)
    detail = f"cut after {cut:.1f} s of a {gap:g} s silence without keep-alives{how}"
    kept_cut = cut_after(kept) if kept is not None else None
    data["cut_with_keepalives_after_s"] = kept_cut
    if kept is not None and kept_cut is None and _keepalives(kept):
        detail += "; survived it with keep-alives"
        return Check("idle cut", Status.WARN, detail, TIMEOUT_FIX, data)
    if kept is not None and kept_cut is not None:
        detail += f"; with keep-alives too, after {kept_cut:.1f} s"
    return Check("idle cut", Status.FAIL, detail, TIMEOUT_FIX, data)


def checks(plain: Timeline, kept: Timeline | None) -> list[Check]:
    """Every check, in the order the report shows them. `kept` is the keep-alive run (None
    without a gap)."""
    return [
        check_first_byte(plain),
        check_headers(plain),
        check_bunching(plain),
        check_compression(plain),
        check_keepalives(kept),
        check_idle_cut(plain, kept),
    ]
