"""`python -m bench.lab.syscalls [--targets T,...] [--scenario connect|paced]`: system calls per
request (scenario e: new connections, one token each) or per token (scenario a), by call, for
each target's proxy (`strace -f -c` attached to its processes during the load).

A system call costs far more than the Python around it when its peer sleeps (a small loopback
write to a reader on another core: ~20 µs), so a call the proxy makes and nginx does not is
worth finding. This found, per request, three `getpid()` calls behind `asyncio`'s running-loop
checks and the response head written apart from the first token. strace slows every call:
compare counts, not times. Needs strace.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import scenarios
from bench.targets import otlp_sink, proxy_targets, session

_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$")


def counted(target: str, scenario: str, sink_port: int) -> tuple[dict[str, int], int]:
    """Each system call's count across `target`'s proxy processes during one load, and how
    many requests (connect) or tokens (paced) that load was."""
    with session(target, sink_port) as s, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "strace.txt"
        if scenario == "connect":  # warm-up: pools, caches, first calls
            scenarios.connect(s, n=50)
        else:
            scenarios.paced(s, tokens=20)
        argv = ["strace", "-f", "-c", "-o", str(out)]
        for pid in s.pids():
            argv += ["-p", str(pid)]
        tracer = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
        if scenario == "connect":
            figures = scenarios.connect(s, n=200)
            units = int(figures["e_ok"])
        else:
            figures = scenarios.paced(s, tokens=200)
            units = int(figures["a_tokens"])
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        calls: dict[str, int] = {}
        for line in out.read_text().splitlines():
            match = _ROW.match(line)
            if match and match.group(2) != "total":
                calls[match.group(2)] = int(match.group(1))
    return calls, units


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="sidestream,nginx")
    parser.add_argument("--scenario", choices=("connect", "paced"), default="connect")
    args = parser.parse_args(argv)
    targets = proxy_targets(args.targets, parser.error)
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install strace)")
        return 2
    per = "request" if args.scenario == "connect" else "token"
    with otlp_sink() as sink_port:
        results = {t: counted(t, args.scenario, sink_port) for t in targets}
    names = sorted({name for calls, _ in results.values() for name in calls})
    print(f"| system call, per {per} | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    for name in names:
        row = [f"{results[t][0].get(name, 0) / results[t][1]:.2f}" for t in targets]
        print(f"| {name} | " + " | ".join(row) + " |")
    totals = [f"{sum(results[t][0].values()) / results[t][1]:.2f}" for t in targets]
    print("| **all** | " + " | ".join(totals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
