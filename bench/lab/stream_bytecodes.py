"""`python -m bench.lab.stream_bytecodes [--otel] [--top N] [--flags F]`: the Python bytecodes the running
sidecar executes per stream and per relayed token, function by function, every layer
included (server, proxy, guard, forced usage, telemetry when on).

Why: on the paced scenario a stream's fixed cost is about half of sidestream's CPU above
nginx's (`python -m bench.paced --tokens 5` against `--tokens 1000`), and that cost is
mostly interpreted Python spread over a few hundred functions. `bench.lab.layers` says which
layer it is in, in instructions; this says which functions, in bytecodes.

How: the emulator runs natively; the sidecar runs with a `sys.settrace` tracer
(`f_trace_opcodes`) that the parent switches on and off with SIGUSR1 and SIGUSR2 (the latter
writes the counts as JSON). After a warm-up (pools, first calls, the paced path), two paced
loads of N streams x T1 and N x T2 tokens (20 ms apart, as scenario a) give per function a
line: bytecodes per token (the slope) and per stream (the rest). Steady within about 2% (a
load opens more or fewer upstream connections); counts, not time, and only the interpreter's: the C behind a call is not counted
(`bench.lab.instructions` counts that). For an A/B, run it from each tree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.lab.bytecodes import opcode_tracer
from bench.lab.instructions import DEFAULT_OTEL, line, loadgen
from bench.targets import PY, ROOT, free_port, otlp_sink, wait_port

Counts = Counter[str]  # "file:qualified name" -> bytecodes


def rates(short: Counts, long: Counts, streams: int, tokens: tuple[int, int]) -> dict[str, Any]:
    """Per function, (per token, per stream) from two loads of `streams` streams of
    `tokens[0]` and `tokens[1]` tokens: the slope, and the short load's rest per stream."""
    return {
        name: line(short[name], long[name], streams, *tokens) for name in short.keys() | long.keys()
    }


def serve(dump: str, argv: list[str]) -> None:
    """The sidecar (`python -m sidecar ARGV`) with the tracer on SIGUSR1, off and dumped to
    `dump` on SIGUSR2."""
    counts: Counts = Counter()
    root = str(ROOT) + "/"
    call = opcode_tracer(
        counts, lambda code: f"{code.co_filename.removeprefix(root)}:{code.co_qualname}"
    )

    def on(*_: Any) -> None:
        counts.clear()
        sys.settrace(call)

    def off(*_: Any) -> None:
        sys.settrace(None)
        Path(dump + ".part").write_text(json.dumps(counts))
        os.replace(dump + ".part", dump)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from sidecar.cli import main

    sys.argv = ["sidecar", *argv]
    raise SystemExit(main())


def traced(pid: int, dump: Path, port: int, streams: int, tokens: int) -> Counts:
    """The bytecodes the sidecar at `pid` runs for one paced load."""
    dump.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.2)  # the handler runs on the loop's next wake-up
    loadgen(port, streams, tokens, 20, stamp=True)
    os.kill(pid, signal.SIGUSR2)
    for _ in range(200):
        if dump.exists():
            return Counter(json.loads(dump.read_text()))
        time.sleep(0.05)
    raise RuntimeError("the sidecar wrote no counts")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--otel", action="store_true", help="telemetry on (spans + metrics)")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--tokens", default="5,55", help="two stream lengths, T1,T2")
    parser.add_argument("--top", type=int, default=30, help="functions listed (default 30)")
    parser.add_argument("--flags", default="", help="more sidecar flags, e.g. --flags=--resume")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1:])
    t1, t2 = (int(t) for t in args.tokens.split(","))
    if args.streams < 1 or not 0 < t1 < t2:
        parser.error("streams >= 1 and 0 < T1 < T2")
    upstream, port, admin = free_port(), free_port(), free_port()
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if args.otel:
            sink = stack.enter_context(otlp_sink())
            env = {**DEFAULT_OTEL, **env, "OTEL_SDK_DISABLED": "false"}
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink}"
        quiet: dict[str, Any] = dict(cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        emulator = subprocess.Popen(
            [PY, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{upstream}"], **quiet
        )
        stack.callback(emulator.wait)
        stack.callback(emulator.kill)
        dump = Path(tmp) / "counts.json"
        argv = ["--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{upstream}"]
        argv += ["--admin-listen", f"127.0.0.1:{admin}", *shlex.split(args.flags)]
        cmd = [PY, "-m", "bench.lab.stream_bytecodes", "--serve", str(dump), *argv]
        sidecar = subprocess.Popen(cmd, env=env, **quiet)
        stack.callback(sidecar.wait)
        stack.callback(sidecar.kill)
        wait_port(upstream, emulator)
        wait_port(port, sidecar)
        loadgen(port, 5, 20, 0)  # warm-up: pools, first calls, then the paced path
        loadgen(port, 5, 5, 20)
        short = traced(sidecar.pid, dump, port, args.streams, t1)
        long = traced(sidecar.pid, dump, port, args.streams, t2)
    table = rates(short, long, args.streams, (t1, t2))
    mode = "telemetry on" if args.otel else "telemetry off"
    per_token = sum(t for t, _ in table.values())
    per_stream = sum(s for _, s in table.values())
    print(f"sidecar, {mode}: {per_token:,.1f} bytecodes per token, {per_stream:,.0f} per stream")
    for column, title in ((1, "per stream"), (0, "per token")):
        print(f"\n| function | {title} |\n|---|---|")
        ranked = sorted(table.items(), key=lambda item: -item[1][column])
        for name, figures in ranked[: args.top]:
            if figures[column] >= 0.05:
                print(f"| {name} | {figures[column]:,.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
