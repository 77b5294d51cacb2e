"""`python -m bench.paced`: scenario a (or b, `--flood`) alone, repeated, for A/B work on CPU per token.

`python -m bench` runs every scenario; this runs only the paced one (50 streams of `--tokens`
tokens, 20 ms apart) for the chosen targets, each started afresh per repetition in an order
rotated by one, and prints each repetition's proxy CPU seconds per 100k tokens, its ratio to
the first target within that repetition, and the medians. The machine is noisy, so compare
ratios from one run, over several repetitions: beside each median ratio stand a 95% bootstrap
interval of it and how many repetitions were below 1. With `--tokens 1000` the per-stream share
is a fifth of scenario a's, so the ratio shows mostly what each token costs.

`--together` runs the targets at the same time instead, each with its own upstream and
load, all proxies on the proxy core: a neighbour's burst then lands on every target of a
repetition alike, so the ratios spread several times less than in turns (for A/B work on
one part of the hot path). Its absolute figures are not scenario a's: the proxies share the
core and its caches.

`--flood` runs scenario b instead (64 streams, no pause between tokens, 3 s): CPU per token
of a saturated proxy, in turns or together as scenario a.

    python -m bench.paced --targets sidestream,sidestream+no-otel --reps 6 --tokens 1000
    python -m bench.paced --together --flood --targets nginx,sidestream --reps 6
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench import scenarios
from bench.report import median_interval
from bench.run import cpu_per_100k, rotate, telemetry_wired, together
from bench.targets import PROXIES, VARIANTS_HELP, otlp_sink, proxy_targets, session, telemetry_on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced", description=__doc__)
    parser.add_argument(
        "--targets",
        default="nginx,sidestream,sidestream+no-otel",
        help=f"comma-separated proxies of {PROXIES} ({VARIANTS_HELP}); ratios are to the "
        "first (default: nginx,sidestream,sidestream+no-otel)",
    )
    parser.add_argument("--reps", type=int, default=4, help="repetitions (default 4)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream (default 200)")
    parser.add_argument(
        "--together", action="store_true", help="run the targets at the same time (see above)"
    )
    parser.add_argument("--flood", action="store_true", help="scenario b instead of a (see above)")
    parser.add_argument(
        "--stamp",
        choices=("content", "tail"),
        default="content",
        help="where the emulator puts each chunk's send time: in the token's text (vLLM's "
        "chunk shape, the default) or in a field after the choices (a tail per chunk)",
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.tokens < 2:
        parser.error("reps >= 1, tokens >= 2")
    targets = proxy_targets(args.targets, parser.error)
    cpu: dict[str, list[float]] = {t: [] for t in targets}
    ratios: dict[str, list[float]] = {t: [] for t in targets[1:]}
    stores: dict[str, list[float]] = {}  # a target's store CPU (sidestream+redis: redis-server)
    with otlp_sink() as sink_port:
        if any(map(telemetry_on, targets)) and not telemetry_wired(sink_port):
            print("sidestream as shipped sent no OTLP export to the sink", file=sys.stderr)
            return 1
        for rep in range(args.reps):
            if args.together:
                order = rotate(targets, rep)
                store: dict[str, float] = {}
                figures = together(order, sink_port, args.tokens, args.stamp, args.flood, store)
            else:
                figures, store = {}, {}
                for target in rotate(targets, rep):
                    with session(target, sink_port) as s:
                        figures[target] = cpu_per_100k(
                            s, args.tokens, args.stamp, args.flood, store
                        )
            base = figures[targets[0]]
            line = [f"rep {rep + 1}:"]
            for target in targets:
                cpu[target].append(figures[target])
                line.append(f"{target} {figures[target]:.3f}")
                if target != targets[0]:
                    ratios[target].append(figures[target] / base)
                    line.append(f"({ratios[target][-1]:.2f}x)")
                if target in store:
                    stores.setdefault(target, []).append(store[target])
                    line.append(f"+ store {store[target]:.3f}")
            print(" ".join(line), flush=True)
    when = "at the same time" if args.together else "in turns"
    if args.flood:
        shape = (
            f"scenario b, {scenarios.FLOOD_STREAMS} streams with no pause between tokens, "
            f"{scenarios.FLOOD_S:g} s"
        )
    else:
        shape = f"scenario a, 50 streams x {args.tokens} tokens, stamp in the {args.stamp}"
    print(f"\n{shape}, {args.reps} repetitions, {when}")
    print(
        f"| target | CPU s per 100k tokens (median) | vs {targets[0]} (median of ratios) "
        "| 95% interval of that median | lower than the first target |"
    )
    print("|---|---|---|---|---|")
    for target in targets:
        ratio, interval, lower = "1", "", ""
        if target in ratios:
            ratio = f"{statistics.median(ratios[target]):.3f}x"
            if len(ratios[target]) > 1:
                low, high = median_interval(ratios[target])
                interval = f"{low:.3f} to {high:.3f}"
            below = sum(r < 1 for r in ratios[target])
            lower = f"{below} of {len(ratios[target])}"
        print(
            f"| {target} | {statistics.median(cpu[target]):.2f} | {ratio} | {interval} | {lower} |"
        )
    for target, values in stores.items():  # not in the proxy's CPU above, nor in its ratio
        print(f"\n{target}'s store (redis-server) CPU s per 100k tokens, median: "
              f"{statistics.median(values):.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
