"""Start and stop what the benchmark measures: the emulator upstream and each proxy target.

Every target runs as fresh processes for each session: the proxy pinned to its own core
(`PROXY_CORES`), the emulator, the OTLP sink and the load generators on the others
(`LOAD_CORES`). On a 2-core machine that is one core each.

Targets: `direct` (the client talks to the emulator: the physical floor), `sidestream`
(`python -m sidecar` as shipped: telemetry on — spans, metrics and the access line, 100%
sampling, exporting OTLP to the bench's sink — and `--usage force`), `nginx` (Debian package, 1
worker, `proxy_buffering off`, HTTP/1.1 upstream keep-alive) and `tutorial` (FastAPI + httpx,
`bench/tutorial.py`). A stripped-down or extended sidestream is `sidestream` and what it changes
from the shipped configuration, each after a `+` (`VARIANTS`): `+no-otel` telemetry off
(`OTEL_SDK_DISABLED=true`), `+pass` or `+continuous` the usage mode, `+resume` resume on the
memory store, `+redis` on a `redis-server` of its own on the load cores (`store`: its CPU is not
the proxy's: scenario a counts it apart, `a_store_cpu_100k`); e.g. `sidestream+no-otel+pass`.

For A/B work on a change, `alt` is `sidestream` run from another sidestream tree, named by
`BENCH_ALT` (e.g. a `git worktree` of another commit), with the same `+` variants:
`BENCH_ALT=/tmp/wt-old python -m bench.paced --together --targets alt,sidestream`.
`BENCH_ALT_PYTHON` runs the alt targets on another interpreter (e.g. a virtualenv of another
CPython build, with the alt tree installed in it): an A/B of interpreter builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.procstat import tree

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
_CORES = sorted(os.sched_getaffinity(0))
PROXY_CORES = {_CORES[-1]}
LOAD_CORES = set(_CORES[:-1]) or set(_CORES)
# What a sidestream target may change from the configuration as shipped, each after a `+`.
VARIANTS = {
    "no-otel": "telemetry off",
    "pass": "--usage pass",
    "continuous": "--usage continuous",
    "resume": "--resume (memory store)",
    "redis": "--resume on a redis-server of its own",
}
EXCLUSIVE = ({"resume", "redis"}, {"pass", "continuous"})  # variants that name one setting twice
# The targets a `--targets` lists in its help (any `+` combination of VARIANTS is one too).
TARGETS = (
    "direct",
    "sidestream",
    "sidestream+no-otel",
    "sidestream+pass",
    "sidestream+no-otel+pass",
    "sidestream+continuous",
    "sidestream+resume",
    "sidestream+redis",
    "nginx",
    "tutorial",
    "alt",
    "alt+no-otel",
)
BSP_DELAY_S = 5.0  # OTEL_BSP_SCHEDULE_DELAY with telemetry on: the SDK's default


def variant(target: str) -> tuple[str, frozenset[str]] | None:
    """A sidestream target's tree (`sidestream` or `alt`) and its `VARIANTS`, or None for a
    target that is not sidestream (or names a variant twice or one that does not exist)."""
    base, *changes = target.split("+")
    if base not in ("sidestream", "alt") or len(set(changes)) != len(changes):
        return None
    found = frozenset(changes)
    if not found <= VARIANTS.keys() or any(pair <= found for pair in EXCLUSIVE):
        return None
    return base, found


def telemetry_on(target: str) -> bool:
    """Does this target export telemetry (sidestream as shipped, or a variant that keeps it)?"""
    found = variant(target)
    return found is not None and "no-otel" not in found[1]


def known(target: str) -> bool:
    return target in ("direct", "nginx", "tutorial") or variant(target) is not None


def pin(cores: set[int]) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, cores)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, and not one handed out before in this process: the
    kernel may give a just-closed port again, and `--together` starts several sessions."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s: {proc.args!r}")


def fetch(port: int, path: str, timeout: float = 5.0) -> bytes:
    """A blocking GET with `Connection: close`; returns the body (no chunked bodies here)."""
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1]


def sink_exports(port: int) -> int:
    """How many exports (all signals) the bench's OTLP sink has received so far."""
    return sum(json.loads(fetch(port, "/count")).values())


