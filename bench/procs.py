"""Child processes of a benchmark: the fake model, Parley and the baseline proxy, each in
its own process group (stopped by its own id, never by name)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

# Runs Parley's own entry point under cProfile; the profile is written when uvicorn
# returns after SIGINT. argv: -c OUTPUT serve-args...
PROFILE_SNIPPET = (
    "import cProfile, sys\n"
    "from app.__main__ import main\n"
    "out = sys.argv[1]\n"
    "args = ['serve', *sys.argv[2:]]\n"
    "cProfile.run('main(args)', out)\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]
    url: str = ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 60.0) -> None:
        """SIGINT to the child (graceful for uvicorn; `uv run` forwards it, and only once:
        a second SIGINT would cut a profile being written), then SIGKILL to its group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)
        self.log.close()


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields after "pid (comm)"


def cpu_seconds(root: int) -> float:
    """User + system CPU time of a process and its descendants so far (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree = {root}
    grew = True
    while grew:
        before = len(tree)
        tree |= {pid for pid, parent in parents.items() if parent in tree}
        grew = len(tree) > before
    return sum(times.get(pid, 0.0) for pid in tree)


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def spawn(
    name: str,
    argv: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Child:
    log_path = log_dir / f"{name}.log"
    log = log_path.open("wb")
    popen = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Child(name, popen, log_path, log)


async def wait_http(child: Child, path: str, limit_seconds: float = 90.0) -> None:
    """Until GET url+path answers 200 (or the child died, or time ran out)."""
    deadline = time.monotonic() + limit_seconds
    async with httpx.AsyncClient(base_url=child.url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited:\n{child.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(path)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{child.name} did not become ready in {limit_seconds}s:\n{child.tail()}")


async def start_fake(log_dir: Path, config: dict[str, Any]) -> Child:
    port_file = log_dir / "fake.port"
    port_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tests.fake_anthropic", "--port", "0"]
    argv += ["--port-file", str(port_file), "--config", json.dumps(config)]
    child = spawn("fake", argv, log_dir)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the fake did not start:\n{child.tail()}")
        await asyncio.sleep(0.05)
    child.url = f"http://127.0.0.1:{int(port_file.read_text())}"
    return child


def parley_env(database_dsn: str, fake_url: str, api_key: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_dsn,
        "PARLEY_MODEL_PROVIDER": "anthropic",
        "ANTHROPIC_API_KEY": "x",
        "ANTHROPIC_BASE_URL": fake_url,
        "PARLEY_API_KEYS": f"bench:{api_key}",
        "PARLEY_LOG_LEVEL": "WARNING",
    }


async def start_parley(
    log_dir: Path,
    env: dict[str, str],
    *,
    profile: Path | None = None,
    checkout: Path = ROOT,
    name: str = "parley",
) -> Child:
    """`python -m app serve` with this interpreter (or the same entry point under
    cProfile), from `checkout` (another checkout of the project runs its own code)."""
    port = free_port()
    serve = ["--host", "127.0.0.1", "--port", str(port)]
    if profile is None:
        argv = [sys.executable, "-m", "app", "serve", *serve]
    else:
        argv = [sys.executable, "-c", PROFILE_SNIPPET, str(profile), *serve]
    child = spawn(name, argv, log_dir, env, cwd=checkout)
    child.url = f"http://127.0.0.1:{port}"
    await wait_http(child, "/healthz")
    return child


async def start_proxy(log_dir: Path, database_dsn: str, fake_url: str, model: str) -> Child:
    port = free_port()
    argv = [sys.executable, "-m", "bench.baseline_proxy", "--port", str(port)]
    argv += ["--database-url", database_dsn, "--anthropic-base-url", fake_url, "--model", model]
    child = spawn("proxy", argv, log_dir)
    child.url = f"http://127.0.0.1:{port}"
    await wait_http(child, "/healthz")
    return child
