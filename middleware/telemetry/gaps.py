"""Inter-token gaps: a per-stream log-bucket histogram and the process-wide chunk histogram.

`Gaps` holds one stream's gaps between content-carrying chunks in O(1) memory: counts in fixed
log buckets, 8 per octave (each at most 12.5% wide) from 2.4 µs to 150 s. Per chunk it costs
one list append; the gaps are bucketed in batches (made and sorted by `sorted_gaps`, then one
`bisect` per non-empty bucket, not one per gap). Percentiles are read from it once, at the
stream's end. A stream that ends before its first batch (`FOLD_AT` chunks: most streams) skips
the buckets altogether: `seal` sorts its gaps once, and the readers take exact quantiles and
the chunk histogram's counts from that sorted list (a few `bisect`s), not from buckets.

`ChunkHistogram` is `gen_ai.client.operation.time_per_output_chunk`, which the conventions
record once per chunk. An SDK `Histogram.record` costs more than the whole relay of a token,
so the gaps are folded into it once per stream instead. That is exact, not an
approximation: the conventions' boundaries (10 ms doubling) are bucket bounds here, so every
log bucket lies inside exactly one of their buckets.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from operator import sub

from middleware.telemetry import semconv
from middleware.telemetry.instruments import Key, LocalHistogram

SUB = 8  # log buckets per octave
# Upper bounds: bucket i holds (BOUNDS[i-1], BOUNDS[i]], as OTel's explicit buckets do; the
# last bucket holds everything above BOUNDS[-1]. Octaves of 10 ms, so 0.01 * 2**k are bounds.
BOUNDS = [math.ldexp(1.0 + s / SUB, e) / 100.0 for e in range(-12, 14) for s in range(SUB)]
_bucket_of = functools.partial(bisect.bisect_left, BOUNDS)
# The conventions' bucket (0 = up to 10 ms ... 14 = above 81.92 s) holding each log bucket.
TIMES_KEPT = 256  # chunk times held per stream before folding: 8 KB at most
_SPEC_OF = [bisect.bisect_left(semconv.DURATION_BUCKETS, b) for b in [*BOUNDS, math.inf]]
_SPEC_BOUNDS = list(semconv.DURATION_BUCKETS)


_NO_COUNTS: dict[int, int] = {}  # `Gaps.counts` before a fold: never written to


def sorted_gaps(times: list[float], last: float | None) -> list[float]:
    """The gaps between consecutive `times` (after `last`, unless None), sorted. Python's
    own: a float object per gap and the sort's float compares cost tens of ns a token, which
    a hand-written C twin saved and no longer pays for (one source; see the note of #48)."""
    if last is None:
        return sorted(map(sub, times[1:], times))
    return sorted(map(sub, times, itertools.chain((last,), times)))


class Gaps:
    """Time between consecutive content-carrying chunks of one stream, in seconds.

    Per chunk only its time is kept: a list append (`add`, or the relay's token path, through
    the record's `Tally`, appending to `times` itself and folding at `FOLD_AT`). A list, not an `array("d")`: it
    keeps the float the clock returned, where an array unboxes it on append and boxes it
    again at the fold (more instructions per chunk, not fewer). Every `FOLD_AT` times,
    and before anything is read, the batch is folded into the buckets: differences and a
    sort in C, then one step per non-empty bucket. Memory stays bounded: at most `FOLD_AT`
    floats (32 bytes each with the list's pointer) plus the non-empty buckets (a dict: a
    stream's gaps fill a few of the 209). `count`, `total`, `max`, `first` and `last` are
    current after `fold()` (the readers below fold first).
    """

    __slots__ = ("count", "counts", "exact", "first", "last", "max", "times", "total")
    FOLD_AT = TIMES_KEPT  # chunk times kept before folding (the record's tally appends too)

    def __init__(self) -> None:
        self.times: list[float] = []  # chunk times not folded yet
        # Bucket index -> gaps, the non-empty buckets; one shared empty dict until a first
        # fold (most streams never fold: see `seal`).
        self.counts: dict[int, int] = _NO_COUNTS
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.first: float | None = None
        self.last: float | None = None
        # Every gap, sorted, instead of `counts`: set by `seal` when nothing was folded.
        self.exact: list[float] | None = None

    def add(self, now: float) -> None:
        """A content-carrying chunk arrived at `now` (the cycle's monotonic clock)."""
        times = self.times
        times.append(now)
        if len(times) >= self.FOLD_AT:
            self.fold()

    def added(self) -> int:
        """Chunk times added so far, folded or not."""
        folded = 0 if self.first is None else self.count + 1
        return folded + len(self.times)

    def fold(self) -> None:
        """Turn the times kept so far into gaps in the buckets (see the class docstring)."""
        times = self.times
        if not times:
            return
        self._unseal()  # a time after `seal`: the sorted gaps go to the buckets too
        last = self.last
        if last is None:
            self.first = times[0]
        gaps = sorted_gaps(times, last)
        first, self.last = times[0] if last is None else last, times[-1]
        del times[:]
        if not gaps:
            return
        self.count += len(gaps)
        self.total += self.last - first  # the gaps' sum, as consecutive differences add up
        self.max = max(self.max, gaps[-1])
        self._bucket(gaps)

    def seal(self) -> None:
        """The stream has ended: fold what is kept, or, when nothing was folded yet, keep the
        gaps sorted as they are (`exact`) for the readers below. A time added afterwards
        moves them into the buckets, so a sealed `Gaps` stays correct."""
        times = self.times
        if self.first is not None or len(times) < 2 or self.exact is not None:
            self.fold()
            return
        gaps = sorted_gaps(times, None)
        self.first, self.last = times[0], times[-1]
        del times[:]
        self.count = len(gaps)
        self.total = self.last - self.first  # the gaps' sum, as consecutive differences add up
        self.max = gaps[-1]
        self.exact = gaps

    def _unseal(self) -> None:
        """Move the gaps `seal` kept sorted into the buckets (the readers of buckets need
        every gap there)."""
        if self.exact is not None:
            self._bucket(self.exact)
            self.exact = None

    def _bucket(self, gaps: list[float]) -> None:
        """Count sorted `gaps` into the buckets. Sorted, the gaps of one bucket are a run:
        one step per non-empty bucket (a stream's gaps fill a few), each a bisect for the
        run's end, instead of a search per gap."""
        counts, top, n = self.counts, len(BOUNDS), len(gaps)
        if counts is _NO_COUNTS:
            counts = self.counts = {}
        start = 0
        while start < n:
            index = _bucket_of(gaps[start])
            if index == top:
                end = n
            else:  # gaps[start] <= BOUNDS[index]: the run holds at least that gap
                end = max(start + 1, bisect.bisect_right(gaps, BOUNDS[index], start))
            counts[index] = counts.get(index, 0) + end - start
            start = end

    def buckets(self) -> dict[int, int]:
        """The non-empty buckets: index -> count (the readers share it: do not change it)."""
        self._unseal()
        self.fold()
        return self.counts

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) to within one bucket (12.5%), never above the max;
        exact (nearest rank) once `seal` has kept the gaps sorted."""
        return self.quantiles(q)[0]

    def quantiles(self, *qs: float) -> list[float | None]:
        """`quantile` of each of `qs` (ascending), in one walk of the buckets."""
        self.fold()
        if not self.count or not qs:
            return [None] * len(qs)
        ranks = [max(1, math.ceil(q * self.count)) for q in qs]
        exact = self.exact
        if exact is not None:
            return [exact[rank - 1] for rank in ranks]
        out: list[float | None] = []
        seen = 0
        for index, n in sorted(self.buckets().items()):
            seen += n
            while seen >= ranks[len(out)]:
                out.append(min(_midpoint(index), self.max))
                if len(out) == len(ranks):
                    return out
        return out + [self.max] * (len(qs) - len(out))  # not reached: counts add to count

    def tokens_per_second(self) -> float | None:
        """Content chunks per second after the first one (None with fewer than two)."""
        self.fold()
        if self.first is None or self.last is None or self.last <= self.first:
            return None
        return self.count / (self.last - self.first)


def _lower_bound(index: int) -> float:
    return 0.0 if index == 0 else BOUNDS[index - 1]


def _midpoint(index: int) -> float:
    upper = BOUNDS[index] if index < len(BOUNDS) else BOUNDS[-1]
    return (_lower_bound(index) + upper) / 2


class ChunkHistogram(LocalHistogram):
    """`time_per_output_chunk`: each stream's gaps folded in at once, in the conventions'
    buckets. Written from the event loop once per stream, read by the metric reader's thread.
    """

    def __init__(self, start_time_ns: int) -> None:
        super().__init__(
            semconv.METRIC_TIME_PER_OUTPUT_CHUNK,
            "s",
            "Time per output chunk after the first one, chunk end to chunk end.",
            semconv.DURATION_BUCKETS,
            start_time_ns,
        )

    def fold(self, gaps: Gaps, key: Key) -> None:
        gaps.fold()
        if not gaps.count:
            return
        exact = gaps.exact
        if exact is not None:  # sorted: each bucket's count is where its bound falls
            by_spec: dict[int, int] = {}
            n, below = len(exact), 0
            for spec, bound in enumerate(_SPEC_BOUNDS):
                at = bisect.bisect_right(exact, bound, below)
                if at > below:
                    by_spec[spec] = at - below
                    below = at
                if below == n:
                    break
            else:
                by_spec[len(_SPEC_BOUNDS)] = n - below
            self.merge(key, by_spec, gaps.count, gaps.total, exact[0], gaps.max)
            return
        counts: dict[int, int] = {}
        buckets = gaps.buckets()
        for index, n in buckets.items():
            spec = _SPEC_OF[index]
            counts[spec] = counts.get(spec, 0) + n
        # min is the lower bound of the lowest bucket: within 12.5% below the true one.
        low = _lower_bound(min(buckets))
        self.merge(key, counts, gaps.count, gaps.total, low, gaps.max)
