"""`python -m bench.ttft`: scenario e's added TTFT, every target at once, connections interleaved.

Scenario e (`python -m bench`) measures each target in its turn beside `direct` (the client
talks to the emulator itself), and subtracts. On a shared machine the floor itself moves by
more than a proxy adds (direct's TTFT p50 has moved 0.20 to 0.38 ms between repetitions of one
run), so a figure in turns is mostly the machine's moment. Here every target of a repetition
runs at once (each its own upstream, proxies on the proxy core, as `bench.paced --together`)
and one client opens sequential new connections to each in turn — direct, then each proxy,
then direct again — so that every moment of the machine falls on all of them alike. Each
connection asks for one token at once; its TTFT is from the connection's start to the token.

Prints each repetition's TTFT p50 per target and the added p50 (target minus direct, within
the repetition), then the medians over repetitions with a 95% bootstrap interval.

    python -m bench.ttft --targets nginx,sidestream --reps 5 --connections 300
    BENCH_ALT=/work/wt-old python -m bench.ttft --targets alt,sidestream   # A/B
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack

from bench import scenarios
from bench.report import median_interval
from bench.run import rotate
from bench.targets import PROXIES, otlp_sink, proxy_targets, session


def repetition(targets: list[str], sink_port: int, connections: int) -> dict[str, float]:
    """TTFT p50 in ms per target (`direct` among them), all started together and interleaved
    connection by connection."""
    with ExitStack() as stack:
        sessions = {t: stack.enter_context(session(t, sink_port)) for t in targets}
        ports = [sessions[t].port for t in targets]
        by_port = dict(zip(ports, targets, strict=True))
        cfg = {"concurrency": 1, "tokens": 1, "itl_ms": 0, "stamp": "content", "ports": ports}
        scenarios.loadgen(ports[0], [{**cfg, "streams": 20 * len(ports)}], 60)  # warm-up
        (result,) = scenarios.loadgen(
            ports[0], [{**cfg, "streams": connections * len(ports)}], 60 + connections
        )
    ttft: dict[str, list[float]] = {t: [] for t in targets}
    for record in result["streams"]:
        if record[0] >= 0:
            ttft[by_port[record[-1]]].append(record[0] / 1e6)
    if any(len(values) < connections // 2 for values in ttft.values()):
        raise RuntimeError(f"too few first tokens: { {t: len(v) for t, v in ttft.items()} }")
    return {t: statistics.median(values) for t, values in ttft.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft", description=__doc__)
    parser.add_argument(
        "--targets",
        default="nginx,sidestream",
        help=f"comma-separated proxies of {PROXIES} (default: nginx,sidestream); direct is "
        "always measured beside them",
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument(
        "--connections", type=int, default=300, help="connections per target per repetition"
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or not 10 <= args.connections <= 5000:
        parser.error("reps >= 1, 10 <= connections <= 5000")
    targets = proxy_targets(args.targets, parser.error)
    added: dict[str, list[float]] = {t: [] for t in targets}
    floor: list[float] = []
    with otlp_sink() as sink_port:
        for rep in range(args.reps):
            p50 = repetition(rotate(["direct", *targets], rep), sink_port, args.connections)
            floor.append(p50["direct"])
            line = [f"rep {rep + 1}: direct {p50['direct']:.3f} ms"]
            for target in targets:
                added[target].append(p50[target] - p50["direct"])
                line.append(f"{target} {p50[target]:.3f} (+{added[target][-1]:.3f})")
            print(", ".join(line), flush=True)
    print(
        f"\nscenario e interleaved: {args.connections} new connections per target per "
        f"repetition, {args.reps} repetitions; direct's TTFT p50 {statistics.median(floor):.3f} ms"
    )
    print("| target | added TTFT p50, ms (median) | 95% interval of that median |")
    print("|---|---|---|")
    for target in targets:
        interval = ""
        if len(added[target]) > 1:
            low, high = median_interval(added[target])
            interval = f"{low:.3f} to {high:.3f}"
        print(f"| {target} | {statistics.median(added[target]):.3f} | {interval} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
