"""`python -m bench.lab.bytecodes [--setup S] [--unstamped] [--top N]`: the Python bytecodes a
telemetry setup adds per relayed token and per stream, function by function.

Streams go through StreamGuard in-process exactly as in `bench.lab.telemetry_cost` (setup `S`,
default `encode`: what the sidecar runs, against `off`), with `sys.settrace` counting every
bytecode executed, by function (`f_trace_opcodes`; the span processor's thread included).
Three runs per setup — no stream, 10 streams x 5 tokens, 10 x 105 — give per token (the
slope) and per stream (the rest), after one run of each setup for imports and first calls.

Counts, not time, and only the interpreter's: a bytecode costs a few to a few hundred
instructions, and the C behind a call (bytes methods, json, struct) is not counted here;
`bench.lab.instructions` and `bench.lab.telemetry_cost` count that. Deterministic (the same code
gives the same counts) and quick: the A/B tool for where telemetry's Python goes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from types import CodeType, FrameType
from typing import Any

from bench.lab.instructions import line
from bench.lab.telemetry_cost import SETUPS, run

Counts = Counter[tuple[str, str]]  # (file, qualified function name) -> bytecodes
Tracer = Callable[[FrameType, str, Any], Any]


def opcode_tracer(counts: Counter[Any], key: Callable[[CodeType], Hashable]) -> Tracer:
    """A `sys.settrace` function counting every bytecode executed into `counts`, under
    `key(code)` of the function it runs in."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[key(frame.f_code)] += 1
        return local

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    return call


def count(setup: str, streams: int, tokens: int, stamped: bool) -> Counts:
    """Bytecodes run by `bench.lab.telemetry_cost.run` for this setup and load."""
    counts: Counts = Counter()
    call = opcode_tracer(
        counts, lambda code: (code.co_filename.rsplit("/", 1)[-1], code.co_qualname)
    )
    sys.settrace(call)
    threading.settrace(call)
    try:
        asyncio.run(run(setup, streams, tokens, stamped))
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return counts


def rates(setup: str, stamped: bool) -> dict[tuple[str, str], tuple[float, float]]:
    """Per function: bytecodes per token and per stream."""
    count(setup, 1, 5, stamped)  # imports, compiled patterns, first calls
    none = count(setup, 0, 5, stamped)  # run() always makes one warm-up stream
    short = count(setup, 10, 5, stamped)
    long = count(setup, 10, 105, stamped)
    # Both loads less the warm-up stream `run()` adds to each (`none`): the same line.
    return {
        k: line(short[k] - none[k], long[k] - none[k], 10, 5, 105)
        for k in short.keys() | long.keys()
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab.bytecodes", description=__doc__)
    parser.add_argument("--setup", default="encode", choices=[s for s in SETUPS if s != "off"])
    parser.add_argument("--unstamped", action="store_true", help="vLLM's chunk shape")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    args = parser.parse_args()
    stamped = not args.unstamped
    on, off = rates(args.setup, stamped), rates("off", stamped)
    none = (0.0, 0.0)
    extra = {}
    for key in {*on, *off}:
        (token_on, stream_on), (token_off, stream_off) = on.get(key, none), off.get(key, none)
        extra[key] = (token_on - token_off, stream_on - stream_off)
    shape = "the emulator's stamped chunks" if stamped else "vLLM-shaped chunks"
    print(f"setup {args.setup} against off, {shape}: bytecodes added")
    for column, label in ((0, "per token"), (1, "per stream")):
        total = sum(v[column] for v in extra.values())
        print(f"\n{label}: {total:,.1f}\n| function | file | {label} |\n|---|---|---|")
        ranked = sorted(extra.items(), key=lambda kv: -abs(kv[1][column]))
        for (file, name), values in ranked[: args.top]:
            if round(values[column], 1):
                print(f"| {name} | {file} | {values[column]:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
