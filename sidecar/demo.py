"""`make run`: the upstream emulator and the sidecar in front of it, on localhost.

Ports come from DEMO_UPSTREAM_PORT (8000), DEMO_PORT (8080) and DEMO_ADMIN_PORT (9901).
Ctrl-C (or SIGTERM) stops both: the sidecar drains first, then the emulator stops.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

CURL = """curl -N http://127.0.0.1:{port}/v1/chat/completions \\
  -H 'Content-Type: application/json' \\
  -d '{{"model": "emulator", "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}'"""


def _wait_for(port: int, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{name} did not listen on port {port} within 20 s")


def main() -> int:
    upstream = int(os.environ.get("DEMO_UPSTREAM_PORT", "8000"))
    port = int(os.environ.get("DEMO_PORT", "8080"))
    admin = int(os.environ.get("DEMO_ADMIN_PORT", "9901"))
    python = sys.executable
    emulator = subprocess.Popen(
        [
            python,
            "-m",
            "sidecar.emulator",
            "--listen",
            f"127.0.0.1:{upstream}",
            "--log-level",
            "warning",
        ]
    )
    sidecar = None
    try:
        _wait_for(upstream, emulator, "the emulator")
        sidecar = subprocess.Popen(
            [
                python, "-m", "sidecar",
                "--listen", f"127.0.0.1:{port}",
                "--admin-listen", f"127.0.0.1:{admin}",
                "--upstream", f"http://127.0.0.1:{upstream}",
                "--drain-timeout", "5",
                "--log-level", "warning",
            ]
        )  # fmt: skip
        _wait_for(port, sidecar, "the sidecar")
        print(f"\nupstream emulator  http://127.0.0.1:{upstream}")
        print(f"sidestream sidecar http://127.0.0.1:{port}   (admin http://127.0.0.1:{admin})")
        print("\nWatch tokens stream through the sidecar:\n\n" + CURL.format(port=port))
        print("\nCtrl-C stops both.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while sidecar.poll() is None and emulator.poll() is None:
            time.sleep(0.2)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (sidecar, emulator):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    raise SystemExit(main())
