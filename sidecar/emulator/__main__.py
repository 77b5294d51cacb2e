"""`python -m sidecar.emulator`: see `sidecar.emulator.cli`."""

from sidecar.emulator.cli import main

raise SystemExit(main())
