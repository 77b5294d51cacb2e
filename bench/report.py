"""Turn per-repetition figures into the markdown tables: medians, ratios, budgets.

Ratios (added latency over `direct`, CPU over `nginx`, telemetry on — `sidestream`, as shipped
— over off, `sidestream+no-otel`) are computed
within each repetition, then the median of those is shown — never a ratio of medians.
Where a median decides a budget with little room, `median_interval` says how far it could be
from the machine's own.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any, TypeGuard

Rep = dict[str, dict[str, Any]]  # target -> figures of one repetition


def _num(x: Any) -> TypeGuard[float]:
    """A number to show (an int or float, not a bool, not NaN)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def median_interval(
    values: Sequence[float], level: float = 0.95, resamples: int = 4000
) -> tuple[float, float]:
    """A bootstrap interval for the median of `values`: the middle `level` of the medians of
    `resamples` resamples (percentile method). Seeded, so the same figures always print the
    same interval. With a handful of repetitions it can only span the middle ones: it shows
    the spread, not a precise bound."""
    if len(values) < 2:
        raise ValueError("an interval needs two values or more")
    rng = random.Random(0)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1.0 - tail) * resamples))]


def derive(rep: Rep) -> None:
    """Add the within-repetition ratios and differences to each target's figures."""
    direct, nginx = rep.get("direct", {}), rep.get("nginx", {})
    off = rep.get("sidestream+no-otel", {})
    for target, f in rep.items():
        for key, base, out in (
            ("a_p50_ms", direct, "a_add_p50_ms"),
            ("a_p99_ms", direct, "a_add_p99_ms"),
            ("e_p50_ms", direct, "e_add_p50_ms"),
            ("e_p99_ms", direct, "e_add_p99_ms"),
        ):
            if target != "direct" and _num(f.get(key)) and _num(base.get(key)):
                f[out] = f[key] - base[key]
        for key in ("a_cpu_100k", "b_cpu_100k"):
            if _num(f.get(key)) and _num(nginx.get(key)) and nginx[key] > 0:
                f[key + "_vs_nginx"] = f[key] / nginx[key]
            if target == "sidestream" and _num(f.get(key)) and _num(off.get(key)):
                f[key + "_otel"] = f[key] / off[key]


