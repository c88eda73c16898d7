"""The PostgreSQL backend's tables and the statements its writer sends (SPEC §5 rev 2).

Tables (created on first write, in the connection's current schema, versioned by a `cairn_schema` row; a newer schema is
refused like a newer file format): `sessions` (id, cwd, created, updated, header, writer, last_seq) and `events`
(session_id, seq, time, type, body), primary key (session_id, seq). `body` is the exact JSON line the JSONL backend
writes, `header` the exact JSONL header line, so a log reads back byte for byte whatever backend wrote it.

The newest seq (SPEC §5 rev 3, issue 39): every write stamps `sessions.last_seq` with the newest seq it stores, in the
statement that checks the writer, so in the same transaction as the rows. A crash takes a commit whole, rows and stamp
together, so the stored events always end at `last_seq`; when they end before it, rows were deleted behind Cairn's back,
and a load says so (exit 4), where a deleted newest row would otherwise read as an interrupted turn. The column came
after schema version 1 and is optional: a writer adds it when it is missing (an older Cairn ignores it and leaves it
behind, never ahead), a session without it (NULL) loads as before, and a user who may not alter the tables still works,
unchecked.

Each write is one statement (check the writer and its lock, stamp `updated` and `last_seq`, insert the batch);
here too the columns and the advisory-lock key those statements take. Text and values only: no psycopg.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

from .errors import PersistenceError, UnsupportedFormat
from .events import raw_decoder

SCHEMA_VERSION = 1
_SCHEMA_LOCK = 0x636169726E5F7363  # transaction-level advisory lock serializing schema creation ("cairn_sc")

DDL = (
    "CREATE TABLE cairn_schema (version integer NOT NULL)",
    """CREATE TABLE sessions (
        id text PRIMARY KEY,
        cwd text NOT NULL,
        created bigint NOT NULL,
        updated bigint NOT NULL,
        header bytea NOT NULL,
        writer text,
        last_seq bigint
    )""",
    """CREATE TABLE events (
        session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq bigint NOT NULL,
        time bigint NOT NULL,
        type text NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (session_id, seq)
    )""",
    # Bodies are stored uncompressed (large ones out of line, as before): a load sends every body, and decompressing
    # pglz is a third of the server's work for it (P4 in docs/benchmarks.md); the price is disk: ~1.3x the JSONL
    # file's size instead of ~0.8x (71 MB instead of 44 MB for P4's 56 MB session). Physical only: the schema version
    # is unchanged, and a database made before keeps its compressed rows (the same ALTER changes later ones).
    "ALTER TABLE events ALTER COLUMN body SET STORAGE EXTERNAL",
)

# The database's oid is a parameter, read once per writer (`database_oid`), not looked up in pg_database at every
# write (5-10 us a write, P1 on PostgreSQL in docs/benchmarks.md).
_HOLDS_LOCK = """EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid = %(lock_pid)s AND objsubid = 1
      AND database = %(db)s::oid AND classid::bigint = %(hi)s AND objid::bigint = %(lo)s)"""

# The writer's check and its `updated` stamp in one statement: 0 rows means "not (or no longer) the writer". Where the
# tables have `last_seq`, the same statement stamps the newest seq the write stores (`top`; NULL: none, kept as it is).
_MARK_SEQ = ", last_seq = GREATEST(last_seq, %(top)s::bigint)"
_STAMP = """UPDATE sessions SET updated = GREATEST(updated, %(t)s){mark}
    WHERE id = %(id)s AND writer = %(token)s AND {holds}"""

# The batch goes in only if the stamp found this writer (the CTE), so the whole write is one statement and the COMMIT
# can go in the same round trip: a refused write commits nothing, and says so by inserting no row.
_INSERT = """WITH stamped AS ({stamp} RETURNING 1)
    INSERT INTO events (session_id, seq, time, type, body)
    SELECT %(id)s, u.s, u.t, u.y, u.b FROM {rows} AS u(s, t, y, b)
    WHERE EXISTS (SELECT 1 FROM stamped)
    ON CONFLICT (session_id, seq) DO UPDATE SET time = excluded.time, type = excluded.type, body = excluded.body"""
# A batch of up to VALUES_ROWS events (a barrier's few) goes as VALUES of plain parameters: as four lists (psycopg
# adapting them, the server unpacking them) it took 65-80 us longer, a fifth of a barrier on a fast local server. A
# larger one (write-behind while an answer streams) goes as four arrays, one statement whatever its size.
VALUES_ROWS = 16
_VALUE_KEYS = [(f"s{i}", f"t{i}", f"y{i}", f"b{i}") for i in range(VALUES_ROWS)]
_ARRAY_ROWS = "unnest(%(seqs)s::bigint[], %(times)s::bigint[], %(types)s::text[], %(bodies)s::bytea[])"


class Statements(NamedTuple):
    """A write's statements: the stamp alone (a barrier with nothing new), a batch as arrays, a batch as VALUES."""

    stamp: str
    arrays: str
    values: dict[int, str]


