"""A throwaway Postgres cluster of a test's own (initdb into a temporary directory, on a
free port), so a test can stop and restart the database under a running service
without touching the shared server. Started and stopped by its own pg_ctl; removed
afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import free_port


def _bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: beside `pg_ctl` on PATH, else Debian's newest."""
    found = shutil.which("pg_ctl")
    candidates = [Path(found).parent] if found else []
    candidates += [
        Path(d)
        for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    ][::-1]
    return next(
        (d for d in candidates if (d / "initdb").exists() and (d / "pg_ctl").exists()), None
    )


class Cluster:
    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            pytest.skip("initdb/pg_ctl not found")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="parley-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        # Postgres refuses to run as root: run its tools as the `postgres` user then.
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *args],
            check=True,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        # -w: returns once the server accepts connections.
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-w", "-t", "30", "start")

    def stop(self) -> None:
        """Stop at once (`immediate`: connections are cut, as in a crash or failover)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
