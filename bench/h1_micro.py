"""Micro-benchmark of the proxy's HTTP/1.1 upstream path: proxy CPU per 100k relayed tokens.

The emulator (uvicorn + uvloop + httptools) streams 64 chat completions x 1000 tokens at
itl_ms 0 (by default) through `ProxyApp` (no guard), served by uvicorn in its own process
pinned to one core; a raw asyncio client reads the streams. The proxy's CPU (utime + stime from
/proc/PID/stat) over the run, divided by the tokens relayed, is the figure.

    .venv/bin/python bench/h1_micro.py                      # this tree
    .venv/bin/python bench/h1_micro.py --old-ref a9cd6d5    # and that commit's code
    .venv/bin/python bench/h1_micro.py --old-ref a9cd6d5 --nginx --reps 2
    .venv/bin/python bench/h1_micro.py --old-ref a9cd6d5 --nginx --tokens 100 --itl-ms 20

`--old-ref` runs the proxy from `git archive REF` (the httpcore pool before sidecar.upstream.h1);
`--nginx` adds nginx (1 worker, proxy_buffering off, upstream keep-alive) for scale.
Not a test, and short: the machine may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
Popen = subprocess.Popen[bytes]
STREAMS = 64
TOKENS = 1000
BODY = b'{"model":"emulator","messages":[{"role":"user","content":"hi"}],"stream":true}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"X-Emulator-TTFT-Ms: 0\r\nX-Emulator-ITL-Ms: %b\r\nX-Emulator-Tokens: %d\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
NGINX_CONF = """
worker_processes 1; worker_cpu_affinity {mask}; daemon off; pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {dir}; proxy_temp_path {dir};
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_buffering off;
                  proxy_set_header Connection ""; }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_emulator(port: int, cpu: int) -> None:
    import uvicorn

    from sidecar.emulator import Stats, make_app

    os.sched_setaffinity(0, {cpu})
    app = make_app(stats=Stats())
    uvicorn.run(app, port=port, loop="uvloop", http="httptools", log_level="warning")


def serve_proxy(port: int, upstream: int, cpu: int) -> None:
    import uvicorn

    from sidecar.proxy import ProxyApp
    from sidecar.upstream.types import Upstream

    os.sched_setaffinity(0, {cpu})
    app = ProxyApp(Upstream.parse(f"http://127.0.0.1:{upstream}"))
    uvicorn.run(app, port=port, loop="uvloop", http="httptools", log_level="warning")


class _Stream(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[int]) -> None:
        self.done = done
        self.bytes = 0
        self.tail = b""

    def data_received(self, data: bytes) -> None:
        self.bytes += len(data)
        self.tail = (self.tail + data)[-8:]
        if self.tail.endswith(b"\r\n0\r\n\r\n") and not self.done.done():
            self.done.set_result(self.bytes)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("closed early"))


async def stream(port: int, tokens: int, itl_ms: bytes = b"0") -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _Stream(done), "127.0.0.1", port)
    transport.write(REQUEST % (itl_ms, tokens, len(BODY), BODY))
    try:
        return await asyncio.wait_for(done, 60)
    finally:
        transport.close()


async def wait_listening(port: int) -> None:
    for _ in range(500):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        return
    raise TimeoutError(f"nothing listens on {port}")


async def measure(port: int, pid: int, tokens: int, itl_ms: str) -> tuple[float, float]:
    """(proxy CPU seconds per 100k tokens, wall seconds) for one run of 64 streams."""
    await wait_listening(port)
    await asyncio.gather(*(stream(port, 50) for _ in range(8)))  # warm up
    before, started = cpu_seconds(pid), time.monotonic()
    itl = itl_ms.encode()
    sizes = await asyncio.gather(*(stream(port, tokens, itl) for _ in range(STREAMS)))
    cpu, wall = cpu_seconds(pid) - before, time.monotonic() - started
    assert all(size > tokens * 100 for size in sizes), sizes
    return cpu / (STREAMS * tokens) * 100_000, wall


def spawn(*args: str, env: dict[str, str] | None = None) -> Popen:
    return subprocess.Popen([sys.executable, __file__, *args], env=env, cwd=ROOT)


def start_nginx(directory: str, port: int, upstream: int, cpu: int) -> tuple[Popen, int]:
    conf = Path(directory, "nginx.conf")
    mask = format(1 << cpu, "b")
    conf.write_text(NGINX_CONF.format(dir=directory, port=port, upstream=upstream, mask=mask))
    master = subprocess.Popen(["nginx", "-c", str(conf), "-p", directory])
    for _ in range(500):
        children = Path(f"/proc/{master.pid}/task/{master.pid}/children")
        if children.exists() and children.read_text().split():
            return master, int(children.read_text().split()[0])
        time.sleep(0.01)
    raise RuntimeError("nginx did not start its worker")


def run(
    target: str, old_dir: str | None, upstream: int, tokens: int, itl_ms: str
) -> tuple[float, float]:
    port = free_port()
    if target == "nginx":
        with tempfile.TemporaryDirectory() as directory:
            master, worker = start_nginx(directory, port, upstream, cpu=1)
            try:
                return asyncio.run(measure(port, worker, tokens, itl_ms))
            finally:
                master.terminate()
                master.wait()
    env = dict(os.environ)
    if target == "old":
        assert old_dir is not None
        env["PYTHONPATH"] = old_dir
    proxy = spawn("proxy", str(port), str(upstream), "1", env=env)
    try:
        return asyncio.run(measure(port, proxy.pid, tokens, itl_ms))
    finally:
        proxy.terminate()
        proxy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old-ref", help="also run the proxy code of this git commit")
    parser.add_argument("--nginx", action="store_true", help="also run nginx (if installed)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=TOKENS, help="per stream (1000)")
    parser.add_argument("--itl-ms", default="0", help="between tokens (0: as fast as it can)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("note: fewer than 2 cores; the proxy shares a core with the emulator")
    targets = ["new"]
    with tempfile.TemporaryDirectory() as old_dir:
        if args.old_ref:
            archive = subprocess.run(
                ["git", "archive", args.old_ref, "sidecar", "middleware"],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            subprocess.run(["tar", "-x", "-C", old_dir], input=archive.stdout, check=True)
            targets.insert(0, "old")
        if args.nginx:
            targets.append("nginx")
        upstream = free_port()
        emulator = spawn("emulator", str(upstream), "0")
        asyncio.run(wait_listening(upstream))
        results: dict[str, list[tuple[float, float]]] = {t: [] for t in targets}
        try:
            for rep in range(args.reps):
                for target in targets[rep % len(targets) :] + targets[: rep % len(targets)]:
                    result = run(target, old_dir, upstream, args.tokens, args.itl_ms)
                    results[target].append(result)
        finally:
            emulator.terminate()
            emulator.wait()
    print(f"{STREAMS} streams x {args.tokens} tokens, itl {args.itl_ms} ms, proxy on CPU 1")
    print("| target | CPU s / 100k tokens | wall s | tokens/s |")
    print("|---|---|---|---|")
    for target, runs in results.items():
        for cpu, wall in runs:
            rate = STREAMS * args.tokens / wall
            print(f"| {target} | {cpu:.3f} | {wall:.2f} | {rate:,.0f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "emulator":
        serve_emulator(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "proxy":
        serve_proxy(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
