"""`make compose-test`: the Docker Compose stack, built and run as an operator would.

    python -m tests.compose [--keep]

Builds the image, brings the stack up (docker-compose.yml with tests/compose/compose.test.yml:
its own settings, free ports, the fake Anthropic API as the model), waits for health,
creates a session with a key, posts a turn, restarts the whole stack and finds the session
again, stops the API during a streaming turn and checks that it exits by itself (not
killed) and that the run is not left `running`: ended as failed (`interrupted`) or carried
on to its end once the API is back. Then it tears everything down, volumes included
(unless --keep). Needs a Docker engine, the Compose v2 plugin and the base images.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "parley-compose-test"
KEY = "compose-test-key-0123456789"
FINAL = {"completed", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    def __init__(self) -> None:
        self.env = {
            **os.environ,
            "PARLEY_TEST_API_PORT": str(free_port()),
            "PARLEY_TEST_FAKE_PORT": str(free_port()),
        }
        self.api = f"http://127.0.0.1:{self.env['PARLEY_TEST_API_PORT']}"
        self.fake = f"http://127.0.0.1:{self.env['PARLEY_TEST_FAKE_PORT']}"
        self.t0 = time.monotonic()

    def step(self, text: str) -> None:
        print(f"[compose-test {time.monotonic() - self.t0:5.1f}s] {text}", flush=True)

    def compose(self, *args: str) -> str:
        """Run a Compose command on the test stack; its output only when it fails."""
        command = ["docker", "compose", "-p", PROJECT, "-f", "docker-compose.yml"]
        command += ["-f", "tests/compose/compose.test.yml", *args]
        result = subprocess.run(command, cwd=ROOT, env=self.env, text=True, capture_output=True)
        if result.returncode != 0:
            raise SystemExit(
                f"failed ({result.returncode}): {' '.join(command)}\n{result.stdout}{result.stderr}"
            )
        return result.stdout

    def psql(self, sql: str) -> str:
        return self.compose(
            "exec", "-T", "postgres", "psql", "-U", "parley", "-d", "parley", "-tAc", sql,
        ).strip()  # fmt: skip

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.api, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
        )

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.api}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        print(self.compose("logs", "--tail", "50"))
        raise SystemExit(f"the API did not become healthy in {timeout:.0f} s")

    def up(self) -> None:
        self.compose("up", "-d", "--quiet-pull")
        self.wait_healthy()


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SystemExit(f"FAILED: {message}")


def run_status(stack: Stack, sid: str, run_id: str) -> dict[str, Any]:
    with stack.client() as client:
        response = client.get(f"/sessions/{sid}/runs/{run_id}")
        check(response.status_code == 200, f"GET run: {response.status_code} {response.text}")
        return dict(response.json())


def stop_during_a_streaming_turn(stack: Stack, sid: str) -> None:
    # About 400 chunks 0.1 s apart: the turn streams for some 40 s, longer than the default
    # shutdown grace (10 s), which is longer than Compose's default stop timeout (10 s).
    httpx.post(f"{stack.fake}/_fake/config", json={"chunk_delay": 0.1}).raise_for_status()
    httpx.post(f"{stack.fake}/_fake/script", json=["word " * 1300]).raise_for_status()
    events: list[tuple[str, str]] = []
    first_delta = threading.Event()

    def read() -> None:
        with (
            stack.client() as client,
            client.stream(
                "POST", f"/sessions/{sid}/messages", json={"content": "long", "stream": True}
            ) as response,
        ):
            name = ""
            try:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        events.append((name, line[6:]))
                        if name == "text.delta":
                            first_delta.set()
            except httpx.HTTPError:
                pass  # the server went away: what matters is what the run became
        first_delta.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    check(first_delta.wait(60), "no text arrived")
    check(events[0][0] == "run.started", f"first event {events[:1]}")
    run_id = json.loads(events[0][1])["id"]
    stack.step(f"streaming run {run_id}: stopping the API mid-stream")
    started = time.monotonic()
    stack.compose("stop", "api")
    took = time.monotonic() - started
    reader.join(30)
    container = stack.compose("ps", "-a", "-q", "api").strip()
    exit_code = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.ExitCode}}", container],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    stack.step(f"the API stopped in {took:.1f} s, exit code {exit_code}")
    check(exit_code == "0", f"the API was killed (exit {exit_code}), not shut down")
    query = f"SELECT status FROM runs WHERE id = '{uuid.UUID(run_id)}'"  # noqa: S608 (a UUID)
    status = stack.psql(query)
    stack.step(f"with the API down, the run is {status!r}")
    stack.step(f"the stream ended with {[name for name, _ in events[-3:]]}")

    stack.compose("start", "api")
    stack.wait_healthy()
    deadline = time.monotonic() + 90
    while (run := run_status(stack, sid, run_id))["status"] not in FINAL:
        check(time.monotonic() < deadline, f"the run is still {run['status']} after restart")
        time.sleep(1)
    stack.step(f"after restart the run is {run['status']} {run.get('error') or ''}")
    if run["status"] == "failed":
        check(run["error"]["type"] == "interrupted", f"failed with {run['error']}")
    else:
        check(run["status"] == "completed", f"ended as {run['status']}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.compose")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    args = parser.parse_args()
    stack = Stack()
    try:
        stack.step("building the image")
        stack.compose("build")
        stack.step("bringing the stack up")
        stack.up()
        with stack.client() as client:
            session = client.post("/sessions", json={"title": "compose"})
            check(session.status_code == 201, f"create session: {session.text}")
            sid = session.json()["id"]
            turn = client.post(f"/sessions/{sid}/messages", json={"content": "hello"})
            check(turn.status_code == 200, f"post a turn: {turn.text}")
            check(turn.json()["run"]["status"] == "completed", f"turn: {turn.text}")
            check(client.get("/sessions").status_code == 200, "list sessions")
        stack.step(f"session {sid}: a turn completed; restarting the stack (down, up)")
        stack.compose("down")
        stack.up()
        with stack.client() as client:
            found = client.get(f"/sessions/{sid}/messages")
            check(found.status_code == 200, f"session after restart: {found.text}")
            roles = [m["role"] for m in found.json()["data"]]
            check(roles == ["user", "assistant"], f"messages after restart: {roles}")
        stack.step("the session and its messages survived the restart")
        stop_during_a_streaming_turn(stack, sid)
        stack.step("passed")
    except BaseException:
        print(stack.compose("logs", "--no-color", "--tail", "40"), flush=True)
        raise
    finally:
        if args.keep:
            stack.step(f"kept: docker compose -p {PROJECT} ... down -v")
        else:
            stack.step("tearing down")
            stack.compose("down", "-v", "--remove-orphans")


if __name__ == "__main__":
    sys.exit(main())
