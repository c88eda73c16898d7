"""Snapshot tests of the TUI's screens (baselines in the top-level `snapshots/test_tui_snapshots/`, see conftest.py).

Deterministic by construction: fixed session ids and creation times, logs written with fixed event times where a
screen shows a time (the sessions screen, rendered in UTC), the `script` provider with no delays, the header cwd a
fixed string, the theme set explicitly, and the prompt's cursor not blinking. `snap_compare` runs the app on its own
event loop, so these tests are plain functions.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_helpers import ControlledOps
from cairn.app.screens.approval import ApprovalModal
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.sessions import SessionsScreen
from cairn.app.tui import CairnApp
from cairn.persistence.events import AssistantChunk, StepEnd, StepStart, TurnStart, UserMessage
from cairn.persistence.locks import SessionLock
from tui_helpers import completed_turn, crashed_turn, make_world, wait_for, write_log
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.status_bar import StatusBar
from cairn.widgets.tool_card import ToolCard
from cairn.widgets.reasoning import ReasoningBlock
from cairn.widgets.transcript import AssistantText

SIZE = (120, 32)


@pytest.fixture
def utc(monkeypatch):
    """The sessions screen shows local times: pin the zone so the picture does not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def snapshot(snap_compare, app: CairnApp, run_before=None, press=(), before_close=None) -> bool:
    """Compare, then release what the app held: the harness ends the app with `exit()`, not the ordered quit."""
    async def prepare(pilot) -> None:
        app.theme = "textual-dark"  # TEXTUAL_THEME is read when textual is imported, before any conftest runs
        if app.chat is not None:
            app.chat.query_one(PromptInput).cursor_blink = False
        if run_before is not None:
            await run_before(pilot)

    try:
        return snap_compare(app, press=press, run_before=prepare, terminal_size=SIZE)
    finally:
        if before_close is not None:
            before_close()
        app.close_if_still_open()


async def submit(pilot, app: CairnApp, text: str) -> None:
    app.chat.query_one(PromptInput).insert(text)
    await pilot.press("enter")


def status(app: CairnApp) -> str:
    return str(app.chat.query_one(StatusBar).render())


def test_empty_chat(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    assert snapshot(snap_compare, app)


def test_finished_turn_with_two_tool_cards(snap_compare, tmp_path):
    world = make_world(tmp_path, [
        {"text": "Let me look around.", "tool_calls": [
            {"name": "list_dir", "arguments": {"path": "."}},
            {"name": "read_file", "arguments": {"path": "README.md"}},
        ]},
        {"text": "The workspace holds `README.md` and `src/`; the README says **hello**."},
    ])
    (world.workspace / "README.md").write_text("hello\n")
    (world.workspace / "src").mkdir()
    app = world.new_app()

    async def run_turn(pilot) -> None:
        await submit(pilot, app, "what is in this workspace?")
        final = "The workspace holds `README.md` and `src/`; the README says **hello**."
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["done", "done"], "two cards")
        await wait_for(pilot, lambda: [a.source for a in app.chat.query(AssistantText)][-1:] == [final], "answer")
        await wait_for(pilot, lambda: "idle" in status(app) and "durable through seq 16" in status(app), "idle")

    assert snapshot(snap_compare, app, run_turn)


def test_step_with_reasoning_collapsed_above_its_answer_and_token_usage(snap_compare, tmp_path):
    answer = "A cairn is a pile of stones that marks a trail."
    world = make_world(tmp_path, [
        {"reasoning": "The user asks what a cairn is.\nA short definition will do.", "text": answer,
         "usage": {"input_tokens": 1234, "output_tokens": 56}},
    ])
    app = world.new_app()

    async def run_turn(pilot) -> None:
        await submit(pilot, app, "what is a cairn?")
        await wait_for(pilot, lambda: [a.source for a in app.chat.query(AssistantText)][-1:] == [answer], "answer")
        await wait_for(pilot, lambda: "idle" in status(app) and "durable through seq 8" in status(app), "idle")
        block = app.chat.query_one(ReasoningBlock)
        assert block.collapsed and not block.streaming

    assert snapshot(snap_compare, app, run_turn)


def test_approval_modal(snap_compare, tmp_path):
    world = make_world(tmp_path, [
        {"text": "I will write the greeting.",
         "tool_calls": [{"name": "run_command", "arguments": {"command": "echo hello > greeting.txt"}}]},
    ])
    app = world.new_app()

    async def ask(pilot) -> None:
        await submit(pilot, app, "write a greeting file")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal), "the approval modal")
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")

    assert snapshot(snap_compare, app, ask)
    assert not (world.workspace / "greeting.txt").exists()


def test_failed_barrier_notice(snap_compare, tmp_path):
    ops = ControlledOps()
    world = make_world(tmp_path, [{"text": "never asked"}], ops=ops)
    app = world.new_app()
    ops.fail_fsync = 1_000  # the disk keeps failing: every barrier from here on gets EIO

    async def fail(pilot) -> None:
        await submit(pilot, app, "hello")
        await wait_for(pilot, lambda: app.chat.query_one(StatusBar).failed and "CHECKPOINT FAILED" in status(app),
                       "the red notice")
        await wait_for(pilot, lambda: "idle" in status(app), "the failed turn to end")
        assert app.provider.requests_served == 0
        raised = [(n.title, n.message) for n in app._notifications]
        assert any(title == "Checkpoint failed" for title, _ in raised), raised
        app.clear_notifications()  # the toasts stack over the status bar; the picture is about the bar

    def heal() -> None:
        ops.fail_fsync = 0  # so the final close can write what the failed barriers kept queued

    assert snapshot(snap_compare, app, fail, before_close=heal)


def test_resume_screen_with_not_started_and_outcome_unknown_rows(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeScreen), "the resume screen")
        assert [c.status for c in app.screen.calls] == ["OUTCOME_UNKNOWN", "NOT_STARTED"]

    assert snapshot(snap_compare, app, shown)


def test_verdict_dialog(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, ResumeScreen), "the resume screen")

    assert snapshot(snap_compare, app, shown, press=["v"])


def test_sessions_screen(snap_compare, tmp_path, utc):
    world = make_world(tmp_path, [])
    write_log(world.store, "20251202-101500-a1b2c3", completed_turn(1, "list the files", "Here they are."),
              created=1_764_670_500_000)
    write_log(world.store, "20251202-113000-d4e5f6", crashed_turn(), created=1_764_675_000_000)
    streaming = [TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="refactor the parser"),
                 AssistantChunk(turn=1, step=1, delta="Looking at")]
    write_log(world.store, "20251202-120000-0a0b0c", streaming, created=1_764_676_800_000, cwd="/workspace/other")
    lock = SessionLock(world.store.lock_dir, "20251202-120000-0a0b0c")
    lock.acquire()  # live in "another process"
    try:
        app = world.sessions_app()

        async def shown(pilot) -> None:
            await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
            await asyncio.sleep(0)

        assert snapshot(snap_compare, app, shown)
    finally:
        lock.release()
