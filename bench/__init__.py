"""sidestream's benchmark harness: direct vs sidestream vs nginx vs a tutorial proxy.

Run with `make bench` (quick) or `make bench-full`; see `bench.run` and README "Performance".
`make soak` runs `bench.soak`; `bench.paced` runs scenario a alone for A/B work. Research
tools (profilers, instruction counts, micro-benchmarks) are in `bench.lab`.
"""
