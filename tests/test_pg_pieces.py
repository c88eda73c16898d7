"""PostgreSQL loads decode and check the fetched bodies in pieces (P4, docs/benchmarks.md) instead of joining the whole
session first. The pieces are an optimisation only: on every body, clean or damaged, the outcome must be exactly that of
`decode_events` and `verify_checks` over the joined body, the error named the same way (SPEC §5 rev 3, "Damage is never
read as history"). Checked here on many damaged bodies without a server, then end to end on a real one."""

from __future__ import annotations

import random

import pytest

from cairn.persistence.checks import RunningCheck, verify_checks, verify_pieces
from cairn.persistence.codec import decode_events
from cairn.persistence.errors import PersistenceError
from cairn.persistence.events import TurnStart, UserMessage, encode_event
from cairn.persistence.postgres_load import PIECE_ROWS, decode_parts, decode_rows
from cairn.persistence.store import SessionStore


def stored_lines(n: int, rng: random.Random) -> list[bytes]:
    """n event bodies as a writer stores them: write-behind batches, some durable (those carry a check)."""
    events = [UserMessage(seq=i, time=1000 + i, turn=1, step=0, text=f"line {i} " + "x" * rng.randrange(0, 300))
              if i % 7 else TurnStart(seq=i, time=1000 + i, turn=i) for i in range(n)]
    check, lines, i = RunningCheck(), [], 0
    while i < n:
        batch = [(e.seq, encode_event(e)) for e in events[i : i + rng.randrange(1, 40)]]
        stamped, at = check.stamp(batch, durable=rng.random() < 0.5)
        check.advance(at)
        lines += [data for _, data in stamped]
        i += len(batch)
    return lines


def damaged(lines: list[bytes], rng: random.Random) -> list[bytes]:
    lines = list(lines)
    kind = rng.randrange(12)
    k = rng.randrange(len(lines))
    if kind == 0:
        return lines  # clean
    if kind == 1:  # a byte changed inside a text: still JSON
        j = lines[k].find(b"line ")
        if j >= 0:
            lines[k] = lines[k][:j] + b"fine " + lines[k][j + 5 :]
    elif kind == 2:  # a row deleted
        del lines[k]
    elif kind == 3:  # rows lost at the end
        del lines[k:]
    elif kind == 4:  # a check's value changed
        j = lines[k].find(b',"chk":"')
        if j >= 0:
            lines[k] = lines[k][: j + 8] + (b"0" if lines[k][j + 8 : j + 9] != b"0" else b"1") + lines[k][j + 9 :]
    elif kind == 5:  # a check's back offset changed
        j = lines[k].find(b"@")
        if j >= 0:
            lines[k] = lines[k][: j + 1] + b"1" + lines[k][j + 1 :]
    elif kind == 6:  # a check removed
        j = lines[k].find(b',"chk":"')
        if j >= 0:
            lines[k] = lines[k][:j] + b"}"
    elif kind == 7:  # not JSON
        lines[k] = lines[k][:-3]
    elif kind == 8:  # a blank body, in the middle or last
        lines[k] = b""
    elif kind == 9:  # a newline inside a body
        lines[k] = lines[k].replace(b",", b",\n", 1)
    elif kind == 10:  # an unknown event marked ignorable (written by a newer Cairn)
        lines[k] = b'{"type":"x/new","seq":%d,"time":1,"ignorable":true}' % k
    else:  # two rows swapped
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
    return lines


def outcome(call):
    try:
        return "ok", call()
    except (PersistenceError, RecursionError) as e:
        return type(e).__name__, str(e)


