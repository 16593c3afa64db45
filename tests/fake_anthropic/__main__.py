"""Runs the fake in its own process.

    python -m tests.fake_anthropic --host 127.0.0.1 --port 0 [--port-file PATH] [--config JSON]

The socket is bound and listening before the port is announced: the port number is the
first line on stdout and the whole content of ``--port-file`` (written atomically), so a
caller can connect as soon as it reads it. uvloop and httptools are used when installed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import uvicorn

from .server import FakeState, create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_anthropic")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", default=None)
    parser.add_argument("--config", default=None, help="JSON object of settings")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    state = FakeState(**(json.loads(args.config) if args.config else {}))
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)
    port = sock.getsockname()[1]

    config = uvicorn.Config(
        create_app(state),
        log_level=args.log_level,
        access_log=False,
        lifespan="off",
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=60,
        backlog=2048,
    )
    if args.port_file:
        tmp = f"{args.port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(port, flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
