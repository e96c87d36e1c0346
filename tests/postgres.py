"""A real PostgreSQL server for the tests: one cluster per test session, from the installed server binaries.

initdb refuses to run as root, so under root the cluster belongs to the `postgres` system user (commands run through
`runuser`), in a temporary folder of its own outside pytest's root-only tmp tree. The server listens on a free
loopback port (password login, scram-sha-256) and a unix socket in that folder, and is stopped by `pg_ctl stop` on
its own data folder.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

from tests.servers import free_port

SUPERUSER = "rubricem"
CLUSTER_OWNER = "postgres"  # the Debian package's system user


def server_bindir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: on PATH, or Debian's /usr/lib/postgresql/N/bin (newest N)."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    return Path(max(found, key=_major_version)).parent if found else None


def _major_version(initdb: str) -> int:
    match = re.search(r"/(\d+)/bin/initdb$", initdb)
    return int(match.group(1)) if match else 0


def why_unavailable() -> str | None:
    """Why no server can be started here, or None when one can."""
    bindir = server_bindir()
    if bindir is None or not all((bindir / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
        return ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: `make install` installs Debian's "
                "postgresql package")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(CLUSTER_OWNER)
        except KeyError:
            return f"running as root and there is no {CLUSTER_OWNER!r} system user to own the test cluster"
    return None


class PostgresServer:
    """A throwaway cluster: `start()` it, create one database per test, `stop()` it (the folder is removed)."""

    def __init__(self) -> None:
        """Pick the binaries, a folder, a port and a password; nothing runs yet."""
        bindir = server_bindir()
        if bindir is None:
            raise RuntimeError(why_unavailable() or "no PostgreSQL binaries")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="rubricem-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.password = secrets.token_urlsafe(16)
        self._owner = pwd.getpwnam(CLUSTER_OWNER) if os.geteuid() == 0 else None
        if self._owner is not None:
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)

    def _run(self, binary: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", CLUSTER_OWNER, "--"] if self._owner is not None else []
        return subprocess.run([*prefix, str(self.bindir / binary), *args], capture_output=True, text=True,
                              timeout=120, check=False)

    def start(self) -> None:
        """initdb, then `pg_ctl start -w`.

        Raises:
            RuntimeError: initdb or the server failed, with their output.
        """
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._owner is not None:
            os.chown(pwfile, self._owner.pw_uid, self._owner.pw_gid)
        pwfile.chmod(0o600)
        init = self._run("initdb", ["-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}", "-E", "UTF8",
                                    "--no-locale", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"])
        pwfile.unlink()
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        # fsync off: a test server that loses its data in an OS crash loses nothing of value, and runs faster.
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                   "-c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB")
        started = self._run("pg_ctl", ["-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options,
                                       "start"])
        if started.returncode != 0:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed:\n{started.stdout}\n{started.stderr}\n{tail}")

    def url(self, dbname: str, password: str | None = None) -> str:
        """A postgresql:// URL for a database of this server, over TCP with the superuser's password."""
        return f"postgresql://{SUPERUSER}:{self.password if password is None else password}@127.0.0.1:" \
               f"{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, ending any session a test left open on it."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        """`pg_ctl stop` (fast shutdown) and remove the folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", ["-D", str(self.data), "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
