"""`python -m bench.ablate [--reps N]`: what telemetry would cost with parts of it removed.

The budget "telemetry on costs at most 15% more CPU per token than off" (scenario a) needs
to know where the floor is, not only where the cost goes. This runs `bench.paced --together`
(sidestream, sidestream+otel and an `alt+otel` built from this commit with parts of
telemetry cut out) once per ablation:

- `frame`: the per-token frame check reduced to one `startswith` of the learned prefix (what
  the cheapest conceivable check would cost; right for the benchmark's clean streams only);
- `finish`: no sinks (`SIDESTREAM_TELEMETRY_SINKS=none`): no span started or ended, so
  nothing encoded or exported, no metrics, no access-log line; the summary still computed;
- `both`: the two together: what the rest of telemetry (record start, the stream's role,
  finish and usage chunks parsed as events, the count and time of each token) costs alone;
- `span`: without the span sink (no span started, so none encoded or exported);
- `log`: without the access-line sink.

The sink ablations are configuration: `alt+otel` runs with `SIDESTREAM_TELEMETRY_SINKS` set
(`BENCH_ALT_SINKS`, see `bench.targets`). The frame ablation is a source patch: each ablated
tree is a `git worktree` of HEAD (committed code only) in a temporary folder, patched by
replacing one anchor line per part; an anchor that is no longer in the source stops the run
with its name. The trees are removed at the end. Takes about 3 minutes per ablation with the
default 8 repetitions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench import paced
from bench.targets import ROOT

# part -> (file, the anchor, what replaces it: the anchor with the cut before it)
_FRAME = (
    "middleware/dialects/frame.py",
    "        if not self.varies:\n            rest = body.removeprefix(self.prefix)\n",
    "        return body.startswith(self.prefix)  # ABLATED\n"
    "        if not self.varies:\n            rest = body.removeprefix(self.prefix)\n",
)
_FRAME_INLINE = (  # the cycle's copy of the usual case: off, so the cut `matches` decides
    "middleware/cycle.py",
    "                if not frame.varies:\n                    rest = body.removeprefix(frame.prefix)\n",
    "                if False:  # ABLATED\n                    rest = body.removeprefix(frame.prefix)\n",
)
# ablation -> (source patches, the alt's SIDESTREAM_TELEMETRY_SINKS or None for all sinks)
ABLATIONS: dict[str, tuple[list[tuple[str, str, str]], str | None]] = {
    "frame": ([_FRAME, _FRAME_INLINE], None),
    "finish": ([], "none"),
    "both": ([_FRAME, _FRAME_INLINE], "none"),
    "span": ([], "metrics,access"),
    "log": ([], "span,metrics"),
}


def patch(tree: Path, parts: list[tuple[str, str, str]]) -> None:
    """Apply each part's replacement in `tree`; its anchor must be there exactly once."""
    for name, anchor, replacement in parts:
        path = tree / name
        source = path.read_text()
        if source.count(anchor) != 1:
            raise SystemExit(f"bench.ablate: the anchor for {name} is not in the source once")
        path.write_text(source.replace(anchor, replacement))


@contextlib.contextmanager
def worktree() -> Iterator[Path]:
    """A detached worktree of HEAD in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-ablate-") as tmp:
        tree = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", str(tree), "HEAD"], check=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ablate", description=__doc__)
    parser.add_argument("--reps", type=int, default=8, help="repetitions (default 8)")
    parser.add_argument(
        "--only", choices=sorted(ABLATIONS), action="append", help="run only these ablations"
    )
    args = parser.parse_args(argv)
    for name in args.only or list(ABLATIONS):
        parts, sinks = ABLATIONS[name]
        with worktree() as tree:
            patch(tree, parts)
            print(f"\n## ablation {name}: alt+otel is sidestream+otel without it", flush=True)
            os.environ["BENCH_ALT"] = str(tree)
            os.environ.pop("BENCH_ALT_SINKS", None)
            if sinks is not None:
                os.environ["BENCH_ALT_SINKS"] = sinks
            targets = "sidestream,sidestream+otel,alt+otel"
            status = paced.main(["--together", "--targets", targets, "--reps", str(args.reps)])
            if status:
                return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
