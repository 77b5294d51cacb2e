"""`python -m bench.lab.layers [--streams N] [LAYER,...]`: CPU instructions per short stream, layer
by layer, counted by callgrind: where a stream's fixed cost (the part every stream pays, and
all of the added time to first token) goes.

Each layer runs on the sidecar's own HTTP/1.1 server (uvicorn with the traffic protocol,
`tests.support.servers.serve(..., "sidecar")`) in a process of its own under callgrind,
instrumentation off until a warm-up is done, then on for N paced streams of two tokens
(`bench.loadgen`, 20 ms apart, vLLM's chunk shape):

- `bare`: a trivial ASGI app that answers every request with the same five SSE chunks —
  the server alone (accepting, parsing, the response head, five writes, the close);
- `proxy`: `ProxyApp` to the emulator, no guard — adds the upstream exchange and header rules;
- `guard`: the sidecar's app (StreamGuard in front of the proxy) with `--usage pass`;
- `force`: the same with `--usage force`, the sidecar's default.

The differences between layers are what each adds per stream. Telemetry is off. Takes about
a minute per layer; needs valgrind. Deterministic to a fraction of a percent: an A/B measure
for per-stream work, where `bench.lab.instructions` fits a line through two stream lengths
(its per-stream figure carries the per-token slope's error times the tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lab.instructions import callgrind_total, loadgen
from bench.targets import PY, ROOT, free_port, wait_port

LAYERS = ("bare", "proxy", "guard", "force")
_CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"emulator",'
    b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'
)


async def _bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for _ in range(4):
        await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def serve_layer(layer: str, upstream: int, port_file: Path) -> None:
    """Serve `layer` until killed; write the port to `port_file` once listening."""
    from middleware.registry import StreamRegistry
    from sidecar.app import build_guard
    from sidecar.config import load
    from sidecar.proxy import ProxyApp
    from tests.support.servers import serve

    usage = "pass" if layer == "guard" else "force"
    settings = load(["--upstream", f"http://127.0.0.1:{upstream}", "--usage", usage], environ={})
    app: Any = _bare
    if layer == "proxy":
        app = ProxyApp(settings.upstream)
    elif layer != "bare":
        app = build_guard(settings, StreamRegistry())
    async with serve(app, "sidecar") as port:
        port_file.write_text(str(port))  # noqa: ASYNC240 - a few bytes, once, before any load
        gc.collect()
        gc.freeze()  # as the sidecar does at start
        await asyncio.Event().wait()


def counted(layer: str, upstream: int, streams: int) -> int:
    """Instructions the server of `layer` ran for `streams` two-token streams."""
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        port_file, out = Path(tmp) / "port", Path(tmp) / "callgrind.out"
        env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        argv += [f"--callgrind-out-file={out}", PY, "-m", "bench.lab.layers"]
        argv += ["--serve", layer, str(upstream), str(port_file)]
        server = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 300
            while not (port_file.exists() and port_file.read_text()):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {layer} server did not start")
                time.sleep(0.1)
            port = int(port_file.read_text())
            # Warm-up: pools, caches, first calls, the paced path's included
            loadgen(port, 5, 2, 0, stamp=False)
            loadgen(port, 5, 2, 20, stamp=False)
            control = ["callgrind_control", "-i"]
            subprocess.run([*control, "on", str(server.pid)], check=True, capture_output=True)
            loadgen(port, streams, 2, 20, stamp=False)
            subprocess.run([*control, "off", str(server.pid)], check=True, capture_output=True)
        finally:
            server.terminate()
            server.wait(60)
        return callgrind_total(Path(tmp).glob("callgrind.out*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layers", nargs="?", default=",".join(LAYERS), help="comma-separated")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--serve", nargs=3, metavar=("LAYER", "UPSTREAM", "PORT_FILE"))
    args = parser.parse_args()
    if args.serve:  # the measured process (run under callgrind by `counted`)
        layer, upstream, port_file = args.serve
        import uvloop  # as the sidecar runs

        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(serve_layer(layer, int(upstream), Path(port_file)))
        return 0
    layers = [layer for layer in args.layers.split(",") if layer]
    if any(layer not in LAYERS for layer in layers) or args.streams < 1:
        parser.error(f"layers are some of {', '.join(LAYERS)}; streams >= 1")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    upstream = free_port()
    emulator = subprocess.Popen(
        [PY, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{upstream}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(upstream, emulator)
        previous = None
        for layer in layers:
            per_stream = counted(layer, upstream, args.streams) / args.streams
            added = "" if previous is None else f" ({per_stream - previous:+,.0f})"
            print(f"{layer}: {per_stream:,.0f} instructions per two-token stream{added}")
            previous = per_stream
    finally:
        emulator.kill()
        emulator.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
