"""`python -m bench.resume_scale`: how far one Redis goes as the resume store (#50 item 4).

One `redis-server` (its own directory, no persistence) and two sidecars with `--resume` on
it, each in front of its own emulator, on 127.0.0.1. Then a ramp of concurrent resumable
streams (`--streams`, default 200,500,1000), split evenly between the two sidecars and paced
like scenario a (`--tokens` a stream, one every `--itl-ms`). Each step reports:

- Redis commands per token: the calls in `INFO commandstats` during the step (the bench's own
  INFO, MEMORY, SCAN left out) over the tokens relayed. Redis counts a script's inner calls
  too: each appended event is one `XADD`, inside an `EVAL` that carries a whole batch;
- bytes per stream in Redis: `used_memory`, highest during the step, minus before it, over
  the streams. A finished stream stays `--resume-ttl` (600 s), so this is what Redis holds
  for each stream started in the last ten minutes;
- redis-server's CPU per 100k tokens (its utime + stime, `/proc/<pid>/stat`) and what
  the two sidecars used beside it;
- the streams one Redis core would carry at this pace: a stream sends 1000 / itl_ms tokens a
  second, each costing Redis `cpu_per_token` seconds, so `streams = 1 / (cpu_per_token x
  1000 / itl_ms)`. Redis runs commands on one thread: that core is its ceiling.

The ramp stops after a step whose p99 token latency passes `--max-p99-ms`: the machine no
longer drives more. Last, one stream long enough to pass the default `--resume-max-bytes`
shows `MEMORY USAGE` of a stream's keys at the default limits. The report (markdown, the raw
figures as JSON at its end) goes to `bench/results/<timestamp>-resume-scale.md`.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.procstat import Periodic, cpu_seconds, tree
from bench.run import machine
from bench.scenarios import loadgen, pct
from bench.targets import LOAD_CORES, PY, ROOT, Session, free_port, wait_port, warm_up
from middleware.resume.redis_keys import PREFIX, REPLICA

OWN = {"hello", "info", "memory|usage", "scan", "xlen", "ping", "config|get", "dbsize"}
LONG_TOKENS = 8000  # events of ~200 bytes: past the default 1 MiB a stream keeps


class Rig:
    """The processes: redis-server, two emulators, two sidecars (fresh, in a temp dir)."""

    def __init__(self, workdir: Path) -> None:
        self.session = Session("resume-scale", workdir, 0)
        self.ports: list[int] = []
        self.sidecars: list[int] = []  # their pids

    def start(self) -> None:
        """The store as `sidestream+redis` has it, then each emulator and its sidecar, as a
        bench target's (`Session.start_sidestream`), telemetry off."""
        s = self.session
        store = s.redis_store()
        assert s.store is not None
        self.redis_proc = s.store
        self.redis = redis.Redis.from_url(store[1])
        for i in range(2):
            s.upstream_port = free_port()
            emulator = s.spawn(
                f"emulator{i}",
                [PY, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{s.upstream_port}"],
                LOAD_CORES,
            )
            wait_port(s.upstream_port, emulator)
            s.port = free_port()
            sidecar = s.start_sidestream(flags=("--resume", *store))
            wait_port(s.port, sidecar)
            warm_up(s.port)
            self.ports.append(s.port)
            self.sidecars.append(sidecar.pid)

    def sidecar_cpu(self) -> float:
        return cpu_seconds([pid for root in self.sidecars for pid in tree(root)])

    def redis_cpu(self) -> float:
        return cpu_seconds([self.redis_proc.pid])


def calls(r: redis.Redis) -> dict[str, int]:
    """Calls per command so far (`INFO commandstats`), the bench's own left out."""
    stats: dict[str, Any] = r.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {k: v for k, v in out.items() if k not in OWN}


class MemoryPeak(Periodic):
    """`used_memory`'s highest value, sampled on a thread while a step runs."""

    def __init__(self, port: int) -> None:
        super().__init__(0.1)
        self.r = redis.Redis(port=port)  # its own client: the thread's
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, int(self.r.info("memory")["used_memory"]))


def stream_keys(r: redis.Redis) -> set[str]:
    """The stream keys (not meta, reader or liveness keys) now in Redis."""
    names = (key.decode() for key in r.scan_iter(match=PREFIX + "*", count=1000))
    return {k for k in names if not k.startswith(REPLICA) and not k.endswith((":m", ":r"))}


