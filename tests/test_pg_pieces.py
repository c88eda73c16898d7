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
from cairn.persistence.postgres import PIECE_ROWS, decode_rows
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
