"""Damage is never read as history (SPEC §5 rev 3): a running CRC over a session's stored event lines.

Parsing alone cannot see a flipped byte inside a string, so every backend keeps one running crc32 over the session's
event lines in order (each line's bytes and its newline: exactly the JSONL body, and the rows of SQLite and PostgreSQL
joined the same way). The last event of every durable batch carries the running value as it stood just before that
line's closing brace, and where the previous check sits, as one more field: `…,"chk":"1a2b3c4d@5120"}` (the byte offset
of the previous check's field in the body; none on the first). The field itself is left out of the sum, so the value
depends only on the events, never on which of them carried a check.

On load the checks are found from the end (the last one is near it) by following those offsets back, then every one is
recomputed over the bytes before it: one crc32 call per check over the body in place, plus one search of the bytes
before the first check for a stray mark (a check that lost its place). A mismatch is damage, named by the lines it covers (exit 4). Events after the last check (a crash after a
write-behind, before the next barrier) are not covered yet, nor are logs written before rev 3; both still load, and the
writer that resumes them continues the sum over everything it loaded, so its next check covers them too.

Readers of format version 1 ignore the unknown field; `"chk"` cannot occur raw inside a JSON string (its quotes would
be escaped there), and the encoder writes the key `"chk"` inside a value as `"\u0063hk"` (`events.unmarked`), so the
mark is found by a plain byte search.
"""

from __future__ import annotations

import functools
import re
import threading
import zlib
from bisect import bisect_right
from operator import itemgetter

import msgspec

from .backend import EncodedEvent
from .errors import CorruptLog
from .events import CHECK_MARK

MARK = CHECK_MARK
_VALUE = re.compile(rb'([0-9a-f]{8})(?:@([0-9]{1,15}))?"}')
TAIL_SEARCH = 1 << 16  # the last check is looked for this far back first (then the whole body)
_DATA = itemgetter(1)  # an EncodedEvent's bytes
PARALLEL_MIN = 1 << 22  # a prefix this long is summed in a thread while it is searched for stray marks


class Position(msgspec.Struct):
    """Where the writer stands in the stored body: the running crc, the next seq, the body's length (check fields
    included) and the offset of the last check field."""

    state: int = 0
    next_seq: int = 0
    end: int = 0
    last_check: int = -1


class RunningCheck:
    """The writer's side: the running crc over what is stored, and the checks it puts on durable batches."""

    def __init__(self, at: Position | None = None) -> None:
        self.at = at or Position()
        self.last: tuple[int, int] | None = None  # (offset, value) of the check the last stamped batch carries

    def stamp(self, batch: list[EncodedEvent], durable: bool) -> tuple[list[EncodedEvent], Position]:
        """The batch as it is to be stored, and the position once it is. Events already covered (a re-send after a
        failed barrier) count once; a durable batch's last new event carries the check. The caller keeps the new
        position (`advance`) only when the write succeeded."""
        at = self.at
        new = [data for seq, data in batch if seq >= at.next_seq]
        if not new:
            return batch, at
        joined = b"\n".join(new) + b"\n"
        if not durable:
            return batch, Position(zlib.crc32(joined, at.state), batch[-1][0] + 1, at.end + len(joined), at.last_check)
        before_brace = zlib.crc32(memoryview(joined)[:-2], at.state)
        seq, last = batch[-1]
        field = b',"chk":"%08x' % before_brace + (b"@%d" % at.last_check if at.last_check >= 0 else b"") + b'"'
        stamped = batch[:-1] + [(seq, last[:-1] + field + b"}")]
        check_at = at.end + len(joined) - 2
        self.last = (check_at, before_brace)
        return stamped, Position(zlib.crc32(b"}\n", before_brace), seq + 1, at.end + len(joined) + len(field), check_at)

    def stamp_lines(self, batch: list[EncodedEvent], durable: bool) -> tuple[bytes, Position]:
        """The batch as the bytes to store (its lines joined, each with its newline) and the position once stored:
        exactly the lines `stamp` gives, made in one join with the check appended to it. The barrier's hot path in the
        JSONL writer (P1: every step here runs cold, right after the previous barrier's fdatasync). A batch holding
        events already covered goes `stamp`'s way; batches are in seq order (stamp too takes the last as the newest)."""
        at = self.at
        if not batch or batch[0][0] < at.next_seq:
            stamped, after = self.stamp(batch, durable)
            return (b"\n".join([data for _, data in stamped]) + b"\n" if stamped else b""), after
        if not durable:
            joined = b"\n".join(map(_DATA, batch)) + b"\n"
            return joined, Position(zlib.crc32(joined, at.state), batch[-1][0] + 1, at.end + len(joined), at.last_check)
        body = b"\n".join(map(_DATA, batch))[:-1]  # up to the last event's closing brace, where its check goes
        before_brace = zlib.crc32(body, at.state)
        check_at = at.end + len(body)
        if at.last_check >= 0:
            data = body + b',"chk":"%08x@%d"}\n' % (before_brace, at.last_check)
        else:
            data = body + b',"chk":"%08x"}\n' % before_brace
        self.last = (check_at, before_brace)
        return data, Position(zlib.crc32(b"}\n", before_brace), batch[-1][0] + 1, at.end + len(data), check_at)

    def advance(self, at: Position) -> None:
        self.at = at