def wait_export(sink_port: int, before: int, timeout: float) -> bool:
    """Wait until the sink has received more than `before` exports; False on timeout."""
    deadline = time.monotonic() + timeout
    while sink_exports(sink_port) <= before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def warm_up(port: int, n: int = 20) -> None:
    """A few short streams through the target so pools and caches are warm before measuring."""
    body = b'{"model":"emulator","messages":[{"role":"user","content":"hi"}],"stream":true}'
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nX-Emulator-TTFT-Ms: 0\r\nX-Emulator-ITL-Ms: 0\r\n"
        b"X-Emulator-Tokens: 5\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    for attempt in range(n + 50):
        try:
            with socket.create_connection(("127.0.0.1", port), 5) as s:
                s.sendall(req)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            if b"[DONE]" in data:
                n -= 1
                if n <= 0:
                    return
                continue
        except OSError:
            pass
        time.sleep(0.1)
        if attempt > n + 40:
            break
    raise RuntimeError(f"warm-up through port {port} failed")


@dataclass
class Session:
    """One fresh set of processes: the emulator, maybe a proxy; `port` is where clients go."""

    target: str
    workdir: Path
    sink_port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    upstream_port: int = 0
    port: int = 0
    proxy: subprocess.Popen[bytes] | None = None
    settle_s: float = 0.0  # idle time after a load that still belongs to its CPU window
    exported: bool = False  # telemetry on: the warm-up's spans reached the sink
    module: str = "sidecar"  # what `python -m` runs as sidestream (bench.lab.hotspots wraps it)
    store: subprocess.Popen[bytes] | None = None  # sidestream+redis: its redis-server

    def spawn(
        self,
        name: str,
        argv: list[str],
        cores: set[int],
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=pin(cores),
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """The proxy's process tree (empty for `direct`)."""
        return tree(self.proxy.pid) if self.proxy is not None else []

    def start(self) -> None:
        otel = telemetry_on(self.target)
        before = sink_exports(self.sink_port) if otel else 0
        self.upstream_port = free_port()
        emulator = self.spawn(
            "emulator",
            [PY, "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{self.upstream_port}"],
            LOAD_CORES,
        )
        wait_port(self.upstream_port, emulator)
        if self.target == "direct":
            self.port = self.upstream_port
        else:
            self.port = free_port()
            found = variant(self.target)
            if found is not None:
                self.proxy = self._start_variant(*found)
            else:
                start: Callable[[], subprocess.Popen[bytes]] = getattr(
                    self, "_start_" + self.target
                )
                self.proxy = start()
            wait_port(self.port, self.proxy)
        warm_up(self.port)
        if otel:
            # Measure the steady state of a sidecar that has been up a while: the first export
            # (lazy imports, the exporter's connection) goes out with the warm-up's spans,
            # before any scenario's CPU window opens.
            self.exported = wait_export(self.sink_port, before, BSP_DELAY_S + 3.0)
            if not self.exported:  # its first export, and what that costs once, may come later
                print(
                    f"bench: {self.target}'s warm-up spans did not reach the sink within "
                    f"{BSP_DELAY_S + 3.0:.0f} s; its first export may fall in a CPU window",
                    file=sys.stderr,
                    flush=True,
                )

    def start_sidestream(
        self,
        otel: bool = False,
        cwd: Path = ROOT,
        sinks: str | None = None,
        usage: str | None = None,
        flags: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        if otel:
            env = {
                "OTEL_SDK_DISABLED": "false",
                "OTEL_TRACES_SAMPLER": "always_on",
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.sink_port}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                # The SDK's defaults, stated: what an operator runs. The CPU window of a
                # scenario waits `settle_s` after the load, so the batch of its spans is
                # exported (and paid for) inside it.
                "OTEL_BSP_SCHEDULE_DELAY": str(int(BSP_DELAY_S * 1000)),
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            }
        else:
            env = {"OTEL_SDK_DISABLED": "true"}
        if sinks is not None:
            env["SIDESTREAM_TELEMETRY_SINKS"] = sinks
        if usage is not None:  # the default is `force`
            env["SIDESTREAM_USAGE"] = usage
        # `BENCH_ALT_PYTHON`: the interpreter the alt targets run on (an A/B of interpreter
        # builds), the benchmark's own when unset.
        python = (os.environ.get("BENCH_ALT_PYTHON") or PY) if cwd != ROOT else PY
        argv = [python, "-m", self.module, "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--upstream", f"http://127.0.0.1:{self.upstream_port}"]
        argv += ["--admin-listen", f"127.0.0.1:{free_port()}", "--drain-timeout", "1", *flags]
        return self.spawn(self.target, argv, PROXY_CORES, env, cwd)

    def _start_variant(self, base: str, changes: frozenset[str]) -> subprocess.Popen[bytes]:
        """sidestream as shipped from this tree or the alt one, with `changes` (`VARIANTS`)."""
        flags: tuple[str, ...] = ("--resume",) if "resume" in changes else ()
        if "redis" in changes:
            flags = ("--resume", *self.redis_store())
        usage = next((mode for mode in ("pass", "continuous") if mode in changes), None)
        otel = "no-otel" not in changes
        if otel:
            self.settle_s = BSP_DELAY_S + 0.5  # the span batch goes out within the window
        alt = base == "alt"
        # `BENCH_ALT_SINKS`: the alt's telemetry sinks (one sink's share), all when unset.
        sinks = os.environ.get("BENCH_ALT_SINKS") if alt and otel else None
        return self.start_sidestream(
            otel=otel, cwd=alt_root() if alt else ROOT, sinks=sinks, usage=usage, flags=flags
        )

    def redis_store(self) -> tuple[str, ...]:
        """A redis-server of the session's own (its CPU counted apart: `store`), and the flags
        that make it sidestream's resume store."""
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--dir", str(self.workdir)]  # no dump.rdb in the tree
        redis = self.store = self.spawn("redis", [*argv, "--appendonly", "no"], LOAD_CORES)
        wait_port(port, redis)
        secret = self.workdir / "resume-secret"  # the store needs one (--resume-secret-file)
        secret.write_text(secrets.token_urlsafe(32))
        return (
            "--resume-store",
            f"redis://127.0.0.1:{port}/0",
            "--resume-secret-file",
            str(secret),
        )

    def _start_tutorial(self) -> subprocess.Popen[bytes]:
        argv = [PY, "-m", "uvicorn", "bench.tutorial:app", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--loop", "uvloop", "--http", "httptools"]
        argv += ["--no-access-log", "--log-level", "warning", "--backlog", "4096"]
        env = {"BENCH_UPSTREAM": f"http://127.0.0.1:{self.upstream_port}"}
        return self.spawn("tutorial", argv, PROXY_CORES, env)

    def _start_nginx(self) -> subprocess.Popen[bytes]:
        conf = self.workdir / "nginx.conf"
        conf.write_text(nginx_conf(self.workdir, self.port, self.upstream_port))
        argv = [nginx_binary() or "nginx", "-p", str(self.workdir), "-c", str(conf)]
        return self.spawn("nginx", [*argv, "-e", "stderr", "-g", "daemon off;"], PROXY_CORES)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def otlp_sink() -> Iterator[int]:
    """`bench.sink` (the OTLP/HTTP receiver sidestream's telemetry exports to) on the load cores;
    yields its port."""
    port = free_port()
    sink = subprocess.Popen(
        [PY, "-m", "bench.sink", str(port)], cwd=ROOT, preexec_fn=pin(LOAD_CORES)
    )
    try:
        wait_port(port, sink)
        yield port
    finally:
        sink.terminate()
        sink.wait()


@contextlib.contextmanager
def session(target: str, sink_port: int, module: str = "sidecar") -> Iterator[Session]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{target.replace('+', '.')}-"))
    s = Session(target, workdir, sink_port, module=module)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def alt_root() -> Path:
    """The tree the `alt` targets run from (`BENCH_ALT`)."""
    alt = os.environ.get("BENCH_ALT")
    if not alt or not (Path(alt) / "sidecar" / "__main__.py").is_file():
        raise RuntimeError("the alt targets need BENCH_ALT=<another sidestream tree>")
    return Path(alt).resolve()


PROXIES = ",".join(t for t in TARGETS if t != "direct")  # what a `--targets` may name
VARIANTS_HELP = "sidestream or alt, then any of " + ", ".join(f"+{v}" for v in VARIANTS)


def proxy_targets(spec: str, error: Callable[[str], object]) -> list[str]:
    """The proxies a `--targets` names (comma-separated), in order; `error` (a parser's) for
    one that is not a proxy or for none; nginx left out, with a line, where not installed."""
    targets = [t for t in spec.split(",") if t]
    if not targets or any(not known(t) or t == "direct" for t in targets):
        error(f"targets are some of {PROXIES} ({VARIANTS_HELP})")
    if "nginx" in targets and nginx_binary() is None:
        print("nginx is not installed: skipped (apt-get install nginx).")
        targets.remove("nginx")
    return targets


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def nginx_conf(workdir: Path, port: int, upstream_port: int) -> str:
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (workdir / sub).mkdir(exist_ok=True)
        os.chmod(workdir / sub, 0o777)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return f"""
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {workdir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 32768; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/client_body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    upstream emulator {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://emulator;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""