def test_pieces_decode_and_check_exactly_like_the_joined_body():
    rng = random.Random(29)
    for case in range(400):
        lines = damaged(stored_lines(rng.randrange(1, 120), rng), rng)
        body = b"".join(line + b"\n" for line in lines)
        rows = [(line,) for line in lines]
        assert outcome(lambda: decode_rows(rows, "db[s]")[0]) == \
               outcome(lambda: decode_events(body, "db[s]", first_line=1, tail_may_be_torn=False)[0]), case
        k = rng.randrange(len(rows) + 1)  # a split load's two halves, cut anywhere (either may be empty)
        assert outcome(lambda: decode_parts([rows[:k], rows[k:]], "db[s]")[0]) == \
               outcome(lambda: decode_events(body, "db[s]", first_line=1, tail_may_be_torn=False)[0]), case
        cuts = sorted(rng.sample(range(1, len(lines)), min(len(lines) - 1, rng.randrange(0, 6)))) if lines else []
        pieces = [b"".join(line + b"\n" for line in lines[a:b]) for a, b in zip([0] + cuts, cuts + [len(lines)])]
        pieces = [p for p in pieces if p]
        assert outcome(lambda: verify_pieces(pieces, "db[s]", first_line=0, unit="seq")) == \
               outcome(lambda: verify_checks(body, 0, len(body), "db[s]", first_line=0, unit="seq")), case


def test_a_piece_that_does_not_end_a_line_is_checked_as_the_joined_body():
    lines = stored_lines(50, random.Random(1))
    body = b"".join(line + b"\n" for line in lines)
    half = len(body) // 2
    assert verify_pieces([body[:half], body[half:]], "p", 0) == verify_checks(body, 0, len(body), "p", 0)


@pytest.fixture
def pg_store(tmp_path, pg_database_url):
    return SessionStore(tmp_path / "home", "postgres", database_url=pg_database_url)


def write(store: SessionStore, n: int) -> list[bytes]:
    opened = store.create(cwd="/w", session_id="s", created=999)
    events = [UserMessage(seq=i, time=1000 + i, turn=1, step=0, text=f"event {i}") for i in range(n)]
    for i in range(0, n, 300):
        opened.writer.append([(e.seq, encode_event(e)) for e in events[i : i + 300]], durable=True)
    opened.writer.close()
    opened.lock.release()
    return [encode_event(e) for e in events]


def test_a_session_of_several_pieces_loads_whole_and_damage_in_any_piece_is_named(pg_store, pg_database_url):
    from pg_helpers import connect_to

    n = 2 * PIECE_ROWS + 500
    write(pg_store, n)
    assert [e.seq for e in pg_store.inspect("s").events] == list(range(n))
    with connect_to(pg_database_url) as db:
        db.execute("UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), 'event 2100', 'event 2101'), 'UTF8') WHERE seq = 2100")
    with pytest.raises(PersistenceError, match=r"changed after they were written \(the check of seqs 2099–2399"):
        pg_store.inspect("s")
    with connect_to(pg_database_url) as db:
        db.execute("UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), 'event 2101', 'event 2100'), 'UTF8') WHERE seq = 2100")
        db.execute("DELETE FROM events WHERE seq = 1500")
    with pytest.raises(PersistenceError, match="seq 1501 where 1500 was expected"):
        pg_store.inspect("s")


# -- split loads: a large session is fetched in two halves, on two connections in one snapshot ------------------------


@pytest.fixture
def split_small(monkeypatch):
    """Split sessions of more than 1,000 seqs (instead of SPLIT_SEQS): the tests' sessions are small."""
    from cairn.persistence import postgres

    monkeypatch.setattr(postgres, "SPLIT_SEQS", 1000)


def test_a_split_load_reads_the_whole_session_and_names_damage_in_either_half(pg_store, pg_database_url, split_small):
    from pg_helpers import connect_to

    n = 2 * PIECE_ROWS + 500  # seqs 0–2499: the halves are 0–1249 and 1250–2499
    write(pg_store, n)
    assert [e.seq for e in pg_store.inspect("s").events] == list(range(n))
    assert pg_store.backend._helper is not None  # the second half came through the helper connection
    with connect_to(pg_database_url) as db:
        db.execute("UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), 'event 2100', 'event 2101'), 'UTF8') WHERE seq = 2100")
    with pytest.raises(PersistenceError, match=r"changed after they were written \(the check of seqs 2099–2399"):
        pg_store.inspect("s")
    with connect_to(pg_database_url) as db:
        db.execute("UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), 'event 2101', 'event 2100'), 'UTF8') WHERE seq = 2100")
        db.execute("DELETE FROM events WHERE seq = 1250")  # the first row of the second half
    with pytest.raises(PersistenceError, match="seq 1251 where 1250 was expected"):
        pg_store.inspect("s")
    with connect_to(pg_database_url) as db:
        db.execute("DELETE FROM events WHERE seq = 700")  # the first half
    with pytest.raises(PersistenceError, match="seq 701 where 700 was expected"):
        pg_store.inspect("s")


