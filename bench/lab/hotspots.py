"""`python -m bench.lab.hotspots [--target T] [--tokens N] [--reps R]`: where the running sidecar's
time goes, function by function, under scenario a.

`bench.lab.instructions` and `bench.lab.telemetry_cost` count code run with warm caches. In the
running sidecar a token's work meets caches that the kernel's TCP path and 49 other streams
have just used, and the same Python costs several times more (the Python `Frame.matches`
took ~0.5 µs per call in a loop and 1.2-1.8 µs here). This starts sidestream through a
wrapper that times the Python functions below with `perf_counter` (wall time inside each call, nested calls included;
the wrapper adds ~0.1-0.2 µs per call), runs scenario a, and prints per function its calls,
µs per call and ms per 100k relayed tokens, next to the process's CPU per 100k tokens. The
cyclic garbage collector's passes inside the load's CPU window are timed too (`gc.callbacks`),
per generation.
Compare the same build with and without a change, or telemetry on (`--target sidestream`, as
shipped, the default) with off (`--target sidestream+no-otel`).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.targets import otlp_sink, session

OUT = "BENCH_HOTSPOTS"  # where the child writes its totals (set: run as the sidecar)
HOTSPOTS = {  # label: (module the caller looks it up in, class, function)
    "Cycle.__init__": ("middleware.cycle", "Cycle", "__init__"),
    "ObservedCycle._relayed": ("middleware.telemetry.observed", "ObservedCycle", "_relayed"),
    "ObservedCycle._observe": ("middleware.telemetry.observed", "ObservedCycle", "_observe"),
    "StreamRecord.__init__": ("middleware.telemetry.record", "StreamRecord", "__init__"),
    "request_attributes": ("middleware.telemetry.record", "", "request_attributes"),
    "DirectSpans.start": ("middleware.telemetry.direct", "DirectSpans", "start"),
    "finish": ("middleware.telemetry.observed", "", "finish"),
    "Gaps.fold": ("middleware.telemetry.gaps", "Gaps", "fold"),
    "Gaps.seal": ("middleware.telemetry.gaps", "Gaps", "seal"),
    "Gaps.quantiles": ("middleware.telemetry.gaps", "Gaps", "quantiles"),
    "ChunkHistogram.fold": ("middleware.telemetry.gaps", "ChunkHistogram", "fold"),
    "LocalHistogram.merge": ("middleware.telemetry.instruments", "LocalHistogram", "merge"),
    "LocalCounter.add": ("middleware.telemetry.instruments", "LocalCounter", "add"),
    "DirectSpans.end": ("middleware.telemetry.direct", "DirectSpans", "end"),
    "Encoder.write (a span's OTLP)": ("middleware.telemetry.otlp_encoder", "Encoder", "write"),
    "Summary.__init__": ("middleware.telemetry.summary", "Summary", "__init__"),
    "SpanSink.emit": ("middleware.telemetry.sinks.span", "SpanSink", "emit"),
    "MetricsSink.emit": ("middleware.telemetry.sinks.metrics", "MetricsSink", "emit"),
    "AccessSink.emit": ("middleware.telemetry.sinks.access", "AccessSink", "emit"),
}
GC = ("gc gen0", "gc gen1", "gc gen2")  # the collector's passes during the load (gc.callbacks)


def _time_gc(passes: list[tuple[float, float, int]]) -> None:
    """Keep each collection's (start on the monotonic clock, seconds, generation)."""
    clock = time.monotonic
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = clock()
        else:
            passes.append((started[0], clock() - started[0], info["generation"]))

    gc.callbacks.append(callback)


def _timed(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += clock() - start
            total[1] += 1

    return timed


def child(out: str) -> int:
    """Run the sidecar (argv as `python -m sidecar`) with the hotspots timed."""
    totals: dict[str, list[float]] = {}
    for label, (module, cls, name) in HOTSPOTS.items():
        owner: Any = importlib.import_module(module)
        if cls:
            owner = getattr(owner, cls)
        totals[label] = [0.0, 0]
        # The per-chunk path is compiled where it was built (`middleware.speedups`): its
        # functions cannot be wrapped here, so the table holds the Python ones around it.
        setattr(owner, name, _timed(getattr(owner, name), totals[label]))
    passes: list[tuple[float, float, int]] = []
    _time_gc(passes)

    def write() -> None:
        Path(out).write_text("".join(f"{k}\t{t}\t{n}\n" for k, (t, n) in totals.items()))
        Path(out + ".gc").write_text("".join(f"{at}\t{t}\t{g}\n" for at, t, g in passes))

    atexit.register(write)
    from sidecar.cli import main

    return main(sys.argv[1:])


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab.hotspots", description=__doc__)
    parser.add_argument("--target", default="sidestream", help="sidestream or sidestream+no-otel")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream (default 200)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    args = parser.parse_args()
    if args.target not in ("sidestream", "sidestream+no-otel"):
        parser.error("--target is sidestream or sidestream+no-otel")
    labels = [*HOTSPOTS, *GC]
    per_call: dict[str, list[float]] = {k: [] for k in labels}
    per_100k: dict[str, list[float]] = {k: [] for k in labels}
    calls: dict[str, list[float]] = {k: [] for k in labels}
    cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-hotspots-") as tmp, otlp_sink() as sink:
        for rep in range(args.reps):
            out = Path(tmp) / f"rep{rep}.tsv"
            os.environ[OUT] = str(out)
            try:
                with session(args.target, sink, module="bench.lab.hotspots") as s:
                    window = time.monotonic()
                    figures = scenarios.paced(s, tokens=args.tokens)
                    window_end = time.monotonic()
            finally:
                del os.environ[OUT]
            cpu.append(figures["a_cpu_100k"])
            tokens = figures["a_tokens"]
            rows = [line.split("\t") for line in out.read_text().splitlines()]
            gc_totals = {label: [0.0, 0] for label in GC}
            for line in Path(f"{out}.gc").read_text().splitlines():
                at, seconds, generation = line.split("\t")
                if window <= float(at) <= window_end:  # the load's CPU window, not start-up
                    gc_totals[GC[int(generation)]][0] += float(seconds)
                    gc_totals[GC[int(generation)]][1] += 1
            rows += [[label, str(t), str(n)] for label, (t, n) in gc_totals.items()]
            for label, total, n in rows:
                count = int(n)
                calls[label].append(count)
                per_call[label].append(float(total) / count * 1e6 if count else 0.0)
                per_100k[label].append(float(total) / tokens * 1e8)
    print(f"{args.target}, scenario a, 50 streams x {args.tokens} tokens, {args.reps} reps")
    print(f"process CPU per 100k tokens (median): {statistics.median(cpu):.3f} s\n")
    print("| function | calls (run incl. warm-up) | µs per call | ms per 100k tokens |")
    print("|---|---|---|---|")
    for label in labels:
        if not max(calls[label], default=0):
            continue
        print(
            f"| {label} | {statistics.median(calls[label]):.0f} "
            f"| {statistics.median(per_call[label]):.2f} "
            f"| {statistics.median(per_100k[label]):.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(child(os.environ[OUT]) if os.environ.get(OUT) else main())
