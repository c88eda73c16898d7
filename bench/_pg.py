"""A private schema on a real PostgreSQL server for the p*_pg_* benchmarks (issue 18).

The server is CAIRN_BENCH_DATABASE_URL (default: this project's machines' service, 127.0.0.1:5432, database `test`).
The schema is created empty, set as CAIRN_DATABASE_URL for the stores the benchmark opens, and dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import quote

import psycopg

BASE_URL = os.environ.get("CAIRN_BENCH_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"


@contextmanager
def pg_schema(prefix: str) -> Iterator[str]:
    schema = f"cairn_bench_{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in BASE_URL else "?"
    url = f"{BASE_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    os.environ["CAIRN_DATABASE_URL"] = url
    try:
        yield url
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def server_settings(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        wal_sync = conn.execute("SHOW wal_sync_method").fetchone()[0]
    return f"PostgreSQL {version}, synchronous_commit={sync}, fsync={fsync}, wal_sync_method={wal_sync}"
