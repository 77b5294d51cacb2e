"""Process figures: CPU seconds, RSS, peak RSS and open fds of a process tree (from /proc).

A target is a process tree (nginx: master + worker; a Python proxy: one process), so every
reading sums over the root and its descendants, found by scanning /proc for parent ids.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Self

TICK = os.sysconf("SC_CLK_TCK")


def tree(root: int) -> list[int]:
    """`root` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes (all their threads, ended ones included), in seconds.

    Read from each process's CPU-time clock (`clock_gettime` on the clock id Linux derives
    from the pid, as `clock_getcpuclockid(3)` does): the time `/proc/PID/stat`'s utime +
    stime count, in nanoseconds instead of 10 ms ticks — scenario a runs nginx for about
    ten ticks, so ticks alone would move a ratio by 10%. Falls back to `/proc/PID/stat`.
    """
    total = 0.0
    for pid in pids:
        try:
            total += time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
            continue
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of stat(5)
    return total


def memory_kb(pids: list[int]) -> tuple[int, int]:
    """(VmRSS, VmHWM) summed over these processes, in KiB."""
    rss = hwm = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
        except OSError:
            continue
    return rss, hwm


def fd_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return total


@dataclass
class Peak:
    rss_kb: int = 0
    hwm_kb: int = 0
    fds: int = 0


class Periodic:
    """`sample()` every `interval` seconds on a thread, from the `with` block's start to its
    end (once more at the end's wait)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Sampler(Periodic):
    """Samples RSS and fds of a tree every `interval` seconds on a thread; keeps the maxima."""

    def __init__(self, pids: list[int], interval: float = 0.25) -> None:
        super().__init__(interval)
        self.pids = pids
        self.peak = Peak()

    def sample(self) -> None:
        rss, hwm = memory_kb(self.pids)
        fds = fd_count(self.pids)
        p = self.peak
        p.rss_kb, p.hwm_kb, p.fds = max(p.rss_kb, rss), max(p.hwm_kb, hwm), max(p.fds, fds)
