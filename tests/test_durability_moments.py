"""Durability at the moment of the effect (GUIDE §7): for each promise "X is durable before Y", the coordinator's
durable seq (or, before a session is live, what was fdatasync'd) is recorded *when Y happens* and compared with X's
seq.

A SIGKILL test cannot see a missing barrier (the OS keeps what was written); these can. Each test names the barrier it
depends on; removing that barrier makes it fail:

- a verdict: durable before its dialog closes (TUI) and before ACP answers `/verdict` (SPEC §2 rev 3);
- a rewind's plan: durable before the first workspace file is touched (SPEC §9 rev 3, §10 rev 4);
- the repair: committed durably before the session is handed back for appending (SPEC §4);
- `request/retry`: durable before the next attempt's request reaches the server (SPEC §7 rev 2, through pre-request);
- an approval decision: durable before the tool body runs (SPEC §2, through pre-tool).

Everything real: the JSONL store and fsync, the composition (loop, policy, coordinator), the TUI under Pilot, the ACP
agent (in process, with a recording connection), the OpenAI provider against the local test server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp import text_block
from agent_helpers import script_agent, types, write_script
from openai_server import OpenAIServer, RecordedRequest, error, text
from tui_helpers import DEPLOY, crashed_turn, make_world, running, top_screen, wait_for, write_log

from cairn.app.agent import rewind as engine
from cairn.app.agent.approval import ApprovalAnswer, ApprovalRequest
from cairn.app.config.resolver import resolve_config
from cairn.app.providers.openai import OpenAIProvider
from cairn.app.tools.base import Tool, ToolContext
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.persistence.events import (
    ApprovalDecided,
    RecoveryVerdict,
    RequestHeader,
    RequestRetry,
    RewindPlan,
    RewindStep,
    ToolCall,
)
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio


def only(events: list[Any], kind: type) -> Any:
    (found,) = [e for e in events if isinstance(e, kind)]
    return found


# -- a verdict ---------------------------------------------------------------------------------------------------------


async def test_a_verdict_is_durable_when_its_dialog_closes(tmp_path, monkeypatch):
    """Barrier: `ChatScreen._save_verdict`'s flush, awaited by the dialog before it dismisses itself."""
    from cairn.app.screens.resume import ResumeScreen
    from cairn.app.screens.verdict import VerdictDialog

    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")
    durable_at_close: list[int] = []
    dismiss = VerdictDialog.dismiss

    def closing(dialog: VerdictDialog, *args: Any, **kwargs: Any) -> Any:
        durable_at_close.append(app.session.coordinator.durable_seq)
        return dismiss(dialog, *args, **kwargs)

    monkeypatch.setattr(VerdictDialog, "dismiss", closing)
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        await pilot.press("v")  # the cursor is on the OUTCOME_UNKNOWN call
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the verdict dialog")
        await pilot.press("h", "enter")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        verdict = only(app.session.events, RecoveryVerdict)
        await pilot.press("c")
        await app.action_quit()
    assert (verdict.call_id, verdict.verdict) == (DEPLOY.call_id, "happened")
    assert durable_at_close == [verdict.seq]