def usage(r: redis.Redis, key: str) -> dict[str, int]:
    """MEMORY USAGE of a stream's keys (every entry counted), and its entry count."""
    stream = int(r.memory_usage(key, samples=0) or 0)
    meta = int(r.memory_usage(key + ":m", samples=0) or 0)
    return {"stream_bytes": stream, "meta_bytes": meta, "entries": int(r.xlen(key))}


def step(rig: Rig, streams: int, tokens: int, itl_ms: float) -> dict[str, Any]:
    """One step of the ramp: `streams` at once, half through each sidecar."""
    r = rig.redis
    halves = [streams // 2 + streams % 2, streams // 2]
    cfg = dict(tokens=tokens, itl_ms=itl_ms, stamp="content")
    cfg["stagger_s"] = max(itl_ms / 1000, streams / 2000)  # a connect burst is not the point
    cfgs = [
        dict(cfg, concurrency=n, streams=n, ports=[port])
        for n, port in zip(halves, rig.ports, strict=True)
        if n
    ]
    keys0 = stream_keys(r)
    memory0, calls0 = int(r.info("memory")["used_memory"]), calls(r)
    net0 = int(r.info("stats")["total_net_input_bytes"])
    redis0, sidecars0, t0 = rig.redis_cpu(), rig.sidecar_cpu(), time.monotonic()
    with MemoryPeak(rig.redis.connection_pool.connection_kwargs["port"]) as peak:
        results = loadgen(rig.ports[0], cfgs, timeout=tokens * itl_ms / 1000 * 10 + 60)
        time.sleep(0.2)  # the last batch of appends is written (one flush: 20 ms)
    wall = time.monotonic() - t0
    redis_cpu, sidecars_cpu = rig.redis_cpu() - redis0, rig.sidecar_cpu() - sidecars0
    memory = max(peak.peak, int(r.info("memory")["used_memory"])) - memory0
    net = int(r.info("stats")["total_net_input_bytes"]) - net0
    after = calls(r)
    delta = {k: v - calls0.get(k, 0) for k, v in after.items() if v - calls0.get(k, 0)}
    records = [rec for res in results for rec in res["streams"]]
    got = sum(rec[1] for rec in records)
    ms = [ns / 1e6 for res in results for ns in res["latencies_ns"]]
    keys = sorted(stream_keys(r) - keys0)  # this step's: one of them is shown
    return {
        "streams": streams,
        "tokens_per_stream": tokens,
        "itl_ms": itl_ms,
        "tokens": got,
        "streams_whole": sum(rec[1] == tokens and rec[3] == 1 for rec in records),
        "wall_s": wall,
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "commands": delta,
        "commands_per_token": sum(delta.values()) / got if got else math.nan,
        "redis_in_bytes_per_token": net / got if got else math.nan,
        "bytes_per_stream": memory / streams,
        "redis_cpu_100k": redis_cpu / got * 1e5 if got else math.nan,
        "sidecars_cpu_100k": sidecars_cpu / got * 1e5 if got else math.nan,
        "saturating_streams": itl_ms / 1000 / (redis_cpu / got) if got and redis_cpu else math.inf,
        "one_stream": usage(r, keys[0]) if keys else {},
    }


def long_stream(port: int, r: redis.Redis, tokens: int = LONG_TOKENS) -> dict[str, int]:
    """One stream of `tokens` unpaced through a sidecar, then what Redis holds for it."""
    body = b'{"model":"emulator","messages":[{"role":"user","content":"hi"}],"stream":true}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nX-Emulator-TTFT-Ms: 0\r\nX-Emulator-ITL-Ms: 0\r\n"
        b"X-Emulator-Tokens: %d\r\nContent-Length: %d\r\n\r\n" % (tokens, len(body))
    )
    data = bytearray()
    with socket.create_connection(("127.0.0.1", port), 60) as s:
        s.sendall(request + body)
        while chunk := s.recv(1 << 16):
            data += chunk
    head = bytes(data[: data.index(b"\r\n\r\n")]).decode("latin-1").split("\r\n")
    named = [line.split(":", 1) for line in head[1:]]
    stream_id = next(v.strip() for k, v in named if k.lower() == "sidestream-stream-id")
    key = PREFIX + stream_id
    deadline = time.monotonic() + 10
    while True:  # its end is written a flush after the client saw it
        last: Any = r.xrevrange(key, count=1)
        if last and b"end" in last[0][1]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the long stream's end never reached Redis ({key})")
        time.sleep(0.05)
    return {"tokens": tokens, **usage(r, key)}


