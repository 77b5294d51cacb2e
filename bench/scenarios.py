"""The five scenarios, each run against one live `Session`; each returns a flat dict of figures.

a. paced: 50 streams x 200 tokens at 20 ms — per-token one-way latency, CPU per 100k tokens.
b. flood: 64 streams, tokens as fast as the emulator sends — tokens/s, CPU per 100k tokens.
c. idle: N open streams, one token every 5 s — all open and flowing? RSS per stream.
d. cancel: clients close after 10 of 1,000 tokens — delay until the emulator sees the close.
e. connect: sequential new connections, one token each — TTFT.

CPU is the proxy tree's CPU time (`procstat.cpu_seconds`) across the load run (the proxy
idles before and after), and with telemetry on also the span exporter's next batch after
it (`Session.settle_s`). A target's store (sidestream+redis: its redis-server) is not in
that tree: scenario a reports its CPU apart, read the same way (`a_store_cpu_100k`).
Latency and TTFT are absolute here; `report` subtracts `direct` within the same repetition.
The emulator stamps each token's send time into its text (`stamp="content"`), so the chunks
have vLLM's shape: they differ only in their content. `paced(..., stamp="tail")` measures
the other shape, a top-level field after the choices that differs per chunk (OpenAI's
obfuscation pad has that shape), which telemetry's token check takes a longer path for.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from typing import Any

from bench.procstat import Sampler, cpu_seconds, memory_kb
from bench.targets import LOAD_CORES, PY, ROOT, Session, fetch, pin

Figures = dict[str, Any]
FLOOD_STREAMS, FLOOD_S = 64, 3.0  # scenario b's streams and seconds (the full run's)


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def loadgen(port: int, cfgs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Run one load generator process per config, started together; their JSON results."""
    start_at = time.monotonic() + 0.5
    procs = [
        subprocess.Popen(
            [PY, "-m", "bench.loadgen", json.dumps({**cfg, "port": port, "start_at": start_at})],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            preexec_fn=pin(LOAD_CORES),
        )
        for cfg in cfgs
    ]
    results = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"load generator timed out after {timeout:.0f}s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed ({proc.returncode})")
        results.append(json.loads(out))
    return results


def _streams(s: Session, cfg: dict[str, Any], timeout: float) -> tuple[list[Any], list[int], float]:
    pids = s.pids()
    cpu0 = cpu_seconds(pids)
    (result,) = loadgen(s.port, [cfg], timeout)
    time.sleep(s.settle_s)  # telemetry on: the spans of these streams are exported by now
    cpu = cpu_seconds(pids) - cpu0 if pids else math.nan
    return result["streams"], result["latencies_ns"], cpu


def paced(
    s: Session, streams: int = 50, tokens: int = 200, itl_ms: float = 20, stamp: str = "content"
) -> Figures:
    cfg = dict(concurrency=streams, streams=streams, tokens=tokens, itl_ms=itl_ms, stamp=stamp)
    cfg["stagger_s"] = itl_ms / 1000
    store = [s.store.pid] if s.store is not None else []
    store_cpu = cpu_seconds(store)
    records, lat, cpu = _streams(s, cfg, timeout=tokens * itl_ms / 1000 + 60)
    store_cpu = cpu_seconds(store) - store_cpu
    got = sum(r[1] for r in records)
    ms = [x / 1e6 for x in lat]
    figures = {
        "a_p50_ms": pct(ms, 50),
        "a_p99_ms": pct(ms, 99),
        "a_tokens": got,
        "a_completed": sum(r[3] for r in records),
        "a_cpu_100k": cpu / got * 1e5 if got else math.nan,
    }
    if store:
        figures["a_store_cpu_100k"] = store_cpu / got * 1e5 if got else math.nan
    return figures


def flood(s: Session, duration: float = FLOOD_S, streams: int = FLOOD_STREAMS) -> Figures:
    cfg = dict(concurrency=streams, duration=duration, tokens=20000, itl_ms=0)
    records, _, cpu = _streams(s, cfg, timeout=duration + 60)
    got = sum(r[1] for r in records)
    return {
        "b_tokens_s": got / duration,
        "b_cpu_100k": cpu / got * 1e5 if got else math.nan,
    }


