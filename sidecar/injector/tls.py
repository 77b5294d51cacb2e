"""A server SSLContext whose certificate follows its files (cert-manager rotates them).

uvicorn builds its SSLContext once, at startup. Instead we own the context and, when the
files change, call `load_cert_chain` on that same live context: new handshakes use the
new pair, open connections keep theirs, and the process never restarts.

Deliberate surprises:
- The files are polled (`os.stat`, every `interval` seconds), not watched: Secret
  volumes change by an atomic symlink swap that inotify watches on the files miss.
- Both files are read once into a private temporary PEM, which is loaded into a scratch
  context first. A half-rotated pair (new cert, old key) is refused there and the live
  context keeps serving the old pair; `load_cert_chain` on the live context with a bad
  pair could leave it with a certificate and no key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from pathlib import Path

log = logging.getLogger("sidecar.injector")

Stamp = tuple[tuple[int, int, int, int], ...]


class ReloadingCertificate:
    def __init__(self, certfile: str | Path, keyfile: str | Path, interval: float = 10.0) -> None:
        self.certfile = Path(certfile)
        self.keyfile = Path(keyfile)
        self.interval = interval
        self.reloads = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])
        self._stamp = self._stat()
        self._load()  # a broken pair at startup is fatal: fail before serving

    def reload_if_changed(self) -> bool:
        """Load the files into the live context if they changed; True when it did."""
        try:
            stamp = self._stat()
        except OSError as error:
            log.warning("cannot stat the TLS certificate files: %s", error)
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp  # a bad pair is retried when the files change again
        try:
            self._load()
        except (OSError, ssl.SSLError) as error:
            log.warning("keeping the previous TLS certificate: new pair not usable: %s", error)
            return False
        self.reloads += 1
        log.info("reloaded the TLS certificate from %s", self.certfile)
        return True

    async def watch(self) -> None:
        """Poll the files forever; run as a background task."""
        while True:
            await asyncio.sleep(self.interval)
            self.reload_if_changed()

    def _stat(self) -> Stamp:
        stats = (os.stat(self.certfile), os.stat(self.keyfile))  # follows the Secret's symlinks
        return tuple((s.st_dev, s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _load(self) -> None:
        pem = self.certfile.read_bytes().rstrip(b"\n") + b"\n" + self.keyfile.read_bytes()
        with tempfile.NamedTemporaryFile(prefix="injector-tls-", suffix=".pem") as snapshot:
            snapshot.write(pem)  # mkstemp: mode 0600
            snapshot.flush()
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(snapshot.name)
            self.context.load_cert_chain(snapshot.name)