def medians(reps: list[Rep], targets: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {t: {} for t in targets}
    for t in targets:
        keys = {k for rep in reps for k in rep.get(t, {})}
        for k in keys:
            values = [rep[t][k] for rep in reps if t in rep and k in rep[t]]
            nums = [v for v in values if _num(v)]
            out[t][k] = statistics.median(nums) if nums else values[-1] if values else None
    return out


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    if not _num(x):
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


ROWS: list[tuple[str, list[str], int]] = [
    ("a. per-token latency p50 / p99 (ms)", ["a_p50_ms", "a_p99_ms"], 3),
    ("a. added per-token latency p50 / p99 vs direct (ms)", ["a_add_p50_ms", "a_add_p99_ms"], 3),
    ("a. proxy CPU s per 100k tokens", ["a_cpu_100k"], 2),
    ("a. CPU per token vs nginx", ["a_cpu_100k_vs_nginx"], 2),
    ("a. store (redis-server) CPU s per 100k tokens", ["a_store_cpu_100k"], 2),
    ("b. tokens/s", ["b_tokens_s"], 0),
    ("b. proxy CPU s per 100k tokens", ["b_cpu_100k"], 2),
    ("b. CPU per token vs nginx", ["b_cpu_100k_vs_nginx"], 2),
    ("d. close seen upstream p50 / p99 (ms)", ["d_p50_ms", "d_p99_ms"], 2),
    ("d. streams not cancelled upstream", ["d_ran_on"], 0),
    ("e. TTFT p50 / p99 (ms)", ["e_p50_ms", "e_p99_ms"], 2),
    ("e. added TTFT p50 / p99 vs direct (ms)", ["e_add_p50_ms", "e_add_p99_ms"], 2),
]


def idle_rows(sizes: list[int]) -> list[tuple[str, list[str], int]]:
    rows = []
    for n in sizes:
        rows += [
            (f"c. {n:,} idle: open / flowing", [f"c{n}_open", f"c{n}_flowing"], 0),
            (f"c. {n:,} idle: RSS per stream (KB)", [f"c{n}_rss_per_stream_kb"], 1),
            (f"c. {n:,} idle: peak RSS (MB) / fds", [f"c{n}_hwm_mb", f"c{n}_fds"], 0),
            (
                f"c. {n:,} idle: s to open all / all flowing",
                [f"c{n}_ramp_s", f"c{n}_all_flowing_s"],
                1,
            ),
        ]
    return rows


def table(med: dict[str, dict[str, Any]], targets: list[str], sizes: list[int]) -> str:
    lines = ["| scenario | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for label, keys, digits in ROWS[:8] + idle_rows(sizes) + ROWS[8:]:
        cells = []
        for t in targets:
            f = med.get(t, {})
            if "error" in f and not any(k in f for k in keys):
                cells.append("fail")
            else:
                cells.append(" / ".join(fmt(f.get(k), digits) for k in keys))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def budgets(
    med: dict[str, dict[str, Any]], sizes: list[int], otel: bool, together: list[float]
) -> str:
    """The budgets table: issue #52's, of sidestream as shipped (`sidestream`) and with
    telemetry off (`sidestream+no-otel`). Telemetry's share in scenario a is judged by
    `together` (its ratios with telemetry on and off loaded at the same time) when there are
    some, the in-turns median shown beside it."""
    s = med.get("sidestream", {})
    off = med.get("sidestream+no-otel", {})
    big = max(sizes)
    checks: list[tuple[str, Any, str, float]] = [
        ("a. as shipped: CPU per token ≤ 1.15x nginx", s.get("a_cpu_100k_vs_nginx"), "x", 1.15),
        (
            "a. telemetry off: CPU per token ≤ 1.05x nginx",
            off.get("a_cpu_100k_vs_nginx"),
            "x",
            1.05,
        ),
        ("b. as shipped: CPU per token ≤ 1.05x nginx", s.get("b_cpu_100k_vs_nginx"), "x", 1.05),
        ("a. added per-token p50 ≤ 0.1 ms", s.get("a_add_p50_ms"), " ms", 0.1),
        ("a. added per-token p99 ≤ 1 ms", s.get("a_add_p99_ms"), " ms", 1.0),
        ("e. added TTFT p50 ≤ 0.15 ms", s.get("e_add_p50_ms"), " ms", 0.15),
        (f"c. {big:,} streams open, ≤ 8 KB each", s.get(f"c{big}_rss_per_stream_kb"), " KB", 8.0),
        ("d. close seen upstream p99 ≤ 1 ms", s.get("d_p99_ms"), " ms", 1.0),
        ("d. no stream runs on", s.get("d_ran_on"), "", 0),
    ]
    rows = ["| budget (sidestream as shipped, unless named) | measured | met? |", "|---|---|---|"]
    for label, value, unit, limit in checks:
        ok = _num(value) and value <= limit
        if label.startswith("c."):
            ok = ok and s.get(f"c{big}_open") == big and s.get(f"c{big}_flowing") == big
            if not (_num(value) and s.get(f"c{big}_open") == big):
                value = f"{fmt(s.get(f'c{big}_open'), 0)} open, {fmt(value, 1)}"
        shown = value if isinstance(value, str) else fmt(value, 3 if unit == " ms" else 2) + unit
        rows.append(f"| {label} | {shown} | {'yes' if ok else '**no**'} |")
    telemetry = [  # label, as shipped's figure, limit, its ratios at once (if any)
        ("a. telemetry on: CPU per token ≤ 1.15x off", "a_cpu_100k_otel", 1.15, together),
        ("b. telemetry on: CPU per token ≤ 1.15x off", "b_cpu_100k_otel", 1.15, []),
    ]
    for label, key, limit, at_once in telemetry:
        if not otel:
            rows.append(f"| {label} | telemetry did not reach the sink | — |")
        elif at_once:
            median = statistics.median(at_once)
            each = ", ".join(f"{r:.2f}" for r in at_once)
            shown = f"{median:.2f}x at once ({len(at_once)} repetitions: {each}"
            met = "yes" if median <= limit else "**no**"
            if len(at_once) > 1:
                low, high = median_interval(at_once)
                shown += f"; 95% interval of the median {low:.2f} to {high:.2f}"
                if median <= limit < high:
                    met = "at the edge"  # the median meets it, its interval reaches past it
            shown += f"); in turns {fmt(s.get(key))}x"
            rows.append(f"| {label} | {shown} | {met} |")
        else:
            v = s.get(key)
            within = _num(v) and float(v) <= limit
            rows.append(f"| {label} | {fmt(v)}x | {'yes' if within else '**no**'} |")
    return "\n".join(rows)


def cpu_by_rep(reps: list[Rep], targets: list[str]) -> str:
    """Each repetition's CPU per 100k tokens in (a) and (b), and its ratios: how far apart the
    repetitions behind a median are (a median of three hides one that is off)."""
    shown = [t for t in targets if t != "direct"]
    ratios = [("vs nginx", "sidestream", "_vs_nginx"), ("on/off", "sidestream", "_otel")]
    head = ["rep"] + [f"{scen}. {t}" for scen in "ab" for t in shown]
    head += [f"{scen}. {name}" for scen in "ab" for name, _, _ in ratios]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i, rep in enumerate(reps, 1):
        cells = [str(i)]
        cells += [fmt(rep.get(t, {}).get(f"{scen}_cpu_100k")) for scen in "ab" for t in shown]
        cells += [
            fmt(rep.get(t, {}).get(f"{scen}_cpu_100k{suffix}"))
            for scen in "ab"
            for _, t, suffix in ratios
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "CPU s per 100k tokens, each repetition:\n\n" + "\n".join(lines)