def _statements(mark: bool) -> Statements:
    stamp = _STAMP.format(mark=_MARK_SEQ if mark else "", holds=_HOLDS_LOCK)
    values = {
        n: _INSERT.format(stamp=stamp, rows="(VALUES " + ", ".join(
            f"(%({s})s::bigint, %({t})s::bigint, %({y})s::text, %({b})s::bytea)" for s, t, y, b in _VALUE_KEYS[:n]) + ")")
        for n in range(1, VALUES_ROWS + 1)
    }
    return Statements(stamp, _INSERT.format(stamp=stamp, rows=_ARRAY_ROWS), values)


STATEMENTS = {True: _statements(True), False: _statements(False)}  # by whether the tables have `last_seq`

# What a writer reads after a lost connection: the session's newest seq as stamped, and its newest stored row.
_TAIL = """SELECT {mark}, e.seq, e.body FROM sessions s
    LEFT JOIN LATERAL (SELECT seq, body FROM events WHERE session_id = s.id ORDER BY seq DESC LIMIT 1) e ON true
    WHERE s.id = %(id)s"""

_HOLDER = """SELECT a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = %(hi)s AND l.objid::bigint = %(lo)s
    LIMIT 1"""

# msgspec writes the tag first: {"type":"turn/start","seq":3,"time":…}. Anything else (an ignorable event) is decoded.
_PREFIX = re.compile(rb'\{"type":"([^"\\]*)","seq":-?\d+,"time":(-?\d+)[,}]')


class NewerSchema(UnsupportedFormat):
    def __init__(self, where: str, version: int) -> None:
        PersistenceError.__init__(
            self,
            f"{where}: the Cairn tables have schema version {version}, made by a newer Cairn (this build knows "
            f"{SCHEMA_VERSION}); upgrade Cairn",
        )
        self.path = where
        self.version = version
        self.reason = f"schema version {version} is newer than this build's {SCHEMA_VERSION}"


def lock_key(schema: str, session_id: str) -> int:
    """A signed 64-bit advisory-lock key for one session of one schema (the database is part of the lock already)."""
    digest = hashlib.blake2b(f"cairn\0{schema}\0{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _key_parts(key: int) -> dict[str, int]:
    """How pg_locks shows a bigint advisory key: classid = high 32 bits, objid = low 32 bits (both unsigned)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}


def event_columns(data: bytes) -> tuple[str, int]:
    """(type, time) of an encoded event, for the table's columns; the body stays the source of truth."""
    match = _PREFIX.match(data)
    if match:
        return match.group(1).decode("utf-8", "replace"), int(match.group(2))
    try:
        raw = raw_decoder.decode(data)
    except Exception:
        return "", 0
    kind, time = (raw.get("type"), raw.get("time")) if isinstance(raw, dict) else (None, None)
    return (kind if isinstance(kind, str) else ""), (time if type(time) is int and -(2**63) <= time < 2**63 else 0)
