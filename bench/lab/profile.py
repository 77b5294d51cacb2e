"""`python -m bench.lab.profile [paced|flood] [SECONDS]`: py-spy profile of sidestream under load.

Needs `py-spy` (`pip install py-spy`; not a dependency). Starts the emulator and sidestream
as the benchmark does, runs scenario a (paced) or b (flood) while `py-spy record` samples
the proxy, then prints the functions with the most samples, self time and total (inclusive).
The raw collapsed stacks stay in `bench/results/profile-<scenario>.txt` for a flame graph.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import threading

from bench import scenarios
from bench.targets import ROOT, session


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
        frames = [
            f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0] for f in stack.split(";")
        ]
        own[frames[-1]] += k
        for frame in set(frames):
            total[frame] += k
    lines = [f"{samples} samples", "self%  total%  function"]
    for frame, k in own.most_common(n):
        lines.append(f"{100 * k / samples:5.1f}  {100 * total[frame] / samples:6.1f}  {frame}")
    return "\n".join(lines)


def main() -> int:
    scenario = sys.argv[1] if len(sys.argv) > 1 else "flood"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    spy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    out = ROOT / "bench" / "results" / f"profile-{scenario}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    with session("sidestream", sink_port=1) as s:
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
