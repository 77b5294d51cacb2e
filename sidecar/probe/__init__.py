"""`sidestream probe`: find the hop that buffers, compresses or cuts a stream.

`route` serves the origin (`middleware.probe`) at `/sidestream/v1/probe` in front of the
proxy; `client` reads it through whatever stands in front and times each raw read;
`analysis` turns that timeline into checks (pure functions); `report` prints them; `cli` is
`sidestream probe URL`. See docs/probe.md.
"""
