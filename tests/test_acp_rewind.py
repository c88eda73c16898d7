"""ACP and recovery evidence / rewind (SPEC §9 rev 3), through a real ACP client driving a real `cairn acp` over pipes:
a replayed recovered call carries Cairn's evidence (`_meta.cairn.evidence`, `rawOutput.evidence`, a text block), and
`/rewind N` restores files and the conversation with the same engine as `cairn rewind`."""

from __future__ import annotations

import json

import pytest

from acp_helpers import RecordingClient, connect, content_text, prompt, rig_fixture
from openai_server import OpenAIServer, text
from test_show_evidence import CALL, EVIDENCE_DETAIL, SID, crash_after_a_write

pytestmark = pytest.mark.anyio
rig = pytest.fixture(rig_fixture, name="rig")


def said(client: RecordingClient) -> str:
    return [u.content.text for u in client.updates if u.session_update == "agent_message_chunk"][-1]


async def test_load_replays_the_recovered_write_with_the_evidence_cairn_gathered(rig):
    crash_after_a_write(rig)
    client = RecordingClient()
    with OpenAIServer([text("Noted.")]) as server:
        env = {"CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url}
        async with connect(rig, client, env) as agent:
            await agent.conn.load_session(cwd=str(rig.ws), session_id=SID)
            card = next(u for u in client.updates if u.session_update == "tool_call" and u.tool_call_id == CALL)
            await prompt(agent.conn, SID, f"/verdict {CALL} happened")
            await prompt(agent.conn, SID, "carry on")
            request = server.wait_for_requests(1)
    meta = card.field_meta["cairn"]
    assert meta["status"] == "OUTCOME_UNKNOWN" and meta["recovered"] is True
    assert meta["evidence"]["finding"] == "happened" and meta["evidence"]["detail"].startswith(EVIDENCE_DETAIL)
    assert card.raw_output["evidence"] == meta["evidence"] and card.raw_output["status"] == "OUTCOME_UNKNOWN"
    texts = [c.content.text for c in card.content if c.type == "content"]
    assert texts[0].startswith("OUTCOME_UNKNOWN: ")
    assert texts[-1] == f"Cairn checked after the crash: happened — {meta['evidence']['detail']}"
    # the verdict's card keeps the evidence beside it
    update = [u for u in client.updates if u.session_update == "tool_call_update" and u.tool_call_id == CALL][-1]
    assert update.field_meta["cairn"]["evidence"] == meta["evidence"]
    assert update.field_meta["cairn"]["verdict"]["verdict"] == "happened"
    assert content_text(update).endswith("Operator's verdict: happened")
    assert "Cairn checked after the crash: happened" in content_text(update)
    sent = json.dumps(request.body["messages"])
    assert "Cairn checked the interrupted call" in sent and EVIDENCE_DETAIL in sent


def script_turns(rig, sid: str) -> None:
    """Three real turns: 1 writes a.txt `one`, 2 rewrites it `two`, 3 creates b.txt."""
    turns = [("first", "a.txt", "one\n"), ("second", "a.txt", "two\n"), ("third", "b.txt", "bee\n")]
    for n, (prompt_text, path, content) in enumerate(turns, 1):
        responses = [{"tool_calls": [{"call_id": f"call_{n}", "name": "write_file",
                                      "arguments": {"path": path, "content": content}}]}, {"text": f"done {n}"}]
        args = ["--session-id", sid] if n == 1 else ["--resume", sid]
        proc = rig.run("run", *args, "--yes", "--provider", "script", "--script", rig.script(responses),
                       f"{prompt_text} prompt")
        assert proc.returncode == 0, proc.stderr


async def test_rewind_over_acp_refuses_a_file_changed_outside_then_restores_files_and_conversation(rig):
    script_turns(rig, "rw")
    (rig.ws / "a.txt").write_text("by hand\n")  # changed outside Cairn since its last write
    client = RecordingClient()
    with OpenAIServer([text("Starting over.")]) as server:
        env = {"CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url}
        async with connect(rig, client, env) as agent:
            await agent.conn.load_session(cwd=str(rig.ws), session_id="rw")
            commands = client.session_updates("available_commands_update")[-1].available_commands
            usage = await prompt(agent.conn, "rw", "/rewind")
            said_usage = said(client)
            refused = await prompt(agent.conn, "rw", "/rewind 2")
            said_refused = said(client)
            untouched = ((rig.ws / "a.txt").read_text(), (rig.ws / "b.txt").read_text())
            forced = await prompt(agent.conn, "rw", "/rewind 2 --force")
            said_forced = said(client)
            restored = ((rig.ws / "a.txt").read_text(), (rig.ws / "b.txt").exists())
            await prompt(agent.conn, "rw", "what now?")
            request = server.wait_for_requests(1)
    assert "rewind" in [c.name for c in commands]
    assert usage.stop_reason == refused.stop_reason == forced.stop_reason == "end_turn"
    assert said_usage.startswith("usage: /rewind N") and "1: first prompt" in said_usage
    assert said_refused.startswith("Nothing was rewound:") and "a.txt" in said_refused and "--force" in said_refused
    assert untouched == ("by hand\n", "bee\n")  # a refusal touches nothing
    assert restored == ("one\n", False)
    lines = said_forced.splitlines()
    assert lines[0].startswith("restored to before turn 2: ") and {"a.txt", "b.txt"} <= set(
        lines[0].split(": ", 1)[1].split(", "))
    assert "the conversation continues from before turn 2" in lines
    sent = json.dumps(request.body["messages"])
    assert "first prompt" in sent and "what now?" in sent
    assert "second prompt" not in sent and "third prompt" not in sent  # the conversation continues from before turn 2
    events = rig.show("rw")
    kinds = [e["type"] for e in events]
    assert kinds.count("rewind/plan") == 1 and kinds.count("rewind/end") == 1  # the refusal planned nothing
    rewind = next(e for e in events if e["type"] == "conversation/rewind")
    assert rewind["to_turn"] == 2
    assert not any(e["type"] == "user/message" and e["text"].startswith("/rewind") for e in events)


async def test_rewind_undo_and_dry_run_over_acp(rig):
    """SPEC §10: `/rewind N --dry-run` shows the plan and changes nothing; `/rewind --undo` takes a rewind back."""
    script_turns(rig, "ud")
    client = RecordingClient()
    with OpenAIServer([text("ok")]) as server:
        env = {"CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url}
        async with connect(rig, client, env) as agent:
            await agent.conn.load_session(cwd=str(rig.ws), session_id="ud")
            await prompt(agent.conn, "ud", "/rewind 2 --dry-run")
            dry = said(client)
            after_dry = ((rig.ws / "a.txt").read_text(), (rig.ws / "b.txt").exists())
            await prompt(agent.conn, "ud", "/rewind 2")
            rewound = ((rig.ws / "a.txt").read_text(), (rig.ws / "b.txt").exists())
            await prompt(agent.conn, "ud", "/rewind --undo")
            undone = said(client)
            back = ((rig.ws / "a.txt").read_text(), (rig.ws / "b.txt").read_text())
    assert dry.startswith("dry run: rewind to before turn 2") and "delete: b.txt" in dry
    assert after_dry == ("two\n", True)
    assert rewound == ("one\n", False)
    assert undone.startswith("undid the last rewind") and back == ("two\n", "bee\n")
    kinds = [e["type"] for e in rig.show("ud")]
    assert kinds.count("rewind/plan") == 2 and kinds.count("rewind/end") == 2  # the dry run planned nothing


async def test_a_prompt_over_acp_waits_for_an_interrupted_rewind(rig):
    """SPEC §10: an interrupted rewind blocks every prompt until it is finished or abandoned, and ACP says so."""
    script_turns(rig, "pr")
    child = rig.spawn("rewind", "pr", "--turn", "2", failpoint="rewind-planned")
    child.wait_failpoint("rewind-planned", "pr")
    child.kill()
    client = RecordingClient()
    with OpenAIServer([text("should not be asked")]) as server:
        env = {"CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url}
        async with connect(rig, client, env) as agent:
            await agent.conn.load_session(cwd=str(rig.ws), session_id="pr")
            refused = await prompt(agent.conn, "pr", "carry on")
            told = said(client)
            await prompt(agent.conn, "pr", "/rewind --abandon")
            await prompt(agent.conn, "pr", "carry on")
            asked = len(server.requests)
    assert refused.stop_reason == "end_turn" and "was interrupted" in told and "/rewind --finish" in told
    assert asked == 1  # only the prompt after --abandon reached the model
    starts = [e for e in rig.show("pr") if e["type"] == "turn/start"]
    assert len(starts) == 4
