"""`python -m bench [--full]`: see `bench.run`."""

from bench.run import main

raise SystemExit(main())
