"""The documented Python API: open, run, resume; seq continues across processes' worth of opens."""

from __future__ import annotations

import json

import pytest

from cairn.app.api import open_session
from cairn.persistence.events import RequestHeader, TurnEnd, TurnStart

pytestmark = pytest.mark.anyio


async def test_open_run_and_resume_continue_one_session(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "hello.txt").write_text("hi\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Looking.", "tool_calls": [{"name": "read_file", "arguments": {"path": "hello.txt"}}]},
        {"text": "It says hi."},
    ]}))
    common = dict(workspace=str(tmp_path / "ws"), provider="script", script=str(script), home=str(tmp_path / "home"))
    async with open_session(**common) as session:
        first = await session.run("what is in hello.txt?")
        session_id = session.id
    assert first.reason == "completed" and first.text == "It says hi."

    async with open_session(**common, resume=session_id) as session:
        assert session.session.repaired == []
        second = await session.run("again")
        events = session.session.events
    assert second.reason == "completed"
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.turn for e in events if isinstance(e, TurnStart)] == [1, 2]
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["completed", "completed"]


async def test_resume_keeps_the_sessions_provider_and_model_unless_chosen(tmp_path, monkeypatch):
    for name in ("CAIRN_PROVIDER", "CAIRN_MODEL", "CAIRN_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "ws").mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [{"text": "one"}, {"text": "two"}, {"text": "three"}]}))
    where = dict(workspace=str(tmp_path / "ws"), home=str(tmp_path / "home"))
    async with open_session(**where, provider="script", script=str(script), model="m-1") as session:
        await session.run("first")
        session_id = session.id
    async with open_session(**where, script=str(script), resume=session_id) as session:  # no provider, no model
        assert (session.provider.name, session.provider.model) == ("script", "m-1")
        await session.run("second")
    async with open_session(**where, resume=session_id, provider="demo") as session:
        assert (session.provider.name, session.provider.model) == ("demo", "demo")
        await session.run("third")
        headers = [(e.provider, e.model) for e in session.session.events if isinstance(e, RequestHeader)]
    assert headers == [("script", "m-1"), ("script", "m-1"), ("demo", "demo")]


async def test_rewind_restores_files_and_the_next_run_continues_from_before_the_turn(tmp_path):
    """`session.rewind(2)` (SPEC §9 rev 3): files Cairn wrote in turns 2 and later go back, the conversation continues
    from before turn 2; a file changed outside Cairn is refused (RewindRefused, nothing touched) unless forced."""
    from cairn import open_session as documented
    from cairn.app.api import RewindRefused, Session

    ws = tmp_path / "ws"
    ws.mkdir()
    responses = []
    for n, (path, content) in enumerate([("a.txt", "one\n"), ("a.txt", "two\n"), ("b.txt", "bee\n")], 1):
        responses += [{"tool_calls": [{"call_id": f"call_{n}", "name": "write_file",
                                       "arguments": {"path": path, "content": content}}]}, {"text": f"done {n}"}]
    responses.append({"text": "again"})
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": responses}))
    async with documented(workspace=str(ws), provider="script", script=str(script), home=str(tmp_path / "home"),
                          approve=True) as session:
        assert isinstance(session, Session)
        for prompt in ("first prompt", "second prompt", "third prompt"):
            assert (await session.run(prompt)).reason == "completed"
        (ws / "b.txt").write_text("by hand\n")
        with pytest.raises(RewindRefused, match="b.txt"):
            await session.rewind(2)
        assert (ws / "a.txt").read_text() == "two\n" and (ws / "b.txt").read_text() == "by hand\n"
        with pytest.raises(RewindRefused, match="no turn 9"):
            await session.rewind(9)
        lines = await session.rewind(2, force=True)
        assert (ws / "a.txt").read_text() == "one\n" and not (ws / "b.txt").exists()
        assert "the conversation continues from before turn 2" in lines
        assert lines[0].startswith("restored to before turn 2: ")
        sent = json.dumps(session.loop.transcript.messages)
        assert "first prompt" in sent and "second prompt" not in sent and "third prompt" not in sent
        assert (await session.run("fourth prompt")).reason == "completed"
        events = session.session.events
    header = [e for e in events if isinstance(e, RequestHeader)][-1]
    assert header.turn == 4 and header.message_count < 8  # turns 2 and 3 are no longer sent
    assert [type(e).__name__ for e in events].count("ConversationRewind") == 1
