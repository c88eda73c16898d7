"""Torn tails and corruption in JSONL logs (SPEC §5).

A crash can cut the log anywhere inside the last write. Whatever the cut, loading keeps exactly the complete lines
before it (a line is complete only with its newline), resuming truncates the file to that length and appends cleanly
after it. A bad line anywhere else is corruption, reported as `path:line`.
"""

from __future__ import annotations

import re

from pathlib import Path

import pytest

from cairn.persistence.errors import CorruptLog
from cairn.persistence.events import (
    AnyEvent,
    AssistantMessage,
    RecoveryVerdict,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
    to_builtins,
)
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio


def a_turn() -> list[AnyEvent]:
    return [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        UserMessage(turn=1, step=1, text="list the files ✓"),
        RequestHeader(turn=1, step=1, provider="demo", model="demo-1", params={}, tools=["list_dir"],
                      message_count=1),
        AssistantMessage(turn=1, step=1, text="", tool_calls=[ToolCallRequest("c1", "list_dir", {"path": "."})],
                         interrupted=False),
        ToolCall(turn=1, step=1, call_id="c1", name="list_dir", arguments={"path": "."}, safety="read_only",
                 parent_call_id=None),
        ToolResult(turn=1, step=1, call_id="c1", is_error=False, content="a.txt\nb.txt", error_code=None,
                   source_seq=5),
        StepEnd(turn=1, step=1),
        TurnEnd(turn=1, reason="completed", error=None),
    ]


async def write_log(home: Path, session_id: str = "s") -> tuple[bytes, list[AnyEvent]]:
    store = SessionStore(home, "jsonl")
    async with LiveSession(store.create("/w", session_id)) as live:
        for event in a_turn():
            live.append(event)
        await live.flush()
    return store.backend.path(session_id).read_bytes(), list(live.events)


def line_ends(data: bytes) -> list[int]:
    """Offset just past each line's newline."""
    ends, pos = [], 0
    while (nl := data.find(b"\n", pos)) >= 0:
        pos = nl + 1
        ends.append(pos)
    return ends


def cases(original: bytes) -> list[tuple[str, bytes, int]]:
    """(name, torn file, expected kept length) for every cut inside the last three lines: the cut prefix as is, and
    the cut prefix with a newline added (a complete last line that is not JSON, unless the cut fell just before the
    line's own newline, which makes it the intact line)."""
    ends = line_ends(original)
    assert ends[-1] == len(original)
    first = ends[-4]  # the start of the third line from the end
    out = []
    for cut in range(first, len(original)):
        complete = max(e for e in [0, *ends] if e <= cut)
        out.append((f"cut@{cut}", original[:cut], complete))
        newline_kept = cut + 1 if original[cut : cut + 1] == b"\n" else complete
        out.append((f"cut@{cut}+newline", original[:cut] + b"\n", newline_kept))
    return out


async def test_every_cut_in_the_last_three_lines_keeps_exactly_the_complete_lines(tmp_path):
    original, events = await write_log(tmp_path / "source")
    header_end = line_ends(original)[0]
    home = tmp_path / "torn"
    store = SessionStore(home, "jsonl")
    path = store.backend.path("s")
    path.parent.mkdir(parents=True)
    checked = 0

    for name, torn, kept in cases(original):
        path.write_bytes(torn)
        kept_events = original[header_end:kept].count(b"\n")
        expected = [to_builtins(e) for e in events[:kept_events]]

        seen = store.inspect("s")
        assert [to_builtins(e) for e in seen.events] == expected, name
        assert seen.torn_bytes == len(torn) - kept, name
        assert path.read_bytes() == torn, name  # loading never writes

        async with LiveSession(store.open_for_resume("s")) as live:
            repaired = live.repaired
            written = re.sub(rb',"chk":"[0-9a-f]{8}(?:@[0-9]+)?"}\n', b"}\n", path.read_bytes()[kept:])  # (its damage check)
            assert path.read_bytes()[:kept] == original[:kept], name
            assert written == b"".join(encode_event(e) + b"\n" for e in repaired), name
            live.append(RecoveryVerdict(call_id="c1", verdict="unknown", note=name))
            await live.flush()

        after = path.read_bytes()
        assert after.startswith(original[:kept]), name
        tail_lines = after[kept:].split(b"\n")
        assert tail_lines[-1] == b"" and len(tail_lines) == len(repaired) + 2, name
        reloaded = store.inspect("s")
        assert reloaded.torn_bytes == 0, name
        assert [e.seq for e in reloaded.events] == list(range(kept_events + len(repaired) + 1)), name
        assert [to_builtins(e) for e in reloaded.events[:kept_events]] == expected, name
        assert isinstance(reloaded.events[-1], RecoveryVerdict) and reloaded.events[-1].note == name
        checked += 1

    assert checked == 2 * (len(original) - line_ends(original)[-4])


