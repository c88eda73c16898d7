"""Regenerate the hostile-storage corpus (SPEC §5): `python tests/corpus/make_corpus.py`.

Every case is a session file named `<id>.jsonl` derived from one good log Cairn itself writes, damaged in one way.
`cases.json` says what `cairn show` and `cairn run --resume` must answer for each (exit code; SPEC §6) and whether the
listing must call it `unreadable`. The files are checked in so the test does not depend on this script's output being
stable; rerun it only to add a case.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent


async def good_log(home: Path, session_id: str) -> bytes:
    from cairn.persistence.events import (
        AssistantChunk, AssistantMessage, RequestHeader, StepEnd, StepStart, TurnEnd, TurnStart, UserMessage,
    )
    from cairn.persistence.session import LiveSession
    from cairn.persistence.store import SessionStore

    store = SessionStore(home, "jsonl")
    async with LiveSession(store.create("/corpus", session_id, created=1_700_000_000_000)) as live:
        for event in [
            TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="hello corpus"),
            RequestHeader(turn=1, step=1, provider="demo", model="demo-1", params={}, tools=[], message_count=1),
            AssistantChunk(turn=1, step=1, delta="Hi"),
            AssistantMessage(turn=1, step=1, text="Hi", tool_calls=[], interrupted=False),
            StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="completed", error=None),
        ]:
            live.append(event)
        await live.flush()
    return store.backend.path(session_id).read_bytes()


def renamed(data: bytes, old: str, new: str) -> bytes:
    return data.replace(f'"id":"{old}"'.encode(), f'"id":"{new}"'.encode(), 1)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def build(good: bytes) -> dict[str, tuple[bytes, dict]]:
    lines = good.split(b"\n")[:-1]  # header + 8 events
    ok = {"show": 0, "resume": 0, "unreadable": False}
    corrupt = {"show": 4, "resume": 4, "unreadable": True}

    def case(name: str, body: bytes, expect: dict) -> tuple[str, tuple[bytes, dict]]:
        return name, (renamed(body, "good", name), expect)

    def joined(ls: list[bytes]) -> bytes:
        return b"\n".join(ls) + b"\n"

    flipped = bytearray(lines[3])
    flipped[len(flipped) // 2] ^= 0x40  # one bit of the user/message line
    wrong_type = lines[3].replace(b'"turn":1', b'"turn":"one"', 1)
    tool_call = (b'{"seq":%d,"time":1,"type":"tool/call","turn":1,"step":1,"call_id":"c","name":"x","arguments":%s,'
                 b'"safety":"read_only","parent_call_id":null}')
    header = json.loads(lines[0])
    cases = dict([
        case("torn-unterminated", joined(lines[:-1]) + lines[-1][:15], ok),
        case("torn-bitrot-last-line", joined(lines[:-1]) + b"\x00\x00\x00garbage\xff\n", ok),
        case("bitflip-middle", joined(lines[:3] + [bytes(flipped)] + lines[4:]), corrupt),
        case("reordered-seq", joined(lines[:3] + [lines[4], lines[3]] + lines[5:]), corrupt),
        case("duplicated-line", joined(lines[:4] + [lines[3]] + lines[4:]), corrupt),
        case("wrong-type-field", joined(lines[:3] + [wrong_type] + lines[4:]), corrupt),
        case("deeply-nested-event", joined(lines[:-1] + [tool_call % (8, nested(5000).encode())]), corrupt),
        case("deeply-nested-header", joined([b'{"format":' + nested(5000).encode() + b"}"] + lines[1:]), corrupt),
        case("non-utf8-bytes", joined(lines[:3] + [lines[3].replace(b"hello", b"h\xc3\x28llo")] + lines[4:]),
             corrupt),
        case("array-header", b'[1, 2, 3]\n' + joined(lines[1:]), corrupt),
        case("empty-file", b"", corrupt),
        case("garbage-from-first-byte", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 4, corrupt),
        case("newer-version", joined([json.dumps({**header, "version": 2}).encode()] + lines[1:]), corrupt),
        case("older-version", joined([json.dumps({**header, "version": 0}).encode()] + lines[1:]), corrupt),
        ("wrong-header-id", (good, corrupt)),  # the file says it is session "good"
    ])
    return cases


def foreign_sqlite() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "foreign.sqlite3"
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE recipes (name TEXT, steps TEXT)")
        conn.execute("INSERT INTO recipes VALUES ('bread', 'flour, water, salt, time')")
        conn.commit()
        conn.close()
        return path.read_bytes()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        good = anyio.run(good_log, Path(tmp), "good")
    (HERE / "good.jsonl").write_bytes(good)
    expectations = {}
    for name, (data, expect) in build(good).items():
        (HERE / f"{name}.jsonl").write_bytes(data)
        expectations[name] = expect
    (HERE / "foreign-sqlite.jsonl").write_bytes(foreign_sqlite())  # another program's database under our name
    expectations["foreign-sqlite"] = {"show": 4, "resume": 4, "unreadable": True}
    (HERE / "foreign.sqlite3").write_bytes(foreign_sqlite())  # for the SQLite backend: sessions.sqlite3
    (HERE / "cases.json").write_text(json.dumps(expectations, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(expectations)} cases to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
