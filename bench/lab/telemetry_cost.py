"""`python -m bench.lab.telemetry_cost [--sinks]`: what each part of telemetry costs, in CPU
instructions.

`bench.lab.instructions` counts the whole sidecar; this splits telemetry's share. Streams of
OpenAI chat chunks (the emulator's stamped shape, or vLLM's with `--unstamped`) go through
StreamGuard in-process — request body read, role chunk, tokens through the `send_nowait`
path the sidecar uses, finish + usage + [DONE] — under callgrind, in these setups:

- `off`: no telemetry;
- `record`: telemetry without spans (sidestream's own record, metrics, access log);
- `span`: plus a direct span per stream (`telemetry_direct`), handed to a BatchSpanProcessor
  whose exporter drops it;
- `encode`: plus sidestream's OTLP exporter (`telemetry_otlp`) with an HTTP client that sends
  nothing: spans written in OTLP at their end and batched, what the sidecar does;
- `sdk-span`: the same with SDK spans (`Telemetry(tracer_provider=...)`), for comparison;
- `sdk-encode`: SDK spans and the SDK's own encoder.

With `--sinks`, each sink's share as the sidecar ships them (`encode`'s exporter) instead:
`off`, then `none` (the record and its summary, no sink: `SIDESTREAM_TELEMETRY_SINKS=none`),
`span`, `metrics`, `access` (that sink alone) and `all`.

Each is run for two stream counts and two stream lengths, so the counts give instructions
per token (the slope) and per stream (the rest); differences between setups are the cost of
each part. The cyclic collector's passes are left out and the hash seed is fixed, so a
setup's per-stream figure repeats to a fraction of a percent; per token still moves by a
few hundred (the gaps' sort meets the clock's own values). The HTTP export itself is not
included (about 0.17 M instructions per span in batches of 50, measured against
`bench.sink`). Needs valgrind; takes about two minutes (`--sinks`: about as long).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lab.instructions import callgrind_total, collector
from bench.targets import PY, ROOT
from sidecar.emulator.frames import DONE, END, STAMP_END, Frames
from sidecar.emulator.plan import Headers, plan_post
from sidecar.emulator.text import token_cycle

SETUPS = ("off", "record", "span", "encode", "sdk-span", "sdk-encode")
# `--sinks`: the sidecar's exporter (`encode`) with these sinks (`Telemetry(sinks=...)`).
SINK_SETUPS = {
    "none": (),
    "span": ("span",),
    "metrics": ("metrics",),
    "access": ("access",),
    "all": ("span", "metrics", "access"),
}
REQUEST = json.dumps(
    {
        "model": "emulator",
        "stream": True,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "hello"}],
    }
).encode()


def frames(stamped: bool) -> tuple[Frames, list[bytes]]:
    """The emulator's frames for one chat stream, and 64 distinct token chunks in its exact
    shape (with its stamp, as in the benchmark, each tail differs)."""
    plan = plan_post("chat", REQUEST, Headers())
    made = Frames(plan)
    _, tokens = token_cycle(plan.text)
    return made, [
        made.head
        + tokens[i % len(tokens)]
        + made.tail
        + (STAMP_END % (1764600000000 + i) if stamped else END)
        for i in range(64)
    ]


class Unsent:
    """An OTLP exporter's HTTP client that sends nothing and succeeds."""

    success = True

    def export(self, data: bytes) -> Any:
        return self

    def shutdown(self) -> None:
        pass


