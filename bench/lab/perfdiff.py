"""`python -m bench.lab.perfdiff [--targets A,B] [--rounds N] [--reps R]`: where the CPU that
target B spends over target A goes — kernel included — by shared object and by symbol.

py-spy and the instruction counters see only the Python side; on this kind of machine the
kernel is about two thirds of a proxy's CPU in scenario a, so a cost that shows in CPU
seconds may not show there at all. This samples each proxy with `perf record -e cpu-clock`
(a software clock: no hardware counters needed, as in a VM) while it runs scenario a `R`
times, for `N` rounds, the two proxies started once and loaded one at a time in an order
reversed each round, then prints the samples of each by shared object (`[kernel.kallsyms]`,
`libpython`, uvloop, ...) and the symbols whose samples grew the most from A to B.

Samples are CPU time (4,000 a CPU-second), so their totals move with the machine's noise like
the benchmark's figures do; what this tells is where a difference lies, not how big it is
(that is `bench.paced`'s job). Needs `perf` (Debian: `linux-perf`) and permission to attach
to the proxy (root, or `kernel.perf_event_paranoid` <= 1). Takes about a minute a round.

    python -m bench.lab.perfdiff --targets sidestream+no-otel,sidestream --rounds 4 --reps 3
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench import scenarios
from bench.procstat import tree
from bench.targets import TARGETS, otlp_sink, session

Samples = Counter[tuple[str, str]]  # (shared object, symbol) -> samples
RATE = 4000  # samples per CPU-second


def parse_report(text: str) -> Samples:
    """`perf report --sort dso,sym -n -t '|'` output as samples per (object, symbol)."""
    samples: Samples = Counter()
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if line.startswith("#") or len(fields) != 4 or not fields[1].isdigit():
            continue
        symbol = fields[3].split("] ", 1)[-1]  # "[k] name" or "[.] name"
        samples[fields[2], symbol] += int(fields[1])
    return samples


def report(data: Path) -> Samples:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "-n"]
        + ["-t", "|"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_report(out)


def by_object(samples: Samples) -> Counter[str]:
    objects: Counter[str] = Counter()
    for (obj, _), n in samples.items():
        objects[obj] += n
    return objects


def compare(a: Samples, b: Samples, names: tuple[str, str], top: int = 25) -> str:
    """The two targets' samples side by side: totals, by object, the symbols grown most."""
    total_a, total_b = sum(a.values()), sum(b.values())
    lines = [f"samples: {names[0]} {total_a}, {names[1]} {total_b} ({total_b / total_a:.3f}x)"]
    lines += [
        "",
        f"| object | {names[0]} | {names[1]} | difference | share of it |",
        "|---" * 5 + "|",
    ]
    objects_a, objects_b = by_object(a), by_object(b)
    grown = total_b - total_a or 1
    for obj in sorted(set(objects_a) | set(objects_b), key=lambda o: -objects_b[o]):
        d = objects_b[obj] - objects_a[obj]
        if objects_a[obj] + objects_b[obj] >= 10:
            line = f"| {obj} | {objects_a[obj]} | {objects_b[obj]} | {d:+d} | {d / grown:.0%} |"
            lines.append(line)
    lines += ["", f"| symbol (grown most) | object | {names[0]} | {names[1]} | difference |"]
    lines.append("|---" * 5 + "|")
    for key in sorted(set(a) | set(b), key=lambda k: a[k] - b[k])[:top]:
        lines.append(f"| {key[1]} | {key[0]} | {a[key]} | {b[key]} | {b[key] - a[key]:+d} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab.perfdiff", description=__doc__)
    parser.add_argument("--targets", default="sidestream+no-otel,sidestream", help="A,B")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (default 4)")
    parser.add_argument("--reps", type=int, default=3, help="scenario a runs a round (default 3)")
    args = parser.parse_args(argv)
    names = tuple(t for t in args.targets.split(",") if t)
    if len(names) != 2 or any(t not in TARGETS or t == "direct" for t in names):
        parser.error(f"two proxies of {TARGETS}")
    if args.rounds < 1 or args.reps < 1:
        parser.error("rounds and reps must be at least 1")
    if shutil.which("perf") is None:
        print("bench.lab.perfdiff needs perf (apt-get install linux-perf)", file=sys.stderr)
        return 1
    totals: dict[str, Samples] = {t: Counter() for t in names}
    with otlp_sink() as sink, ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        sessions = {t: stack.enter_context(session(t, sink)) for t in names}
        for target in names:
            scenarios.paced(sessions[target])  # warm: first calls, pools, the first export
        for round_ in range(args.rounds):
            for target in names if round_ % 2 == 0 else names[::-1]:
                proxy = sessions[target].proxy
                assert proxy is not None
                data = Path(tmp) / f"{round_}-{target}.data"
                perf = subprocess.Popen(
                    ["perf", "record", "-e", "cpu-clock", "-F", str(RATE), "-o", str(data)]
                    + ["-p", ",".join(map(str, tree(proxy.pid)))],  # nginx: its worker too
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.5)  # perf attached
                cpu = [scenarios.paced(sessions[target])["a_cpu_100k"] for _ in range(args.reps)]
                perf.send_signal(signal.SIGINT)
                perf.wait(30)
                totals[target] += report(data)
                shown = ", ".join(f"{c:.2f}" for c in cpu)
                print(f"round {round_ + 1}: {target} CPU s per 100k tokens {shown}", flush=True)
    a, b = names
    print()
    print(compare(totals[a], totals[b], (a, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
