"""The shell examples of the docs run as a reader runs them, on free ports.

Each ```sh block of README.md and docs/*.md is run by bash, line by line as written, with
three substitutions: the docs' ports (8000 upstream, 8080 traffic, 9901 admin) become free
ones; an inference server the test cannot run (`vllm serve`, llama-cpp-python's server)
becomes the emulator on its port; and a server started in the foreground or with `&` is
waited for (its port accepts) before the next line, as a reader waits for its start line.
Where the docs show or state output, the test checks it. A block this file does not know
fails `test_every_shell_block_is_run_or_says_why_not`, so a new example cannot go unrun.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.support.sseparse import parse
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SH_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.M | re.S)
UPSTREAMS = ("vllm serve", "python -m llama_cpp.server")  # stood in for by the emulator
SERVERS = ("sidestream", "python -m sidecar", "python -m sidecar.emulator")
AWAIT_PORT = """await_port() {  # the test's: wait until 127.0.0.1:$1 accepts (20 s at most)
  for _ in $(seq 400); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "nothing listens on port $1" >&2; return 1
}"""
BOUND = 60  # seconds a block may run; past it the test fails, never hangs
# Blocks no test here runs, by their first line, each with the reason.
NOT_RUN = {
    "BENCH_ALT=/tmp/wt-old python -m bench.paced": "benchmark runs of minutes against another "
    "built tree; bench's own tests (tests/unit/test_bench_*) run the commands' code",
}


def blocks() -> dict[str, tuple[Path, str]]:
    """Every shell block of the docs, by its first line."""
    found = {}
    for doc in DOCS:
        for block in SH_BLOCK.findall(doc.read_text()):
            found[block.splitlines()[0].strip()] = (doc, block)
    return found


def block(first_line: str) -> str:
    """The block that starts with `first_line` (the test fails when the docs lost it)."""
    for line, (_, text) in blocks().items():
        if line.startswith(first_line):
            return text
    pytest.fail(f"no shell block starts with {first_line!r} any more", pytrace=False)


@dataclass(frozen=True)
class Ports:
    upstream: int
    traffic: int
    admin: int

    def localize(self, text: str) -> str:
        """The docs' ports replaced by these."""
        for documented, port in ((8000, self.upstream), (8080, self.traffic), (9901, self.admin)):
            text = re.sub(rf"\b{documented}\b", str(port), text)
        return text


@pytest.fixture
def ports() -> Ports:
    return Ports(free_port(), free_port(), free_port())


def commands(text: str) -> list[str]:
    """The block's commands, a line continued by `\\` joined to the next."""
    return [c.strip() for c in re.sub(r"\\\n", " ", text).splitlines() if c.strip()]


def listen_port(command: str) -> int:
    words = shlex.split(command, comments=True)
    return int(words[words.index("--listen") + 1].rpartition(":")[2])


def script(text: str, ports: Ports) -> str:
    """Bash for the block: its commands as written but for the module docstring's three
    substitutions."""
    lines = ["set -e", AWAIT_PORT]
    for command in commands(ports.localize(text)):
        if command.startswith(UPSTREAMS):
            command = f"python -m sidecar.emulator --listen 127.0.0.1:{ports.upstream} &"
        if command.startswith(SERVERS):
            if not command.split("#")[0].rstrip().endswith("&"):
                command = command.split("  #")[0].rstrip() + " &"
            lines += [command, f"await_port {listen_port(command)}"]
            continue
        lines.append(command)
    return "\n".join(lines) + "\n"