def report(steps: list[dict[str, Any]], long: dict[str, int], note: str) -> str:
    rows = [
        "| streams | tokens | whole streams | p50 / p99 ms | Redis commands per token "
        "| bytes into Redis per token | bytes per stream in Redis | redis-server CPU s per 100k "
        "tokens | sidecars' CPU s per 100k tokens | streams one Redis core carries |",
        "|---" * 10 + "|",
    ]
    for f in steps:
        rows.append(
            f"| {f['streams']:,} | {f['tokens']:,} | {f['streams_whole']:,} "
            f"| {f['p50_ms']:.1f} / {f['p99_ms']:.1f} | {f['commands_per_token']:.3f} "
            f"| {f['redis_in_bytes_per_token']:.0f} | {f['bytes_per_stream']:,.0f} "
            f"| {f['redis_cpu_100k']:.3f} | {f['sidecars_cpu_100k']:.2f} "
            f"| {f['saturating_streams']:,.0f} |"
        )
    last = steps[-1]
    per_token = {k: round(v / last["tokens"], 4) for k, v in sorted(last["commands"].items())}
    lines = [
        f"# resume on one Redis — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        note,
        "\n".join(rows),
        f"Commands per token at {last['streams']:,} streams, by command: {per_token}.",
        "Streams one Redis core carries = 1 / (redis-server CPU s per token x tokens a second "
        f"per stream), at {1000 / last['itl_ms']:g} tokens a second per stream.",
        f"One stream of {last['tokens_per_stream']} tokens in Redis: {last['one_stream']}. "
        f"One stream of {long['tokens']:,} tokens at the default limits (1 MiB kept): {long}.",
        "```json\n" + json.dumps({"steps": steps, "long_stream": long}, indent=1) + "\n```",
    ]
    return "\n\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--streams", default="200,500,1000", help="the ramp (default 200,500,1000)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens a stream (default 200)")
    parser.add_argument("--itl-ms", type=float, default=20, help="ms between tokens (default 20)")
    parser.add_argument("--max-p99-ms", type=float, default=100, help="stop the ramp past it")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="directory")
    args = parser.parse_args(argv)
    try:
        ramp = [int(n) for n in args.streams.split(",")]
    except ValueError:
        parser.error("--streams: comma-separated stream counts, e.g. 200,500,1000")
    if not ramp or min(ramp) < 1 or max(ramp) > 20000 or args.tokens < 2 or args.itl_ms <= 0:
        parser.error("streams 1 to 20000 each, tokens >= 2, itl-ms > 0")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="bench-resume-scale-") as workdir:
        rig = Rig(Path(workdir))
        try:
            rig.start()
            steps = []
            for n in ramp:
                steps.append(step(rig, n, args.tokens, args.itl_ms))
                f = steps[-1]
                print(f"{n} streams: {f['commands_per_token']:.3f} commands/token, "
                      f"{f['redis_cpu_100k']:.3f} s Redis CPU per 100k tokens, "
                      f"p99 {f['p99_ms']:.1f} ms", flush=True)  # fmt: skip
                if f["p99_ms"] > args.max_p99_ms:
                    print(f"p99 past {args.max_p99_ms:g} ms: the ramp stops here", flush=True)
                    break
            long = long_stream(rig.ports[0], rig.redis)
        except (RuntimeError, OSError, redis.RedisError) as exc:
            print(f"bench.resume_scale: {exc}", file=sys.stderr)
            for log in sorted(Path(workdir).glob("*.log")):  # gone with the directory
                print(f"--- {log.name}:\n{log.read_text()[-2000:]}", file=sys.stderr)
            return 1
        finally:
            rig.session.stop()
    note = (
        f"Machine: {machine()}; redis-server {redis_version()}. Two sidecars "
        f"(`--resume --resume-store redis://…`, default limits), streams split evenly. "
        f"Command: `{' '.join(['python -m bench.resume_scale', *(argv or sys.argv[1:])])}`."
    )
    text = report(steps, long, note)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-resume-scale.md"
    out.write_text(text)
    print("\n" + text + f"\n(written to {out})")
    return 0


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return out.split()[2].removeprefix("v=")


if __name__ == "__main__":
    sys.exit(main())
