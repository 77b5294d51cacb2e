"""Research tools for sidestream's performance: profilers, instruction and bytecode counts,
micro-benchmarks. Not the product benchmark (that is `bench`); see bench/lab/README.md."""