def idle(s: Session, n: int, hold_s: float = 5.5, rate: float = 3000.0) -> Figures:
    procs = max(1, math.ceil(n / 3000))
    share = [n // procs + (i < n % procs) for i in range(procs)]
    cfgs = [
        dict(mode="hold", concurrency=k, rate=rate / procs, hold_s=hold_s, tokens=100)
        | dict(ttft_ms=0, itl_ms=5000)
        for k in share
    ]
    pids = s.pids()
    base_rss, _ = memory_kb(pids)
    with Sampler(pids) as sampler:
        results = loadgen(s.port, cfgs, timeout=n / rate + hold_s + 60)
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    peak = sampler.peak
    prefix = f"c{n}"
    return {
        f"{prefix}_open": sum(r["open"] for r in results),
        f"{prefix}_flowing": sum(r["flowing"] for r in results),
        f"{prefix}_ramp_s": max(r["ramp_s"] for r in results),
        f"{prefix}_all_flowing_s": max(r["all_flowing_s"] for r in results),
        f"{prefix}_rss_per_stream_kb": (peak.rss_kb - base_rss) / n if pids else math.nan,
        f"{prefix}_hwm_mb": peak.hwm_kb / 1024 if pids else math.nan,
        f"{prefix}_fds": peak.fds if pids else math.nan,
        f"{prefix}_errors": errors,
    }


def _emulator_stats(s: Session) -> dict[str, Any]:
    return dict(json.loads(fetch(s.upstream_port, "/debug/stats")))


def _quiet(s: Session, timeout: float = 10.0) -> dict[str, Any]:
    """Emulator stats once no stream is active (earlier scenarios' streams have ended)."""
    deadline = time.monotonic() + timeout
    while (stats := _emulator_stats(s))["streams_active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return stats


def cancel(s: Session, streams: int = 100, spacing_s: float = 0.015) -> Figures:
    before = _quiet(s)
    t0 = before["now"]
    cfg: dict[str, Any] = dict(concurrency=streams, streams=streams, tokens=1000, itl_ms=10)
    cfg |= dict(close_after=10, stagger_s=streams * spacing_s)
    records, _, _ = _streams(s, cfg, timeout=streams * spacing_s + 60)
    closes = sorted(r[4] for r in records if r[4])
    deadline = time.monotonic() + 3.0
    while True:
        after = _emulator_stats(s)
        cancelled = after["streams_cancelled"] - before["streams_cancelled"]
        if cancelled >= len(closes) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    seen = sorted(t for t in after["cancel_times"] if t > t0)
    delays = [(b - a) * 1000 for a, b in zip(closes, seen, strict=False)]
    started = after["streams_started"] - before["streams_started"]
    return {
        "d_p50_ms": pct(delays, 50),
        "d_p99_ms": pct(delays, 99),
        "d_closed": len(closes),
        "d_upstream_saw": cancelled,
        "d_ran_on": started - cancelled,  # still streaming upstream, or ran to the end
    }


def _idle_proxy(s: Session, timeout: float = 45.0, share: float = 0.05) -> None:
    """Wait until the proxy uses under `share` of a core over 0.2 s: with resume on, the
    flood's streams have left the emulator's sockets long before the proxy has taken in what
    they sent (a few seconds' work, which new streams' first tokens otherwise queue behind)."""
    pids = s.pids()
    if not pids:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pids)
        time.sleep(0.2)
        if cpu_seconds(pids) - before < share * 0.2:
            return


def connect(s: Session, n: int = 200) -> Figures:
    # Not under an earlier scenario's load: with resume on, the flood's streams, cut by their
    # clients, run on upstream for their grace (up to 30 s) and kept TTFT at ~14 ms; the
    # proxy is still taking in what they sent for a while after the emulator is done.
    _quiet(s, timeout=45.0)
    _idle_proxy(s)
    cfg = dict(concurrency=1, streams=n, tokens=1, itl_ms=0, stamp="content")
    records, _, _ = _streams(s, cfg, timeout=60)
    ttft = [r[0] / 1e6 for r in records if r[0] >= 0]
    return {"e_p50_ms": pct(ttft, 50), "e_p99_ms": pct(ttft, 99), "e_ok": len(ttft)}
