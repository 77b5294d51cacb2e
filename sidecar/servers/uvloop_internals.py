"""Every use of what uvloop does beyond its public interface:
- a response chunk written to the client's socket past uvloop's TCP transport, whenever the
  transport holds no bytes (`http1.nowait`, `sidecar/_core.c`'s `ChunkWriter`);
- an upstream connection's reads taking the GIL once rather than twice, and handing their
  bytes to `H1Core.data_received` in fewer steps (`quiet_reads`, `sidecar/_uvread.c`), below.

Checked against uvloop 0.23.0 (`CHECKED`, exact versions). Gate: `direct_fd(transport)` gives the socket's
file descriptor only for uvloop's own `TCPTransport` (exactly: not TLS, not asyncio's, not
a subclass) on a release checked; any other transport gets None, and its own `write` (the
public path) is used.

Why it holds, in uvloop's `handles/stream.pyx` and `basetransport.pyx`:
- `TCPTransport.write` with nothing held (`get_write_buffer_size() == 0`: its list and
  libuv's queue both empty) writes at once with `write(2)` to this descriptor
  (`UVStream._try_write`), and holds only what the socket did not take. A write made past it
  while it holds nothing puts the bytes where its own would, in the same order; the writer
  hands any rest to the transport, which then holds it, so what follows goes after it.
- `is_closing()` is false until the transport starts to close, and the descriptor is closed
  only after that (`close`, `abort` and `_fatal_error` set `_closing` first, then the handle
  is closed). A descriptor written to while it is false is the connection's own, never a
  number the kernel has since given to another connection.

Why: uvloop's write path for one chunk (its buffer list, `len`, `_fileno`, `_try_write`,
`list.clear` called by name, `_on_write`) came to about 950 of the 4,532 CPU instructions the
sidecar spent per relayed token (`python -m bench.lab.instructions`).

The reads (`quiet_reads`). uvloop runs libuv with the GIL released, and each callback libuv
makes takes it and gives it back. A read is two callbacks: uvloop's buffer callback
(`__loop_alloc_buffer` in `loop.pyx`: hand out the loop's receive buffer, mark it in use;
no Python) and the read callback (`__uv_stream_on_read`: the bytes to the protocol). With a
token a read, the first one's GIL round trip was some 530 of the 3,690 CPU instructions the
sidecar spent per token (`python -m bench.lab.instructions`). `_uvread.quiet` puts a buffer
callback that does the same without the GIL in that stream's libuv slot. Why it holds:
- the read callback takes the bytes from the loop's buffer (`_recv_buffer[:nread]`) and
  marks it free (`__loop_free_buffer`), whoever handed it out;
- the two callbacks run on the loop's thread, the only one that touches the buffer and its
  mark, so the GIL guards nothing there;
- uvloop puts its own callback back whenever it starts reading again (`resume_reading`,
  `_start_reading`): an upstream connection asks at each request and again after each
  resume (`H1Connection.quiet`);
- `_uvread.c` checks every layout it reads before it writes the slot (its comment) and
  leaves the slot alone otherwise: the stream then reads as it did, only slower.

Given the protocol too, the read callback is swapped as well, when the protocol's
`data_received` is a C function of one argument (`H1Core`'s): uvloop's (enter the
transport's context, slice the buffer, call the bound method through Cython's generic call,
leave the context) came to about 330 instructions a token, and to three objects touched per
token besides the protocol (the transport's context, the bound method, its arguments), each
cold by then (`python -m bench.lab.perfdiff`). Why it holds:
- the bytes are the buffer's first `nread`, as uvloop's slice; the buffer is marked free
  first, as uvloop does;
- reads with no bytes (EAGAIN, EOF, an error), and a transport whose protocol was changed,
  go to uvloop's own callback, as before;
- `data_received` is not run in the transport's context: `H1Core`'s reads no context
  variable (nor does what it calls: the relay, the writer, telemetry's per-chunk count);
- when it raises, the exception goes to the loop's exception handler, as uvloop's
  `_fatal_error` sends it, and uvloop's callback is told of a read error
  (`ECONNABORTED`), which closes the transport and gives `connection_lost` that error: an
  error, as through uvloop, never None (which `H1Connection` would take as a clean end).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.metadata

from sidecar.speedups import uvread

# uvloop releases read against the rules above, exactly: a patch release may move a field
# (the layouts are private), so any other version takes the public path until it is read.
CHECKED = frozenset({"0.23.0"})


def installed() -> str | None:
    """The installed uvloop's version, or None (uvicorn[standard] leaves uvloop out where
    it does not build, as on Windows)."""
    try:
        return importlib.metadata.version("uvloop")
    except importlib.metadata.PackageNotFoundError:
        return None


def checked(version: str | None = None) -> bool:
    """Is `version` (default: the installed uvloop) one these rules were checked against?"""
    version = installed() if version is None else version
    return version in CHECKED


@functools.cache
def _gated_type() -> type | None:
    """uvloop's `TCPTransport` when the gate is open, else None: decided once a process."""
    if not checked():
        return None
    found = getattr(importlib.import_module("uvloop.loop"), "TCPTransport", None)
    return found if isinstance(found, type) else None


def direct_fd(transport: asyncio.BaseTransport) -> int | None:
    """The descriptor a chunk may be written to past `transport` while it holds no bytes and
    is not closing, or None where only its own `write` may be used (see the module)."""
    tcp = _gated_type()
    if tcp is None or type(transport) is not tcp:
        return None
    sock = transport.get_extra_info("socket")
    fd = -1 if sock is None else sock.fileno()
    return fd if fd >= 0 else None


_uvread = uvread  # `_uvread.c` where built (`sidecar.speedups`)


def quiet_reads(
    transport: asyncio.BaseTransport, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol
) -> bool:
    """Make `transport`'s reads take the GIL once (see the module), where the gate is open,
    the C part is built and `transport` is reading on `loop` for `protocol`, a plain one (a
    buffered protocol's reads go through its own buffer); True when they now do. When its
    `data_received` is a C function (`H1Core`'s), each read's bytes also go to it in fewer
    steps."""
    tcp = _gated_type()
    if tcp is None or type(transport) is not tcp or _uvread is None:
        return False
    if isinstance(protocol, asyncio.BufferedProtocol):
        return False
    return bool(_uvread.quiet(transport, loop, protocol))