def verify_checks(buf: bytes, start: int, end: int, path: str, first_line: int,
                  unit: str = "line", _ready: threading.Event | None = None) -> tuple[Position, tuple[int, int] | None]:
    """Recompute every check in `buf[start:end]` (whole event lines); raise CorruptLog at the first that does not match.
    Returns where a resuming writer continues (the running crc over the range with the checks left out, offsets
    relative to `start`; `next_seq` is left to the caller) and the last check as (offset, value), or None.

    Blank lines hold nothing and the decoder skips them (SPEC §5); Cairn never writes one, so only when a check fails
    is the range checked again without them."""
    try:
        return _verify(buf, start, end, path, first_line, unit, _ready)
    except CorruptLog:
        lines = bytes(memoryview(buf)[start:end]).split(b"\n")
        kept = [line for line in lines[:-1] if line.strip()]
        if len(kept) == len(lines) - 1:
            raise
        try:
            return _verify(b"\n".join(kept) + b"\n", 0, sum(len(line) + 1 for line in kept), path, first_line, unit)
        except CorruptLog:
            pass
        raise


def _verify(buf: bytes, start: int, end: int, path: str, first_line: int,
            unit: str, ready: threading.Event | None = None) -> tuple[Position, tuple[int, int] | None]:
    view = memoryview(buf)
    chain: list[tuple[int, int, int]] = []  # (offset of the field, value, length of the field), last first
    at = buf.rfind(MARK, max(start, end - TAIL_SEARCH), end)
    if at < 0 and end - start > TAIL_SEARCH:
        at = buf.rfind(MARK, start, end)
    while at >= 0:
        found = _VALUE.match(buf, at + len(MARK), min(end, at + len(MARK) + 30))
        if found is None:
            raise CorruptLog(path, *_where(buf, start, at, at, first_line, unit))
        chain.append((at, int(found.group(1), 16), found.end() - 1 - at))
        if found.group(2) is None:
            break
        previous = start + int(found.group(2))
        if not (start <= previous < at and buf.startswith(MARK, previous)):
            raise CorruptLog(path, *_where(buf, start, at, at, first_line, unit))
        at = previous
    head = chain[-1][0] if chain else start
    stray, first = _stray_mark_and_crc(buf, view, start, head, ready)
    if stray:
        # a check before the first one in the chain: the offset that should have led to it was changed
        raise CorruptLog(path, *_where(buf, start, start, head, first_line, unit))
    state, covered = 0, start  # the sum so far covers buf[start:covered], check fields left out
    for at, value, length in reversed(chain):
        state = first if covered == start else zlib.crc32(view[covered:at], state)
        if state != value:
            raise CorruptLog(path, *_where(buf, start, covered, at, first_line, unit))
        covered = at + length
    last = (chain[0][0] - start, chain[0][1]) if chain else None
    return Position(zlib.crc32(view[covered:end], state), 0, end - start, chain[0][0] - start if chain else -1), last


def _stray_mark_and_crc(buf: bytes, view: memoryview, start: int, head: int,
                        ready: threading.Event | None = None) -> tuple[bool, int]:
    """Whether a check mark lies in `buf[start:head]`, and the crc32 of those bytes (the first check's sum).

    Both read the whole prefix, often nearly the whole body. zlib lets go of the GIL while it sums and `bytes.rfind`
    does not, so on a long prefix a short-lived thread sums while this one searches: the two ~13 ms passes over 55 MB
    (P4) overlap on a second core instead of following each other. (The other way round they would not: the search
    would hold the GIL before this thread reached zlib.) With `ready` (VerifyBeside: the caller decodes meanwhile and
    holds the GIL throughout) the search is `regex`'s, which lets go of it too, and `ready` is set as the two passes
    begin, so neither waits for the decode. Same results either way."""
    if head - start < PARALLEL_MIN:
        if ready is not None:
            ready.set()
        return buf.rfind(MARK, start, head) >= 0, zlib.crc32(view[start:head])
    sums: list[int] = []
    summing = threading.Thread(target=lambda: sums.append(zlib.crc32(view[start:head])), name="cairn-check-crc")
    try:
        summing.start()
    except RuntimeError:  # no thread to be had: sum afterwards (below)
        pass
    try:
        if ready is None:
            stray = buf.rfind(MARK, start, head) >= 0
        else:
            search = _mark_search()
            ready.set()
            stray = search.search(buf, start, head, concurrent=True) is not None
    finally:
        if summing.ident is not None:
            summing.join()
    return stray, sums[0] if sums else zlib.crc32(view[start:head])


@functools.cache
def _mark_search():
    """MARK as a `regex` pattern: unlike `bytes.rfind` (and `re`), `regex` can search with the GIL released. Imported
    only for a long body (start-up pays nothing for it)."""
    import regex

    return regex.compile(regex.escape(MARK))