async def test_resume_after_a_torn_tail_repairs_the_kept_part(tmp_path):
    """A cut inside the tool/result: the call was recorded, so repair says OUTCOME_UNKNOWN, after the cut point."""
    original, events = await write_log(tmp_path)
    store = SessionStore(tmp_path, "jsonl")
    path = store.backend.path("s")
    ends = line_ends(original)
    result_line_start = ends[-4]  # lines: ... tool/call, tool/result, step/end, turn/end
    path.write_bytes(original[: result_line_start + 20])

    opened = store.open_for_resume("s")
    opened.writer.close()
    opened.lock.release()

    assert opened.torn_bytes == 20
    assert [type(e) for e in opened.repaired] == [ToolResult, StepEnd, TurnEnd]
    assert opened.repaired[0].source_seq == events[5].seq
    assert path.read_bytes()[:result_line_start] == original[:result_line_start]


BAD_LINES = {
    "not-json": b"this is not json",
    "json-not-an-event": b'{"hello": 1}',
    "wrong-seq": b'{"seq":99,"time":1,"type":"turn/start","turn":1}',
    "truncated-json": b'{"seq":2,"time":1,"type":"user/mess',
}


@pytest.mark.parametrize("tail", ["intact", "torn"])
@pytest.mark.parametrize("bad", list(BAD_LINES))
async def test_bad_line_in_the_middle_is_corruption_naming_path_and_line(tmp_path, bad, tail):
    original, _ = await write_log(tmp_path)
    store = SessionStore(tmp_path, "jsonl")
    path = store.backend.path("s")
    lines = original.split(b"\n")  # header is lines[0] = line 1
    lines[3] = BAD_LINES[bad]  # line 4: the event with seq 2
    data = b"\n".join(lines)
    if tail == "torn":
        data += b'{"seq":9,"ti'  # also a torn tail, so the careful scanner runs from the start
    path.write_bytes(data)

    for attempt in (lambda: store.inspect("s"), lambda: store.open_for_resume("s")):
        with pytest.raises(CorruptLog) as info:
            attempt()
        assert info.value.line == 4
        assert f"{path}:4:" in str(info.value)
    assert path.read_bytes() == data  # left untouched

    with pytest.raises(CorruptLog):  # the failed resume released its lock: a retry fails the same way
        store.open_for_resume("s")


async def test_bad_last_line_that_is_valid_json_is_corruption_not_a_torn_tail(tmp_path):
    """A cut can only leave a prefix of a JSON object, never a whole different object: this is not a crash."""
    original, _ = await write_log(tmp_path)
    store = SessionStore(tmp_path, "jsonl")
    path = store.backend.path("s")
    path.write_bytes(original + b'{"seq":9,"time":1,"type":"turn/start"}\n')

    with pytest.raises(CorruptLog) as info:
        store.inspect("s")
    assert info.value.line == 11


async def test_blank_lines_are_skipped_not_treated_as_corruption(tmp_path):
    """Cairn never writes a blank line; one added by hand holds nothing, so loading skips it on either path."""
    original, events = await write_log(tmp_path)
    store = SessionStore(tmp_path, "jsonl")
    path = store.backend.path("s")
    lines = original.split(b"\n")
    lines.insert(3, b"")
    for tail in (b"", b'{"seq":9,"ti'):  # intact (fast path) and torn (line-by-line path)
        path.write_bytes(b"\n".join(lines) + tail)
        loaded = store.inspect("s")
        assert [encode_event(e) for e in loaded.events] == [encode_event(e) for e in events]