class RecordingConnection:
    """The client side of ACP, in process: what each update found durable when it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, int]] = []
        self.session: Any = None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        durable = self.session.coordinator.durable_seq if self.session is not None else -1
        self.sent.append((update, durable))


async def test_a_verdict_sent_over_acp_is_durable_before_it_is_answered(tmp_path):
    """Barrier: the flush in `SessionHost.record_verdict`, before the answer (and the call's updated card) go out."""
    from cairn.app.acp.agent import CairnAgent

    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.json", [])
    config = resolve_config(home=str(home), provider="script", script=str(script), workspace=str(ws),
                            env={"CAIRN_SNAPSHOTS": "off"})
    write_log(SessionStore(home, "jsonl"), "crashed-id", crashed_turn(), cwd=str(ws))
    conn = RecordingConnection()
    async with anyio.create_task_group() as hosts:
        agent = CairnAgent(config, hosts)
        agent.on_connect(conn)
        try:
            await agent.load_session(cwd=str(ws), session_id="crashed-id")
            session = agent.sessions["crashed-id"].agent.session
            conn.session = session
            conn.sent.clear()
            answer = await agent.prompt([text_block(f"/verdict {DEPLOY.call_id} did_not_happen checked")], "crashed-id")
            durable_at_answer = session.coordinator.durable_seq
            verdict = only(session.events, RecoveryVerdict)
        finally:
            await agent.shutdown()
    said = [(u.content.text, d) for u, d in conn.sent if u.session_update == "agent_message_chunk"]
    cards = [d for u, d in conn.sent if u.session_update == "tool_call_update"]
    assert answer.stop_reason == "end_turn" and said[-1][0].startswith(f"Recorded: `{DEPLOY.call_id}` did_not_happen")
    assert (verdict.verdict, verdict.note) == ("did_not_happen", "checked")
    assert said[-1][1] >= verdict.seq and cards and all(d >= verdict.seq for d in cards)
    assert durable_at_answer >= verdict.seq


# -- a rewind's plan ---------------------------------------------------------------------------------------------------


async def test_a_rewinds_plan_is_durable_when_the_first_file_is_touched(tmp_path, monkeypatch):
    """Barriers: the flush in `rewind._apply` after `rewind/plan`, and the one after each restored path's
    `rewind/file` (so an interrupted rewind shows truthfully what it restored). Without snapshots (the file tools'
    before-images): tests/test_workspace_rewind.py covers the plan's moment with snapshots."""
    written = [{"tool_calls": [{"name": "write_file", "arguments": {"path": p, "content": f"{p} new\n"}}]}
               for p in ("a.txt", "b.txt")]
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("a old\n")
    touched: list[tuple[str, int]] = []
    async with script_agent(tmp_path, [written[0], {"text": "one"}, written[1], {"text": "two"}]) as agent:
        await agent.run("write a")
        await agent.run("write b")
        write_path = engine.write_path

        def touching(workspace: Path, path: str, data: bytes | None, mode: str | None) -> None:
            touched.append((path, agent.session.coordinator.durable_seq))
            write_path(workspace, path, data, mode)

        monkeypatch.setattr(engine, "write_path", touching)
        assert agent.loop.blobs is not None
        outcome = await engine.rewind(agent.session, agent.loop.workspace, agent.loop.blobs(), 1, "files")
        plan = only(agent.session.events, RewindPlan)
        steps = {e.path: e for e in agent.session.events if isinstance(e, RewindStep)}
    assert sorted(outcome.restored) == ["a.txt", "b.txt"]
    assert (tmp_path / "ws" / "a.txt").read_text() == "a old\n" and not (tmp_path / "ws" / "b.txt").exists()
    (first, durable_at_first), (second, durable_at_second) = touched
    assert durable_at_first >= plan.seq, (touched, plan.seq)
    assert plan.seq < steps[first].seq <= durable_at_second, (touched, steps[first].seq)  # the first one's record


# -- the repair --------------------------------------------------------------------------------------------------------


class SyncedSizes(FileOps):
    """Real file operations that remember, at each fdatasync, how many bytes of that file were then on disk."""

    def __init__(self) -> None:
        self.synced: list[int] = []

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.synced.append(os.fstat(fd).st_size)


def test_the_repair_is_durable_before_the_session_is_handed_back(tmp_path):
    """Barrier: `durable=True` on the repair's append in `SessionStore.open_for_resume`."""
    home = tmp_path / "home"
    ops = SyncedSizes()
    store = SessionStore(home, JsonlBackend(home, ops))
    write_log(store, "crashed-id", crashed_turn())
    path = home / "sessions" / "crashed-id.jsonl"
    before = path.stat().st_size
    ops.synced.clear()
    opened = store.open_for_resume("crashed-id")
    try:
        size_when_handed_back = path.stat().st_size
        synced = list(ops.synced)
    finally:
        opened.writer.close()
        opened.lock.release()
    repair = types(opened.repaired)
    assert repair == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert size_when_handed_back > before  # the repair is in the file ...
    assert synced and synced[-1] == size_when_handed_back  # ... and fdatasync'd, all of it, before the hand-over
    stored = store.backend.load("crashed-id").events
    assert types(stored)[-4:] == repair and [e.seq for e in stored[-4:]] == [e.seq for e in opened.repaired]


# -- request/retry -----------------------------------------------------------------------------------------------------


async def test_request_retry_is_durable_when_the_retried_request_reaches_the_server(tmp_path):
    """Barrier: pre-request, taken again for every attempt (each attempt goes through the around_stream chain)."""
    durable_at_arrival: list[int] = []
    async with script_agent(tmp_path, []) as agent:

        def arrived(answer: dict) -> Any:
            def behaviour(request: RecordedRequest) -> dict:
                durable_at_arrival.append(agent.session.coordinator.durable_seq)
                return answer

            return behaviour

        with OpenAIServer([arrived(error(503, "busy", headers={"Retry-After": "0"})),
                           arrived(text("answered", chunks=2))]) as server:
            provider = OpenAIProvider("m", base_url=server.base_url, api_key="sk-test", timeout=10)
            agent.loop.provider = provider
            try:
                result = await agent.run("hello")
            finally:
                await provider.aclose()
        events = agent.session.events
    assert result.reason == "completed", result.error
    header = only(events, RequestHeader)
    retry = only(events, RequestRetry)
    assert (retry.attempt, retry.reason) == (2, "HTTP 503") and retry.seq > header.seq
    assert durable_at_arrival[0] >= header.seq
    assert durable_at_arrival[1] >= retry.seq, (durable_at_arrival, retry.seq)


# -- an approval decision ----------------------------------------------------------------------------------------------


async def test_the_approval_decision_is_durable_when_the_tool_body_starts(tmp_path):
    """Barrier: pre-tool. The first call is allowed for the session by the operator, the second runs on that grant
    (`granted`): each decision is durable before its body runs."""
    durable_at_body: dict[str, int] = {}
    asked: list[str] = []

    async def body(args: dict, ctx: ToolContext) -> str:
        durable_at_body[ctx.call_id] = agent.session.coordinator.durable_seq
        return "ran"

    async def operator(request: ApprovalRequest) -> ApprovalAnswer:
        asked.append(request.call_id)
        return ApprovalAnswer("allowed_session")

    tools = ToolRegistry([*builtin_tools(), Tool("deploy", "t", {"type": "object"}, "side_effecting", body)])
    calls = [{"call_id": f"c{i}", "name": "deploy", "arguments": {}} for i in (1, 2)]
    responses = [{"tool_calls": calls[:1]}, {"tool_calls": calls[1:]}, {"text": "done"}]
    async with script_agent(tmp_path, responses, tools=tools, approver=operator) as agent:
        await agent.run("deploy twice")
        decided = {e.call_id: e for e in agent.session.events if isinstance(e, ApprovalDecided)}
        called = {e.call_id: e for e in agent.session.events if isinstance(e, ToolCall)}
    assert asked == ["c1"] and [d.decision for d in decided.values()] == ["allowed_session", "granted"]
    for call_id in ("c1", "c2"):
        assert decided[call_id].seq < called[call_id].seq <= durable_at_body[call_id], (call_id, durable_at_body)
