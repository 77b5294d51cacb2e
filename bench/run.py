"""`python -m bench [--full]`: run every target through the scenarios, print the markdown report.

The targets by default: `direct`, sidestream as shipped (`sidestream`: telemetry on, exporting
OTLP to the bench's sink, access line on, `--usage force`), then stripped down with telemetry
off (`sidestream+no-otel`), and `nginx`; `--targets` names others (`bench.targets`).

Quick mode (`make bench`, about 12 minutes): five repetitions, fewer cancel/connect samples,
2,000 idle streams. Full mode (`make bench-full`, about 25 minutes): seven repetitions and
idle at 2,000 and 9,000. Each repetition starts each target's processes afresh, in an order
rotated by one per repetition (targets in turns). Then scenario a runs a few more times with
telemetry on and off at the same time (`together`: 2 quick, 5 full), for telemetry's share:
in turns, the machine's load moves that ratio by more than its budget's margin. The report
goes to stdout and `bench/results/<timestamp>.md`.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report, scenarios
from bench.targets import (
    LOAD_CORES,
    PROXY_CORES,
    ROOT,
    TARGETS,
    VARIANTS_HELP,
    Session,
    known,
    nginx_binary,
    otlp_sink,
    session,
    telemetry_on,
    variant,
)


@dataclass(frozen=True)
class Mode:
    name: str
    reps: int
    flood_s: float
    cancels: int
    connects: int
    idle: tuple[int, ...]
    together: int  # repetitions of scenario a with telemetry off and on at the same time


QUICK = Mode("quick", reps=5, flood_s=2.0, cancels=50, connects=100, idle=(2000,), together=2)
FULL = Mode("full", reps=7, flood_s=3.0, cancels=100, connects=200, idle=(2000, 9000), together=5)
# As shipped first, then stripped down, then the floor and the yardstick.
DEFAULT_TARGETS = ("sidestream", "sidestream+no-otel", "direct", "nginx")


def log(msg: str) -> None:
    print(msg, flush=True)


def rotate(items: list[str], n: int) -> list[str]:
    n %= len(items)
    return items[n:] + items[:n]


def together(
    targets: list[str],
    sink_port: int,
    tokens: int,
    stamp: str,
    flood: bool = False,
    stores: dict[str, float] | None = None,
) -> dict[str, float]:
    """Scenario a's CPU per 100k tokens of each target (scenario b's with `flood`), all loaded
    at once (each with its own upstream and load, the proxies sharing the proxy core): a
    neighbour's burst lands on every target alike, so their ratio spreads several times less
    than in turns. Started in the order given: callers rotate it per repetition, so no target
    always starts first. `stores` gets each target's store CPU (`cpu_per_100k`), where it has one."""
    figures: dict[str, float] = {}
    with ExitStack() as stack:
        sessions = {t: stack.enter_context(session(t, sink_port)) for t in targets}

        def load(target: str) -> None:
            figures[target] = cpu_per_100k(sessions[target], tokens, stamp, flood, stores)

        threads = [threading.Thread(target=load, args=(t,)) for t in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if len(figures) != len(targets):
        raise RuntimeError(f"a load failed: got figures for {sorted(figures)} only")
    return figures


def cpu_per_100k(
    s: Session, tokens: int, stamp: str, flood: bool = False, stores: dict[str, float] | None = None
) -> float:
    """One run of scenario a (`tokens` a stream), or of scenario b with `flood`: the proxy's
    CPU seconds per 100k tokens; in scenario a, the store's (sidestream+redis: redis-server's)
    into `stores`, under the target's name."""
    if flood:
        return float(scenarios.flood(s)["b_cpu_100k"])
    figures = scenarios.paced(s, tokens=tokens, stamp=stamp)
    if stores is not None and "a_store_cpu_100k" in figures:
        stores[s.target] = figures["a_store_cpu_100k"]
    return float(figures["a_cpu_100k"])


def telemetry_together(sink_port: int, reps: int) -> list[float]:
    """Telemetry on (as shipped) over off in scenario a, `reps` times, both targets at once."""
    ratios = []
    for rep in range(reps):
        pair = rotate(["sidestream", "sidestream+no-otel"], rep)  # neither always first
        log(f"together {rep + 1}/{reps}: {', '.join(pair)}")
        try:
            figures = together(pair, sink_port, 200, "content")
        except Exception:  # a failed load: the report has the repetitions that ran
            log(traceback.format_exc())
            continue
        ratios.append(figures["sidestream"] / figures["sidestream+no-otel"])
    return ratios


def telemetry_wired(sink_port: int) -> bool:
    """Run a few streams through sidestream as shipped; did the sink get its exports?"""
    with session("sidestream", sink_port) as s:
        return s.exported


# With resume on, a client's close does not cancel the upstream: the stream goes on for its
# grace period, to be resumed. Scenario d's measure (close seen upstream) does not apply.
NO_CANCEL: dict[str, Any] = {"d_p50_ms": "n/a", "d_p99_ms": "n/a", "d_ran_on": "n/a (resume)"}


def cancels(target: str) -> bool:
    """Does a client's close cancel the upstream on this target (scenario d applies)?"""
    found = variant(target)
    return found is None or not {"resume", "redis"} & found[1]


def run_streams(target: str, sink_port: int, mode: Mode) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with session(target, sink_port) as s:
        steps: list[Callable[[], dict[str, Any]]] = [
            lambda: scenarios.paced(s),
            lambda: scenarios.flood(s, duration=mode.flood_s),
            lambda: scenarios.cancel(s, streams=mode.cancels) if cancels(target) else NO_CANCEL,
            lambda: scenarios.connect(s, n=mode.connects),
        ]
        for step in steps:
            figures.update(step())
    return figures


def run_idle(target: str, sink_port: int, n: int) -> dict[str, Any]:
    with session(target, sink_port) as s:
        return scenarios.idle(s, n)


def guarded(label: str, fn: Any, *args: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        figures: dict[str, Any] = fn(*args)
    except Exception as exc:
        log(f"  {label}: FAILED {type(exc).__name__}: {exc}")
        traceback.print_exc(limit=2)
        return {"error": f"{type(exc).__name__}: {exc}"}
    log(f"  {label}: {time.monotonic() - t0:.1f}s")
    return figures


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB, Linux {platform.release()}, "
        f"Python {platform.python_version()}; proxy pinned to CPU {sorted(PROXY_CORES)}, "
        f"load generator + emulator on {sorted(LOAD_CORES)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--full", action="store_true", help="full mode (about 13 minutes)")
    parser.add_argument("--reps", type=int, help="repetitions (default: 5 quick, 7 full)")
    parser.add_argument(
        "--targets",
        help=f"comma-separated, in the report's order (default: {','.join(DEFAULT_TARGETS)}); "
        f"of {','.join(TARGETS)} ({VARIANTS_HELP})",
    )
    args = parser.parse_args(argv)
    mode = FULL if args.full else QUICK
    reps = args.reps or mode.reps
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    notes = [f"Mode: {mode.name}, {reps} repetition(s). Machine: {machine()}."]
    if hard < 2 * max(mode.idle) + 1000:
        notes.append(f"RLIMIT_NOFILE hard limit is {hard}: the largest idle run may run out.")
    targets = [t for t in (args.targets or ",".join(DEFAULT_TARGETS)).split(",") if t]
    if not targets or not all(known(t) for t in targets):
        parser.error(f"targets are some of {','.join(TARGETS)} ({VARIANTS_HELP})")
    if "nginx" in targets and nginx_binary() is None:
        targets.remove("nginx")
        notes.append("nginx is not installed: skipped (apt-get install nginx).")
        log(notes[-1])
    started = time.monotonic()
    with otlp_sink() as sink_port:
        otel = any(map(telemetry_on, targets)) and telemetry_wired(sink_port)
        if any(map(telemetry_on, targets)) and not otel:
            # Measured all the same: what a user whose collector is away pays.
            notes.append("sidestream as shipped sent no OTLP export to the bench's sink.")
            log(notes[-1])
        reps_figures: list[report.Rep] = []
        for rep in range(reps):
            figures: report.Rep = {}
            for target in rotate(targets, rep):
                log(f"rep {rep + 1}/{reps}: {target}")
                figures[target] = guarded(target, run_streams, target, sink_port, mode)
            reps_figures.append(figures)
        both = otel and {"sidestream", "sidestream+no-otel"} <= set(targets)
        at_once = telemetry_together(sink_port, mode.together) if both else []
        for i, n in enumerate(mode.idle):
            for target in rotate(targets, i):
                log(f"idle {n}: {target}")
                reps_figures[0].setdefault(target, {}).update(
                    guarded(target, run_idle, target, sink_port, n)
                )
    for figures in reps_figures:
        report.derive(figures)
    med = report.medians(reps_figures, targets)
    elapsed = time.monotonic() - started
    notes.append(f"Wall time: {elapsed:.0f} s.")
    errors = [f"{t}: {f['error']}" for rep in reps_figures for t, f in rep.items() if "error" in f]
    text = "\n\n".join(
        [
            f"# sidestream benchmark — {time.strftime('%Y-%m-%d %H:%M:%S')}",
            " ".join(notes),
            report.table(med, targets, list(mode.idle)),
            report.budgets(med, list(mode.idle), otel, at_once),
            report.cpu_by_rep(reps_figures, targets),
        ]
        + (["Errors:\n" + "\n".join(f"- {e}" for e in errors)] if errors else [])
    )
    out = ROOT / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-{mode.name}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    log("\n" + text + f"\n\n(written to {out.relative_to(ROOT)})")
    return 0
