"""Reading a session's rows back (the PostgreSQL backend's load): the bodies fetched in seq order, in one piece or in
two halves side by side (`_Fetch`), and decoded piece by piece as they arrive (`decode_parts`).
"""

from __future__ import annotations

import threading
from operator import attrgetter, itemgetter
from typing import Any, Callable, Iterable, Iterator

import msgspec
import psycopg

from .codec import decode_events, gc_paused
from .events import event_decoder

# A load decodes and checks the bodies in pieces of this many rows (~0.5 MB for typical events): small enough to stay in
# the cache between the join and the decode, large enough that the per-piece work is nothing.
PIECE_ROWS = 1000


def decode_rows(rows: list[tuple[bytes]], location: str) -> tuple[list[Any], list[bytes]]:
    """The events of the fetched bodies (in seq order), and the bodies as pieces of PIECE_ROWS newline-terminated
    lines, for the checks. Exactly what `decode_events` returns for all the bodies joined (or what it raises), but
    without joining them: each piece is decoded while it is still in the cache, and no copy of the whole session is
    made in fresh memory (both were a fifth of a cold load: P4 in docs/benchmarks.md). Only a clean log is decoded
    here; anything else (a line that does not decode, a seq out of place, an ignorable event, a blank last body) is
    left to `decode_events` over the joined bodies, which decides and names it as for every backend."""
    return decode_parts([list(rows)], location)


def decode_parts(parts: Iterable[list[Any]], location: str) -> tuple[list[Any], list[bytes]]:
    """`decode_rows` of the parts' rows one after the other, each part decoded as soon as it is there (a split load
    decodes the first half while the second is still arriving). Where the pieces are cut changes nothing: the outcome
    is that of the joined bodies either way. The parts are emptied as they are read: each row is freed, and each
    piece's seqs are checked, right after the piece is made, while all of it is still in the cache (the same work on
    the whole session afterwards was ~30 ms more CPU for P4's 100k rows)."""
    pieces: list[bytes] = []
    events: list[Any] = []
    clean = True
    last = b""
    with gc_paused():
        for rows in parts:
            if not rows:
                continue
            last = rows[-1][0]
            for i in range(0, len(rows), PIECE_ROWS):
                part = rows[i : i + PIECE_ROWS]
                rows[i : i + PIECE_ROWS] = [None] * len(part)
                part.append((b"",))
                piece = b"\n".join(map(itemgetter(0), part))
                del part
                pieces.append(piece)
                if clean:
                    try:
                        new = event_decoder.decode_lines(piece)
                    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                        clean = False
                        continue
                    clean = list(map(attrgetter("seq"), new)) == list(range(len(events), len(events) + len(new)))
                    events += new
    if not pieces:
        return [], []
    if clean and last:  # a blank last line is cut like a torn tail: decode_events' slow path
        return events, pieces
    events, _ = decode_events(b"".join(pieces), location, first_line=1, tail_may_be_torn=False)
    return events, pieces


class _Fetch:
    """A fetch running in a thread of its own; `result()` waits for it and returns its rows or raises its error."""

    def __init__(self, fetch: Callable[[threading.Event], list[tuple[bytes]] | None]) -> None:
        self.imported = threading.Event()  # set once the fetch has its snapshot (or has failed)
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(fetch,), name="cairn-pg-load", daemon=True)
        self._thread.start()

    def _run(self, fetch: Callable[[threading.Event], list[tuple[bytes]] | None]) -> None:
        try:
            self._outcome.append(fetch(self.imported))
        except BaseException as e:  # re-raised in the loading thread, which translates it as any read error
            self._outcome.append(e)
        finally:
            self.imported.set()

    def join(self) -> None:
        self._thread.join()

    def declined(self) -> bool:
        """Whether the fetch ended without fetching (it returned None); known once `imported` is set."""
        return self._outcome == [None]

    def result(self) -> list[tuple[bytes]]:
        self._thread.join()
        if isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]
        return self._outcome[0]


def _parts(first: list[tuple[bytes]], rest: _Fetch | None) -> Iterator[list[tuple[bytes]]]:
    yield first
    if rest is not None:
        yield rest.result()


def _fetch_bodies(conn: Any, session_id: str, start: int | None, stop: int | None = None) -> list[tuple[bytes]]:
    """The bodies of the session's seqs in [start, stop) (None: unbounded), in seq order."""
    where = (" AND seq >= %(start)s" if start is not None else "") + (" AND seq < %(stop)s" if stop is not None else "")
    cur = conn.cursor(binary=True)
    cur.execute(f"SELECT body FROM events WHERE session_id = %(id)s{where} ORDER BY seq",
                {"id": session_id, "start": start, "stop": stop})
    rows = cur.fetchall()
    cur.close()
    return rows


def _end_transaction(conn: Any) -> None:
    """Roll back a read's transaction; a connection that broke meanwhile is left as it is (its error is raised)."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.rollback()
        except psycopg.Error:
            pass
