"""Who writes which session, across the fleet (SPEC §13): every live writer of a database in one query.

A live session holds its advisory lock on a connection of its own, named `cairn <host> <pid>` (postgres_connections);
the server knows when that connection started. So one query over `pg_locks` (this database's granted advisory locks)
joined with `pg_stat_activity` gives, for every session at once, the host, pid and start of its writer's lock
connection: `cairn sessions --all` costs one query for the writers, however many sessions there are. A lock nobody
holds is a session nobody writes, whatever host wrote it last. Text and plain values only: no psycopg.
"""

from __future__ import annotations

from typing import Any, Iterable

from .backend import LiveWriter
from .postgres_connections import _dead_here, parse_holder
from .postgres_schema import _key_parts, lock_key

# `backend_start` is NULL for a connection of another role unless this one may read all statistics
# (pg_read_all_stats): `since` is then unknown, while `application_name` (host and pid) is shown to every role.
WRITERS = """SELECT l.classid::bigint, l.objid::bigint, a.application_name,
        (extract(epoch FROM a.backend_start) * 1000)::bigint
    FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def live_writers(conn: Any, schema: str, session_ids: Iterable[str]) -> dict[str, LiveWriter]:
    """The writer of each live session among `session_ids` of `schema`, from one query on `conn`. A holder that is a
    dead process of this machine is left out: the server has only not yet noticed its closed socket."""
    by_key: dict[tuple[int, int], str] = {}
    for session_id in session_ids:
        parts = _key_parts(lock_key(schema, session_id))
        by_key[parts["hi"], parts["lo"]] = session_id
    found: dict[str, LiveWriter] = {}
    for hi, lo, app_name, since in conn.execute(WRITERS).fetchall():
        if (hi, lo) not in by_key:
            continue  # another schema's session, or not a session's lock at all
        session_id = by_key[hi, lo]
        host, pid = parse_holder(app_name)
        if host is not None and _dead_here(host, pid):
            continue
        found[session_id] = LiveWriter(host, pid, since)
    return found
