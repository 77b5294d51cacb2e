"""sidestream's benchmark harness: direct vs sidestream vs nginx vs a tutorial proxy.

Run with `make bench` (quick) or `make bench-full`; see `bench.run` and README "Performance".
"""