class VerifyBeside:
    """`verify_checks(buf, start, end, …)` run in a thread while the caller decodes the same body (JSONL loads, P4).

    The decode holds the GIL throughout, so the caller starts it only once this thread has found the checks and begun
    the passes over the body that let go of the GIL (the stray-mark search and the first check's sum, see
    `_stray_mark_and_crc`): on a second core those take no time from the load. The outcome is exactly
    `verify_checks`'s: `result()` returns or raises what it did. A caller that ends up needing another range (a torn
    tail was cut) or fails first calls `join()` and checks again itself."""

    def __init__(self, buf: bytes, start: int, end: int, path: str, first_line: int) -> None:
        self._outcome: tuple[bool, object] | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(buf, start, end, path, first_line, ready),
                                        name="cairn-verify")
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had: check here, now (the outcome is the same)
            self._run(buf, start, end, path, first_line, ready)
        ready.wait()

    def _run(self, buf: bytes, start: int, end: int, path: str, first_line: int, ready: threading.Event) -> None:
        try:
            self._outcome = (True, verify_checks(buf, start, end, path, first_line, _ready=ready))
        except BaseException as e:  # handed to the caller's thread by result()
            self._outcome = (False, e)
        finally:
            ready.set()  # (a check that failed before the passes began)

    def join(self) -> None:
        if self._thread.ident is not None:
            self._thread.join()

    def result(self) -> tuple[Position, tuple[int, int] | None]:
        self.join()
        assert self._outcome is not None
        ok, value = self._outcome
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]


def verify_pieces(pieces: list[bytes], path: str, first_line: int,
                  unit: str = "line") -> tuple[Position, tuple[int, int] | None]:
    """`verify_checks` over the concatenation of `pieces` (each one or more whole lines, newline included), without
    making it: a body fetched in parts (PostgreSQL rows) is checked where it lies, which spares a copy of the whole
    session into fresh memory. Only a clean result is computed here; anything else (a mismatch, a malformed or
    misplaced check, a piece that does not end a line) is decided, and named, by `verify_checks` over the joined
    body, so the outcome is always exactly its outcome."""
    clean = _verify_pieces(pieces)
    if clean is not None:
        return clean
    body = b"".join(pieces)
    return verify_checks(body, 0, len(body), path, first_line, unit)


def _verify_pieces(pieces: list[bytes]) -> tuple[Position, tuple[int, int] | None] | None:
    """`_verify` over whole pieces, offsets counted over their concatenation; None for anything but a clean body.
    A check field holds no newline, so it never spans two pieces."""
    starts: list[int] = []
    end = 0
    for piece in pieces:
        if not piece.endswith(b"\n"):
            return None
        starts.append(end)
        end += len(piece)

    def where(offset: int) -> tuple[bytes, int]:
        i = bisect_right(starts, offset) - 1
        return pieces[i], offset - starts[i]

    at = -1
    for i in range(len(pieces) - 1, -1, -1):  # the last check, wherever it is
        found_at = pieces[i].rfind(MARK)
        if found_at >= 0:
            at = starts[i] + found_at
            break
    chain: list[tuple[int, int, int]] = []  # as in _verify
    while at >= 0:
        piece, local = where(at)
        found = _VALUE.match(piece, local + len(MARK), min(len(piece), local + len(MARK) + 30))
        if found is None:
            return None
        chain.append((at, int(found.group(1), 16), found.end() - 1 - local))
        if found.group(2) is None:
            break
        previous = int(found.group(2))
        if not 0 <= previous < at:
            return None
        piece, local = where(previous)
        if not piece.startswith(MARK, local):
            return None
        at = previous
    if chain:
        first = bisect_right(starts, chain[-1][0]) - 1
        if pieces[first].rfind(MARK, 0, chain[-1][0] - starts[first]) >= 0:
            return None
        if any(MARK in piece for piece in pieces[:first]):
            return None
    state, covered = 0, 0
    for at, value, length in reversed(chain):
        state = _crc_range(pieces, starts, covered, at, state)
        if state != value:
            return None
        covered = at + length
    last = (chain[0][0], chain[0][1]) if chain else None
    return Position(_crc_range(pieces, starts, covered, end, state), 0, end, chain[0][0] if chain else -1), last


def _crc_range(pieces: list[bytes], starts: list[int], lo: int, hi: int, state: int) -> int:
    """The running crc continued over the concatenation's bytes lo:hi."""
    i = max(bisect_right(starts, lo) - 1, 0)
    while i < len(pieces) and starts[i] < hi:
        a, b = max(lo - starts[i], 0), min(hi - starts[i], len(pieces[i]))
        if a < b:
            state = zlib.crc32(memoryview(pieces[i])[a:b], state)
        i += 1
    return state


def _where(buf: bytes, start: int, covered: int, at: int, first_line: int, unit: str) -> tuple[int, str]:
    """The line (or seq) of the failed check, and a reason naming the lines it covers (where the damage is)."""
    line = first_line + buf.count(b"\n", start, at)
    since = first_line + buf.count(b"\n", start, covered)
    where = f"{unit} {line}" if since == line else f"{unit}s {since}–{line}"
    return line, f"the stored events were changed after they were written (the check of {where} does not match)"