class Shell:
    """Bash processes run in a session of their own, all of it ended with the test."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.started: list[subprocess.Popen[bytes]] = []
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        self.env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}

    def start(
        self, argv: list[str], output: Path, cwd: Path | None = None, **env: str
    ) -> subprocess.Popen[bytes]:
        with output.open("wb") as sink, output.with_suffix(".err").open("wb") as errors:
            process = subprocess.Popen(
                argv, cwd=cwd or self.cwd, env={**self.env, **env}, stdout=sink,
                stderr=errors, start_new_session=True,
            )  # fmt: skip
        self.started.append(process)
        return process

    def run(self, bash: str, output: Path) -> str:
        """Run `bash` to its end (its servers stay up); its standard output (kept apart from
        its errors, as curl's progress meter is), which the test fails on unless it exits 0."""
        process = self.start(["bash", "-c", bash], output)
        try:
            code = process.wait(BOUND)
        except subprocess.TimeoutExpired:
            code = None
        text = output.read_text(errors="replace")
        errors = output.with_suffix(".err").read_text(errors="replace")
        assert code == 0, f"exit {code}:\n{bash}\n---\n{text}\n---\n{errors}"
        return text

    def close(self) -> None:
        for process in self.started:
            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(10)
                    break
                except subprocess.TimeoutExpired:
                    continue


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    tool("curl")
    running = Shell(tmp_path)
    try:
        yield running
    finally:
        running.close()


def events_of(output: str) -> list[tuple[str, str, str]]:
    return parse(output.encode())


def assert_whole_stream(output: str) -> None:
    """curl's output is a chat stream: content chunks, then `[DONE]`."""
    events = events_of(output)
    assert events and events[-1][1] == "[DONE]", output
    text = "".join(
        choice["delta"].get("content") or ""
        for _, data, _ in events[:-1]
        for choice in json.loads(data)["choices"]
    )
    assert text.strip(), output


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Until `check()` holds: a bound on a wait, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def test_every_shell_block_is_run_or_says_why_not() -> None:
    """Rule: every shell block of the docs is one a test here runs, or one named in
    `NOT_RUN` with the reason (a new example cannot go unrun)."""
    run = (
        "make run", "curl -N http://127.0.0.1:8080/v1/chat/completions", "vllm serve",
        "python -m llama_cpp.server", "python -m sidecar.emulator", "# the first request",
    )  # fmt: skip
    for first, (doc, _) in blocks().items():
        known = first.startswith(run) or any(first.startswith(n) for n in NOT_RUN)
        assert known, f"{doc.name}: a shell block no test runs: {first}"


def test_make_run_then_the_demo_curl_streams_tokens_and_logs_the_stream(
    shell: Shell, ports: Ports, tmp_path: Path
) -> None:
    """Rule: README's `make run` starts the emulator and the sidecar on the `DEMO_*` ports;
    the README's curl streams tokens through it to `[DONE]`; the sidecar then prints the
    stream's JSON access line (outcome `completed`), and the admin `/metrics` shows it.

    `make run`'s install step is not remade (`-o`): the suite runs in the tree `make test`
    installed; the block's `make test` is this suite itself, not run again."""
    assert block("make run").splitlines()[0].startswith("make run")
    demo = tmp_path / "make-run.out"
    env = {
        "DEMO_UPSTREAM_PORT": str(ports.upstream),
        "DEMO_PORT": str(ports.traffic),
        "DEMO_ADMIN_PORT": str(ports.admin),
    }
    make = ["make", "--no-print-directory", "-o", ".venv/.installed", "run"]
    shell.start(make, demo, cwd=ROOT, **env)
    shell.run(f"{AWAIT_PORT}\nawait_port {ports.traffic}\n", tmp_path / "await.out")
    curl = script(block("curl -N http://127.0.0.1:8080/v1/chat/completions"), ports)
    assert_whole_stream(shell.run(curl, tmp_path / "curl.out"))

    def access_line() -> dict[str, object] | None:
        for line in demo.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"outcome"' in line:
                return dict(json.loads(line))
        return None

    wait_for(lambda: access_line() is not None, "the stream's access line")
    assert access_line()["outcome"] == "completed"  # type: ignore[index]
    status, metrics = get(f"http://127.0.0.1:{ports.admin}/metrics")
    assert status == 200 and 'outcome="completed"' in metrics


@pytest.mark.parametrize("first", ["vllm serve", "python -m llama_cpp.server"])
def test_the_sidecar_next_to_an_inference_server_serves_streams(
    shell: Shell, ports: Ports, tmp_path: Path, first: str
) -> None:
    """Rule: the README's `sidestream` line next to vLLM, and next to llama-cpp-python's
    server, starts as written (the server stood in for by the emulator) and relays a chat
    stream; next to vLLM (`/health`) its admin port says ready."""
    shell.run(script(block(first), ports), tmp_path / "block.out")
    chat = (
        f"curl -sN http://127.0.0.1:{ports.traffic}/v1/chat/completions "
        """-d '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'"""
    )
    assert_whole_stream(shell.run(chat, tmp_path / "curl.out"))
    assert get(f"http://127.0.0.1:{ports.admin}/livez")[0] == 200
    if first == "vllm serve":
        wait_for(lambda: get(f"http://127.0.0.1:{ports.admin}/readyz")[0] == 200, "/readyz")


def test_the_http2_example_streams_over_h2c(shell: Shell, ports: Ports, tmp_path: Path) -> None:
    """Rule: the README's HTTP/2 block (the emulator, the sidecar with `--http2`, curl with
    prior knowledge) runs as written and curl prints a whole stream."""
    output = shell.run(script(block("python -m sidecar.emulator"), ports), tmp_path / "h2.out")
    assert_whole_stream(output)


def test_the_resume_examples_replay_from_the_point_and_stop(
    shell: Shell, ports: Ports, tmp_path: Path
) -> None:
    """Rule: docs/resume.md's curl block, against a sidecar with `--resume`, prints the first
    stream whole, then (`?after=12`) its events from 13 to the end under the same id, and the
    stop answers without output."""
    prelude = (
        f"python -m sidecar.emulator --listen 127.0.0.1:{ports.upstream} &\n"
        f"sidestream --upstream http://127.0.0.1:{ports.upstream} "
        f"--listen 127.0.0.1:{ports.traffic} --admin-listen off --resume &\n"
    )
    shell.run(script(prelude, ports), tmp_path / "servers.out")
    output = shell.run(script(block("# the first request"), ports), tmp_path / "resume.out")
    events = events_of(output)
    ids = [event[2] for event in events]
    stream_id = ids[0].rpartition(":")[0]
    whole = 0  # the first stream: ids 1, 2, ... in order
    while whole < len(ids) and ids[whole] == f"{stream_id}:{whole + 1}":
        whole += 1
    assert whole > 12 and events[whole - 1][1] == "[DONE]", output
    assert ids[whole:] == ids[12:whole], output  # then 13 to the end again
    assert events[-1][1] == "[DONE]"
