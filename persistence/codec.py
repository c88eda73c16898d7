"""Decoding a log body (JSON lines) into events with the strict envelope checks of SPEC §2 and §5.

Fast path: one `decode_lines` call over the whole body with the cyclic GC paused (GUIDE §4). Only when that fails do we
walk line by line, to drop a torn tail, keep ignorable unknown events, or name the exact corrupt line.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

import msgspec

from .errors import CorruptLog, UnsupportedFormat
from .events import (
    FORMAT,
    FORMAT_VERSION,
    AnyEvent,
    IgnorableEvent,
    SessionHeader,
    event_decoder,
    header_decoder,
    raw_decoder,
)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Bulk decoding allocates millions of objects; letting the cyclic GC scan them triples load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def decode_header(line: bytes, path: str) -> SessionHeader:
    try:
        raw = raw_decoder.decode(line)
    except msgspec.DecodeError:
        raise CorruptLog(path, 1, "the header line is not JSON") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UnsupportedFormat(path, raw.get("format") if isinstance(raw, dict) else raw, FORMAT_VERSION)
    if raw.get("version") != FORMAT_VERSION:
        raise UnsupportedFormat(path, raw.get("version"), FORMAT_VERSION)
    try:
        return header_decoder.decode(line)
    except msgspec.ValidationError as e:
        raise CorruptLog(path, 1, f"bad header: {e}") from None


def decode_events(
    body: bytes | memoryview, path: str, first_line: int, tail_may_be_torn: bool
) -> tuple[list[AnyEvent], int]:
    """Decode `body` (event lines). Returns the events and the byte length of the part that was kept.

    With `tail_may_be_torn`, a last line without its newline, or a last line that is not JSON, is dropped (a crash
    mid-write); any other bad line raises CorruptLog naming `path:line`. Blank lines between events are skipped
    (Cairn never writes one, and they hold nothing to lose); blank lines at the end are cut like a torn tail.
    """
    events: list[AnyEvent]
    if not body:
        return [], 0
    if body[-1:] == b"\n" and body[-2:] != b"\n\n":  # (blank last lines are cut like a torn tail: slow path)
        try:
            with gc_paused():
                events = event_decoder.decode_lines(body)  # type: ignore[assignment]
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if all(event.seq == i for i, event in enumerate(events)):
                return events, len(body)
    # something is off: walk line by line to drop a torn tail, keep ignorable events, or name the exact bad line
    return _decode_slowly(bytes(body), path, first_line, tail_may_be_torn)


def _decode_slowly(body: bytes, path: str, first_line: int, tail_may_be_torn: bool) -> tuple[list[AnyEvent], int]:
    lines = body.split(b"\n")
    unterminated = lines.pop()  # b"" when the body ends with a newline
    if unterminated and not tail_may_be_torn:
        lines.append(unterminated)
        unterminated = b""
    events: list[AnyEvent] = []
    kept = blanks = 0  # blank lines count as kept only once an event follows them: at the tail they are cut
    last = len(lines) - 1
    for i, line in enumerate(lines):
        line_no = first_line + i
        if not line.strip():
            blanks += len(line) + 1
            continue
        event: AnyEvent
        try:
            try:
                event = event_decoder.decode(line)
            except msgspec.ValidationError as e:
                # (msgspec reads the tag first: a line damaged after an unknown-looking tag is a ValidationError
                # here and a DecodeError once the raw JSON is parsed)
                event = ignorable_or_refuse(line, path, line_no, e)
        except msgspec.DecodeError:
            if tail_may_be_torn and i == last and not unterminated:
                break  # a complete-looking last line that is not JSON: torn by a crash
            raise CorruptLog(path, line_no, "the line is not valid JSON") from None
        if event.seq != len(events):
            raise CorruptLog(path, line_no, f"seq {event.seq} where {len(events)} was expected")
        events.append(event)
        kept += blanks + len(line) + 1
        blanks = 0
    return events, kept


def ignorable_or_refuse(line: bytes, path: str, line_no: int, error: Exception) -> IgnorableEvent:
    """The ignorable event a line that failed validation holds, or CorruptLog naming `path:line_no`. Raises
    msgspec.DecodeError when the line is not JSON at all (its tag read before the damage): the caller decides whether
    that is a torn tail or corruption."""
    raw = raw_decoder.decode(line)
    if isinstance(raw, dict) and raw.get("ignorable") is True and isinstance(raw.get("type"), str):
        seq, time = raw.pop("seq", None), raw.pop("time", None)
        kind = raw.pop("type")
        if isinstance(seq, int) and isinstance(time, int):
            return IgnorableEvent(seq=seq, time=time, type=kind, fields=raw)
    if isinstance(raw, dict) and "type" in raw and "Invalid value" in str(error) and "`$.type`" in str(error):
        raise CorruptLog(
            path, line_no, f"unknown event type {raw['type']!r} not marked ignorable (written by a newer Cairn?)"
        ) from None
    raise CorruptLog(path, line_no, f"bad event: {error}") from None
