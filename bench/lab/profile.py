"""`python -m bench.lab.profile [paced|flood] [SECONDS] [--target T]`: py-spy profile of
sidestream under load.

Needs `py-spy` (`pip install py-spy`; not a dependency). Starts the emulator and the target
(`sidestream`, as shipped with an OTLP sink, unless `--target` names another) as the
benchmark does, runs scenario a (paced) or b (flood) while `py-spy record` samples the proxy,
then prints the functions with the most samples, self time and total (inclusive). The raw
collapsed stacks stay in `bench/results/profile-<scenario>.txt` for a flame graph.

py-spy sees Python frames only: what the compiled core runs from uvloop's callbacks (a
token's whole relay) has none, and shows as the event loop's `run`. For that part, count
instructions (`bench.lab.instructions`) or sample the kernel and C (`bench.lab.perfdiff`).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import threading
from pathlib import Path

from bench import scenarios
from bench.targets import ROOT, TARGETS, otlp_sink, session


def _frame(frame: str) -> str:
    """py-spy's `function (path/to/file.py:line)` as `function file.py`."""
    function, _, where = frame.partition(" (")
    return f"{function} {where.rsplit(':', 1)[0].rsplit('/', 1)[-1]}"


def top(collapsed: str, n: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        k = int(count)
        samples += k
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += k
        for frame in set(frames):
            total[frame] += k
    lines = [f"{samples} samples", "self%  total%  function"]
    for frame, k in own.most_common(n):
        lines.append(f"{100 * k / samples:5.1f}  {100 * total[frame] / samples:6.1f}  {frame}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", choices=("paced", "flood"), default="flood")
    parser.add_argument("seconds", nargs="?", type=float, default=6.0)
    sidestreams = [t for t in TARGETS if t.startswith("sidestream")]
    parser.add_argument("--target", choices=sidestreams, default="sidestream")
    args = parser.parse_args(argv)
    scenario, seconds = args.scenario, args.seconds
    spy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    if not Path(spy).exists():
        parser.error("py-spy is not installed (pip install py-spy)")
    out = ROOT / "bench" / "results" / f"profile-{scenario}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    with otlp_sink() as sink, session(args.target, sink) as s:
        assert s.proxy is not None
        argv = [spy, "record", "-p", str(s.proxy.pid), "-d", str(int(seconds))]
        argv += ["-f", "raw", "-o", str(out), "-r", "250", "--nonblocking"]
        spy_proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        load = threading.Thread(
            target=(
                (lambda: scenarios.flood(s, duration=seconds))
                if scenario == "flood"
                else (lambda: scenarios.paced(s, tokens=int(seconds * 50)))
            )
        )
        load.start()
        load.join()
        spy_proc.wait()
    print(top(out.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
