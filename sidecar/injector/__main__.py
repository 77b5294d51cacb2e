"""`python -m sidecar.injector --listen HOST:PORT [--certfile F --keyfile F]`.

Without the certificate flags the webhook serves plain HTTP (tests, local runs); the API
server only calls webhooks over TLS. Every flag has a `SIDESTREAM_INJECTOR_*` env var.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from collections.abc import Sequence
from typing import Any

import uvicorn

from sidecar.injector.app import InjectorApp
from sidecar.injector.settings import DEFAULT_IMAGE
from sidecar.injector.tls import ReloadingCertificate


class _Config(uvicorn.Config):
    """uvicorn.Config that serves our live, reloadable SSLContext instead of building one."""

    def __init__(self, app: InjectorApp, *, context: ssl.SSLContext | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._context = context

    def load(self) -> None:
        super().load()
        if self._context is not None:
            self.ssl = self._context


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get("SIDESTREAM_INJECTOR_" + name, default)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sidecar.injector", description=__doc__)
    parser.add_argument("--listen", default=_env("LISTEN", "0.0.0.0:8443"), help="HOST:PORT")
    parser.add_argument("--certfile", default=_env("CERTFILE"), help="PEM certificate chain")
    parser.add_argument("--keyfile", default=_env("KEYFILE"), help="PEM private key")
    parser.add_argument(
        "--cert-reload-interval",
        type=float,
        default=float(_env("CERT_RELOAD_INTERVAL", "10") or 10),
        help="seconds between checks of the certificate files (default 10)",
    )
    parser.add_argument("--image", default=_env("IMAGE", DEFAULT_IMAGE), help="sidecar image")
    parser.add_argument(
        "--on-invalid",
        choices=("admit", "deny"),
        default=_env("ON_INVALID", "admit"),
        help="bad sidestream.dev/* annotations: admit the pod uninjected with a warning "
        "(default) or deny it",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        parser.error(f"--listen {args.listen!r} is not HOST:PORT")
    args.host, args.port = host.strip("[]") or "0.0.0.0", int(port)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    certificate = None
    if args.certfile:
        certificate = ReloadingCertificate(args.certfile, args.keyfile, args.cert_reload_interval)
    app = InjectorApp(default_image=args.image, on_invalid=args.on_invalid, certificate=certificate)
    config = _Config(
        app,
        context=certificate.context if certificate else None,
        host=args.host,
        port=args.port,
        lifespan="on",
        log_level=args.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
