"""`python -m bench.lab.instructions [--otel] [--streams N] [--tokens T,T2] [--flags F]`: CPU
instructions the sidecar spends per relayed token and per stream, counted by callgrind.

Wall-clock CPU on a shared machine moves by ±15% between runs; instruction counts do not
(the same code, input and environment give the same count within a fraction of a percent,
but for the cyclic collector: whether one of its passes lands in a load is chance, so the
figures are printed a second time without its passes), so this is the A/B measure for a
change to the hot path. User space only: the kernel's
share (about 10 µs per token for sidestream and nginx alike) is not counted.

Telemetry settings come from the environment as usual (e.g. `OTEL_TRACES_EXPORTER=none`
to count without spans). How: the emulator runs natively; the sidecar runs under `valgrind --tool=callgrind` with
instrumentation off until a warm-up is done, then on for one paced load (`bench.loadgen`,
N streams x T tokens, 20 ms apart, as scenario a); that is repeated for two values of T, and
the two totals give a line: instructions per token (slope) and per stream (intercept).
Telemetry folds a stream's chunk times every `gaps.TIMES_KEPT` (256) tokens, a step that a
stream shorter than that never takes: a pair of lengths on either side of it counts the
step in the slope. Give three lengths (`--tokens 100,200,300`) to see it: a line for each
consecutive pair.
`--flags` passes more sidecar flags, e.g. `--flags=--resume` (a Redis store is the
caller's to start: `--flags="--resume --resume-store redis://127.0.0.1:6390/0
--resume-secret-file /tmp/secret"`).
Needs valgrind (`apt-get install valgrind`). Takes about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from bench.targets import BSP_DELAY_S, PY, ROOT, free_port, wait_export, wait_port

DEFAULT_OTEL = {
    "OTEL_SDK_DISABLED": "false",
    "OTEL_TRACES_SAMPLER": "always_on",
    "OTEL_BSP_SCHEDULE_DELAY": "5000",
    "OTEL_METRIC_EXPORT_INTERVAL": "60000",
}


def callgrind_total(paths: Iterable[Path]) -> int:
    """Instructions counted in these callgrind output files (one per thread or process)."""
    return sum(
        int(m.group(1))
        for path in paths
        for m in re.finditer(r"^totals: (\d+)", path.read_text(), re.M)
    )


def line(a: float, b: float, streams: int, short: int, long: int) -> tuple[float, float]:
    """Per token (the slope) and per stream (the rest) from the totals `a` and `b` of two loads
    of `streams` streams, of `short` and `long` tokens each."""
    per_token = (b - a) / (streams * (long - short))
    return per_token, a / streams - short * per_token


def collector(paths: Iterable[Path]) -> int:
    """Instructions inside the cyclic collector's passes (`gc_collect_main`, what it calls
    included) in these callgrind output files. Whether a pass lands in a load is chance: one
    pass in one load and none in the other moves the per-stream figure by some 30k at 10
    streams (two checkouts of the same code gave 594k and 628k so), so it is shown apart."""
    total = 0
    for path in paths:
        argv = ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        # One row per source file the function's code comes from (inlined headers too).
        total += sum(
            int(m.group(1).replace(",", ""))
            for m in re.finditer(r"^\s*([\d,]+) .*:gc_collect_main\b", out, re.M)
        )
    return total


def loadgen(port: int, streams: int, tokens: int, itl_ms: float, stamp: bool = True) -> None:
    cfg = dict(port=port, concurrency=streams, streams=streams, tokens=tokens, itl_ms=itl_ms)
    cfg |= dict(stamp=stamp, stagger_s=itl_ms / 1000, start_at=0)
    subprocess.run(
        [PY, "-m", "bench.loadgen", json.dumps(cfg)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def counted(
    streams: int, tokens: int, otel: bool, stamp: bool, workdir: Path, flags: tuple[str, ...] = ()
) -> tuple[int, int]:
    """Instructions the sidecar executed during one paced load of streams x tokens, and
    how many of them were the cyclic collector's passes."""
    upstream, port, admin, sink = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        emulator = subprocess.Popen(
            [PY, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{upstream}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(emulator)
        if otel:
            procs.append(subprocess.Popen([PY, "-m", "bench.sink", str(sink)], cwd=ROOT))
            env = {**DEFAULT_OTEL, **env, "OTEL_SDK_DISABLED": "false"}
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink}"
        wait_port(upstream, emulator)
        out = workdir / f"callgrind.{tokens}.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        argv += [f"--callgrind-out-file={out}", PY, "-m", "sidecar"]
        argv += ["--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{upstream}"]
        argv += ["--admin-listen", f"127.0.0.1:{admin}", "--drain-timeout", "1", *flags]
        log = open(workdir / "sidecar.log", "ab")  # noqa: SIM115 - closed below
        sidecar = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)
        log.close()
        procs.append(sidecar)
        wait_port(port, sidecar, timeout=300)
        wait_port(admin, sidecar, timeout=60)
        # Warm-up: pools, caches, first-use imports, and the first calls of the paced path in
        # the measured chunk shape (left to the measured load, their one-time cost would be
        # counted per stream: about 100k instructions a stream at 10 streams)
        loadgen(port, 5, 20, 0, stamp)
        loadgen(port, 5, 5, 20, stamp)
        if otel:  # and the first export (the exporter's imports and connection), as in the bench
            wait_export(sink, 0, 60 * BSP_DELAY_S)  # callgrind runs the sidecar ~50x slower
        control = ["callgrind_control"]
        subprocess.run([*control, "-i", "on", str(sidecar.pid)], check=True, capture_output=True)
        loadgen(port, streams, tokens, 20, stamp)
        if otel:
            time.sleep(5.5)  # the span batch of these streams is exported in the window
        subprocess.run([*control, "-i", "off", str(sidecar.pid)], check=True, capture_output=True)
        sidecar.terminate()
        sidecar.wait(60)
        outputs = list(workdir.glob(f"callgrind.{tokens}.out*"))
        return callgrind_total(outputs), collector(outputs)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--otel", action="store_true", help="telemetry on (spans + metrics)")
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument(
        "--tokens", default="100,300", help="two or more stream lengths, T1,T2[,T3...]"
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the callgrind outputs here (for callgrind_annotate)"
    )
    parser.add_argument(
        "--unstamped",
        action="store_true",
        help="chunks without the per-chunk timestamp (a constant tail, as vLLM sends)",
    )
    parser.add_argument("--flags", default="", help="more sidecar flags, e.g. --flags=--resume")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    lengths = [int(t) for t in args.tokens.split(",")]
    if len(lengths) < 2 or lengths != sorted(set(lengths)) or lengths[0] < 1:
        parser.error("--tokens: two or more distinct stream lengths, ascending")
    flags = tuple(shlex.split(args.flags))
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        totals = [
            counted(args.streams, tokens, args.otel, not args.unstamped, workdir, flags)
            for tokens in lengths
        ]
    mode = ("telemetry on" if args.otel else "telemetry off") + (f", {args.flags}" if flags else "")
    for (short, (a, gc_a)), (long, (b, gc_b)) in itertools.pairwise(
        zip(lengths, totals, strict=True)
    ):
        pair = f" ({short} and {long} tokens)" if len(lengths) > 2 else ""
        per_token, per_stream = line(a, b, args.streams, short, long)
        print(
            f"sidecar, {mode}{pair}: {per_token:,.0f} instructions per token, "
            f"{per_stream:,.0f} per stream"
        )
        per_token, per_stream = line(a - gc_a, b - gc_b, args.streams, short, long)
        print(
            f"  without the collector's passes ({gc_a:,} and {gc_b:,} of the two loads): "
            f"{per_token:,.0f} per token, {per_stream:,.0f} per stream"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
