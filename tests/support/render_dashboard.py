"""Render the Grafana dashboard's panels from a real Prometheus, without Grafana.

`python -m tests.support.render_dashboard docs/img/dashboard.png [SECONDS]` runs the emulator,
a sidecar and Debian's `prometheus` (as tests/system/test_prometheus.py does), drives steady
traffic plus rounds of every outcome for SECONDS (default 150), then asks Prometheus for each
panel's query over that time (`query_range`, the dashboard's variables substituted), draws
the panels as SVG in the dashboard's grid and screenshots the page in headless Chromium.

It is a rendering of the dashboard's queries over real data, not Grafana itself (Grafana is
not installable here: no Debian package).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import sys
import tempfile
import time
from pathlib import Path

from sidecar.emulator import Stats, make_app
from tests.support import dashboard
from tests.support.browser.session import browser_page
from tests.support.procs import Child
from tests.support.promlab import (
    MODELS,
    SIDECAR_FLAGS,
    FaultyEmulator,
    Prometheus,
    _whole,
    chat,
    every_outcome,
    prometheus,
)
from tests.support.servers import serve

COLORS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9",
          "#705da0", "#508642", "#cca300", "#447ebc")  # fmt: skip
UNIT = 36  # px per grid unit of height (Grafana's is 30, plus margins)
TOP = 56  # px above the grid (the title)
WIDTH = 1600
STEP = 2  # seconds


async def steady(port: int, stop: asyncio.Event) -> None:
    """Background streams, two at a time, alternating the models."""
    i = 0
    while not stop.is_set():
        model = MODELS[i % 2]
        await asyncio.gather(
            _whole(port, chat(model, tokens=50, ttft_ms=120 + 40 * (i % 5), itl_ms=25)),
            _whole(port, chat(MODELS[(i + 1) % 2], tokens=30, ttft_ms=300, itl_ms=40)),
        )
        i += 1


async def traffic(port: int, seconds: float) -> None:
    stop = asyncio.Event()
    background = asyncio.create_task(steady(port, stop))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await every_outcome(port, limit=8)
        await asyncio.sleep(6)
    stop.set()
    await background


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "reqps":
        return f"{value:.2f}/s"
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def chart(series: list[tuple[str, list[tuple[float, float]]]], unit: str, w: int, h: int,
          start: float, end: float) -> str:  # fmt: skip
    left, right, top, bottom = 70, 10, 10, 24
    points = [v for _, values in series for _, v in values if v == v]
    high = max(points, default=1.0) * 1.15 or 1.0

    def x(t: float) -> float:
        return left + (t - start) / (end - start) * (w - left - right)

    def y(v: float) -> float:
        return top + (1 - v / high) * (h - top - bottom)

    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        v = high * i / 4
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   'stroke="#2c3235" />')  # fmt: skip
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f"{html.escape(fmt(v, unit))}</text>")  # fmt: skip
    for i in range(6):
        t = start + (end - start) * i / 5
        label = time.strftime("%H:%M:%S", time.localtime(t))
        out.append(f'<text x="{x(t):.1f}" y="{h - 6}" text-anchor="middle">{label}</text>')
    for index, (_, values) in enumerate(series):
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for i, (t, v) in enumerate(values)
        )
        out.append(f'<path d="{path}" fill="none" stroke="{COLORS[index % len(COLORS)]}" '
                   'stroke-width="1.6" />')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


async def panels_html(server: Prometheus, start: float, end: float) -> tuple[str, int]:
    board = dashboard.load()
    queries = dashboard.queries(board)
    cells = []
    for panel in board["panels"]:
        own = [q for q in queries if q.panel == panel["title"]]
        unit = own[0].unit if own else ""
        series: list[tuple[str, list[tuple[float, float]]]] = []
        for query in own:
            result = await server.query_range(query.promql, start, end, f"{STEP}s")
            for item in result:
                label = query.legend
                for key, value in item["metric"].items():
                    label = label.replace("{{" + key + "}}", value)
                values = [(float(t), float(v)) for t, v in item["values"]]
                series.append((label or query.legend, [(t, v) for t, v in values if v == v]))
        grid = panel["gridPos"]
        w = grid["w"] * WIDTH // 24 - 12
        h = grid["h"] * UNIT - 8
        legend = "".join(
            f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(name)}</span>'
            for i, (name, _) in enumerate(series)
        )
        big = ""
        if panel["type"] == "stat" and series and series[0][1]:
            big = f'<div class="stat">{fmt(series[0][1][-1][1], unit)} now</div>'
        cells.append(
            f'<div class="panel" style="left:{grid["x"] * WIDTH // 24}px;'
            f'top:{TOP + grid["y"] * UNIT}px;width:{w}px;height:{h}px">'
            f"<h2>{html.escape(panel['title'])}</h2>{big}"
            f"{chart(series, unit, w - 16, h - 58, start, end)}"
            f'<div class="legend">{legend}</div></div>'
        )
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    height = TOP + rows * UNIT + 8
    note = (
        "A rendering of k8s/observability/sidestream-dashboard.json's queries over a real "
        "Prometheus scraping a sidecar (not Grafana itself): pod = All, model = All, "
        "$__rate_interval = 1m."
    )
    return (
        f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 12px sans-serif;
       position: relative; width: {WIDTH}px; height: {height}px; }}
header {{ padding: 14px 16px; font-size: 16px; }} header small {{ color: #8e8e9e; font-size: 12px;
       margin-left: 12px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 3px;
         padding: 6px 8px; box-sizing: border-box; }}
h2 {{ font-size: 13px; margin: 0 0 4px; color: #d8d9da; font-weight: 500; }}
svg text {{ fill: #8e8e9e; font-size: 10px; }}
.legend span {{ margin-right: 12px; white-space: nowrap; }}
.legend i {{ display: inline-block; width: 12px; height: 3px; margin-right: 4px;
            vertical-align: middle; }}
.stat {{ position: absolute; right: 14px; top: 6px; font-size: 20px; color: #73bf69; }}
</style></head><body><header>sidestream <small>{html.escape(note)}</small></header>
{"".join(cells)}</body></html>""",
        height,
    )


async def main(out: Path, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with serve(FaultyEmulator(make_app(stats=Stats()))) as upstream:
            flags = list(SIDECAR_FLAGS)
            flags[flags.index("--max-streams") + 1] = "10"
            sidecar = Child(upstream, *flags)
            try:
                await sidecar.ready()
                async with prometheus([f"127.0.0.1:{sidecar.admin}"], []) as server:
                    start = time.time()
                    await traffic(sidecar.port, seconds)
                    await asyncio.sleep(3)
                    page, height = await panels_html(server, start, time.time())
            finally:
                sidecar.kill()
        path = Path(tmp) / "dashboard.html"
        path.write_text(page)
        async with browser_page() as browser:
            await browser.navigate(path.as_uri(), WIDTH, height)
            await asyncio.sleep(1)
            await browser.screenshot(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 150))