def telemetry(setup: str) -> Any:
    """The Telemetry of `setup` (None for off); spans go to a processor that drops them."""
    if setup == "off":
        return None
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from middleware.telemetry import Telemetry, configure_access_log
    from middleware.telemetry.otlp import encode_spans

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            if setup == "sdk-span":
                encode_spans(spans)
            elif setup == "sdk-encode":
                sdk(spans).SerializePartialToString()
            return SpanExportResult.SUCCESS

    configure_access_log(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the run
    readers = [InMemoryMetricReader()]
    if setup == "record":
        return Telemetry(metric_readers=readers)
    sinks = SINK_SETUPS.get(setup, ("span", "metrics", "access"))
    exporter: SpanExporter = Dropping()
    if (
        setup == "encode" or setup in SINK_SETUPS
    ):  # the sidecar's exporter, its HTTP client one that sends nothing
        from middleware.telemetry.otlp import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
        exporter._client = Unsent()  # type: ignore[assignment]
    processor = BatchSpanProcessor(exporter, max_queue_size=100_000, schedule_delay_millis=600_000)
    if setup.startswith("sdk-"):
        provider = TracerProvider()
        provider.add_span_processor(processor)
        return Telemetry(tracer_provider=provider, metric_readers=readers)
    return Telemetry(span_processor=processor, metric_readers=readers, sinks=sinks)


async def run(setup: str, streams: int, tokens: int, stamped: bool) -> None:
    """One warm-up stream, then `streams` streams of `tokens` tokens (the counted part)."""
    from middleware.guard import StreamGuard
    from middleware.types import SEND_NOWAIT

    made, bodies = frames(stamped)
    assert made.role is not None
    role = made.role
    end = made.finish("stop") + made.usage(9, tokens) + DONE

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": role, "more_body": True})
        await send({"type": "http.response.body", "body": bodies[0], "more_body": True})
        nowait = scope["extensions"][SEND_NOWAIT]["send"]
        for i in range(1, tokens):
            nowait(bodies[i & 63])
        await send({"type": "http.response.body", "body": end, "more_body": False})

    tel = telemetry(setup)
    guard = StreamGuard(app, telemetry=tel)
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"user-agent", b"bench/1"),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(REQUEST)),
    ]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": REQUEST, "more_body": False}

    async def send(message: Any) -> None:
        pass

    async def stream() -> None:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": headers,
            "scheme": "http",
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "extensions": {SEND_NOWAIT: {"send": lambda body: True}},
        }
        await guard(scope, receive, send)

    await stream()
    gc.collect()
    gc.freeze()  # as the sidecar does at start
    for _ in range(streams):
        await stream()
    if tel is not None and tel.tracer_provider is not None:
        tel.tracer_provider.force_flush()
    logging.shutdown()


def counted(setup: str, streams: int, tokens: int, stamped: bool, workdir: Path) -> int:
    """Instructions of one run, the cyclic collector's passes left out: whether one lands in
    a run is chance (see `instructions.collector`), and one moves a per-token figure by
    hundreds of instructions."""
    out = workdir / f"{setup}.{streams}.{tokens}.out"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    argv += [PY, "-m", "bench.lab.telemetry_cost", "--child", setup, str(streams), str(tokens)]
    argv += [] if stamped else ["--unstamped"]
    # One hash seed for every run: string hashes move dict and set layouts, and with them
    # the count of a run by hundreds of instructions a token.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
    return callgrind_total([out]) - collector([out])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unstamped", action="store_true", help="vLLM's chunk shape")
    parser.add_argument("--sinks", action="store_true", help="each sink's share instead")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setup, streams, tokens = args.child
        asyncio.run(run(setup, int(streams), int(tokens), not args.unstamped))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    stamped = not args.unstamped
    print(f"{'setup':<11} {'per token':>10} {'per stream':>11}   (instructions)")
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        for setup in ("off", *SINK_SETUPS) if args.sinks else SETUPS:
            # streams x tokens: (10, 5) (60, 5) (10, 105) -> per stream and per token
            base = counted(setup, 10, 5, stamped, Path(tmp))
            more = counted(setup, 60, 5, stamped, Path(tmp))
            longer = counted(setup, 10, 105, stamped, Path(tmp))
            per_token = (longer - base) / (10 * 100)
            per_stream = (more - base) / 50 - 5 * per_token
            print(f"{setup:<11} {per_token:>10,.0f} {per_stream:>11,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
