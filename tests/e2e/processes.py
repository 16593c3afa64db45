"""The processes of end-to-end tests: the fake Anthropic API and Parley itself, each
started as its own process (stopped by its own id)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import TEST_KEY, free_port

ROOT = Path(__file__).resolve().parents[2]


class Fake:
    def __init__(self, tmp: Path) -> None:
        port_file = tmp / "fake.port"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fake_anthropic",
                "--port",
                "0",
                "--port-file",
                str(port_file),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"

    def control(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, f"{self.url}/_fake/{path}", json=body, timeout=10)
        response.raise_for_status()
        return response.json()

    def script(self, *entries: Any) -> None:
        self.control("POST", "script", list(entries))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Service:
    def __init__(self, database_url: str, fake_url: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "PARLEY_API_KEYS": f"tenant-a:{TEST_KEY}",
            "ANTHROPIC_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": fake_url,
            "PARLEY_RETRY_BASE_SECONDS": "0.01",
            "PARLEY_RETRY_MAX_SECONDS": "0.05",
            "PARLEY_LOG_LEVEL": "WARNING",
            **env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, "the service exited"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the service did not become ready"
            time.sleep(0.1)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {TEST_KEY}"}
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def signal(self, sig: int) -> None:
        """Send a signal without waiting (SIGKILL: a crash; SIGTERM: a deploy)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> None:
        self.proc.wait(timeout)