def test_a_split_load_reads_one_snapshot_while_a_live_writer_appends(tmp_path, pg_database_url, split_small):
    """The live writer commits more events after the loading connection exported its snapshot and before the helper
    fetches the second half: the helper must not see them (without the snapshot it would return seqs 2500–2599)."""
    from cairn.persistence.postgres import PostgresBackend, default_connect

    writer_store = SessionStore(tmp_path / "writer", "postgres", database_url=pg_database_url)
    opened = writer_store.create(cwd="/w", session_id="s", created=999)
    events = [UserMessage(seq=i, time=1000 + i, turn=1, step=0, text=f"event {i}") for i in range(2600)]
    for i in range(0, 2500, 500):
        opened.writer.append([(e.seq, encode_event(e)) for e in events[i : i + 500]], durable=True)
    reads = []

    def connect(url, role, **kwargs):
        conn = default_connect(url, role, **kwargs)
        if role == "read":
            reads.append(conn)
            if len(reads) == 2:  # the helper: the snapshot is exported by now
                opened.writer.append([(e.seq, encode_event(e)) for e in events[2500:]], durable=True)
        return conn

    reader = SessionStore(tmp_path / "reader", PostgresBackend(pg_database_url, connect=connect))
    try:
        assert [e.seq for e in reader.inspect("s").events] == list(range(2500))
        assert len(reads) == 2
        assert [e.seq for e in reader.inspect("s").events] == list(range(2600))  # the next load sees them
    finally:
        reader.backend.close()
        opened.writer.close()
        opened.lock.release()


def test_a_split_load_whose_helper_connection_is_killed_is_retried_then_reported(tmp_path, pg_store, pg_database_url,
                                                                                split_small):
    """The server ends the helper's connection (a real admin termination): the load is retried on new connections,
    and when every helper is killed the reader gets one readable StoreUnavailable, not a traceback."""
    from pg_helpers import admin

    from cairn.persistence.errors import StoreUnavailable
    from cairn.persistence.postgres import PostgresBackend, default_connect

    write(pg_store, 2500)
    reads, kill = [], {"helpers": "first"}

    def connect(url, role, **kwargs):
        conn = default_connect(url, role, **kwargs)
        if role == "read":
            reads.append(conn)
            helper = len(reads) % 2 == 0  # every second read connection is a load's helper
            if helper and (kill["helpers"] == "all" or len(reads) == 2):
                with admin() as db:
                    assert db.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,)).fetchone()[0]
        return conn

    reader = SessionStore(tmp_path / "reader", PostgresBackend(pg_database_url, connect=connect))
    try:
        assert [e.seq for e in reader.inspect("s").events] == list(range(2500))
        assert len(reads) == 4  # reader + helper, killed; then both anew
        reader.backend.close()
        kill["helpers"] = "all"
        with pytest.raises(StoreUnavailable, match=r"cannot read session 's' from postgresql://"):
            reader.inspect("s")
    finally:
        reader.backend.close()


def test_a_split_load_without_a_second_connection_fetches_it_all_on_one(tmp_path, pg_store, pg_database_url,
                                                                        split_small):
    """No second connection to be had (the server's connection limit: not something to do to the shared server, so
    the connect seam refuses it): the load still returns the whole session, on the one connection, no retry."""
    import psycopg

    from cairn.persistence.postgres import PostgresBackend, default_connect

    write(pg_store, 2500)
    reads = []

    def connect(url, role, **kwargs):
        if role == "read":
            reads.append(role)
            if len(reads) == 2:
                raise psycopg.OperationalError("FATAL:  sorry, too many clients already")
        return default_connect(url, role, **kwargs)

    reader = SessionStore(tmp_path / "reader", PostgresBackend(pg_database_url, connect=connect))
    try:
        assert [e.seq for e in reader.inspect("s").events] == list(range(2500))
        assert len(reads) == 2 and reader.backend._helper is None  # the reader was not dropped and retried
        assert [e.seq for e in reader.inspect("s").events] == list(range(2500))  # the next load has its helper
        assert reader.backend._helper is not None
    finally:
        reader.backend.close()
