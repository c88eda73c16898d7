"""The real PostgreSQL server the tests talk to, and a private schema per test so tests never see each other's rows.

The server is `CAIRN_TEST_DATABASE_URL` (default: this project's machines' service, 127.0.0.1:5432, trust auth, database
`test`). An unreachable server fails the test that needs it (it is never skipped): CI must not go green without it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import psycopg
import pytest

PG_URL = os.environ.get("CAIRN_TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"


def admin() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} (set CAIRN_TEST_DATABASE_URL): {e}", pytrace=False)


def schema_url(schema: str, base: str = PG_URL) -> str:
    """`base` with the schema as its search path: every unqualified table Cairn creates or reads lives there."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def fresh_schema(prefix: str = "t") -> Iterator[tuple[str, str]]:
    """(schema, URL) of a new empty schema, dropped with everything in it afterwards."""
    schema = f"cairn_{prefix}_{secrets.token_hex(5)}"
    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema, schema_url(schema)
    finally:
        with admin() as conn:
            conn.execute("SET lock_timeout = '20s'")  # a transaction a test left open fails the drop, never hangs it
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def connect_to(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


class PrivateServer:
    """A PostgreSQL server of the test's own (initdb in a temporary directory, a Unix socket only), for what must not
    be done to the shared one: restarting it, filling its disk. Runs as the `postgres` user when the tests run as root
    (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
        if not bins:
            pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)",
                        pytrace=False)
        self.bin = bins[-1].parent
        self.dir = Path(tempfile.mkdtemp(prefix="cairn-pg-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.url = f"postgresql://postgres@/postgres?host={self.dir}&port=5432"
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-N")

    def _pg(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{tool} failed: {proc.stdout}{proc.stderr}"

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w",
                 "-o", f"-p 5432 -k {self.dir} -c listen_addresses=''", "start")

    def restart(self) -> None:
        """A fast shutdown (every connection is terminated) and a start."""
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-m", "fast",
                 "-o", f"-p 5432 -k {self.dir} -c listen_addresses=''", "restart")

    def halt(self) -> None:
        """Stop the server and keep its data (start() brings it back)."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def chown(self, path: Path) -> None:
        if self._as_postgres:
            shutil.chown(path, "postgres", "postgres")

    def stop(self) -> None:
        try:
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    server = PrivateServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
