"""A throwaway Postgres cluster of the test's own, on a free port in a temporary
directory, that a test may stop and start again: a database that goes away, without
touching the server the rest of the suite uses."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import free_port

BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14)]


def _bin(name: str) -> str:
    for folder in BIN_DIRS:
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: a throwaway cluster needs the Postgres server")
    return found


class Cluster:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str) -> None:
        # Postgres refuses to run as root: then run its tools as the `postgres` user.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            _bin("initdb"),
            "-D",
            str(self.root / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.root / "data"),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        """Gone at once, as in a crash: connections are cut, new ones refused."""
        self._run(_bin("pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="parley-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    cluster = Cluster(root, free_port())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
