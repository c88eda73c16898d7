"""Snapshot tests of the TUI's screens (baselines in the top-level `snapshots/test_tui_snapshots/`, see conftest.py).

Deterministic by construction: fixed session ids and creation times, logs written with fixed event times where a
screen shows a time (the sessions screen, rendered in UTC), the `script` provider with no delays, the header cwd a
fixed string, the theme set explicitly, and the prompt's cursor not blinking. `snap_compare` runs the app on its own
event loop, so these tests are plain functions.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_helpers import ControlledOps
from cairn.app.screens.approval import ApprovalModal
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.sessions import SessionsScreen
from cairn.app.tui import CairnApp
from cairn.persistence.events import AssistantChunk, StepEnd, StepStart, TurnStart, UserMessage
from cairn.persistence.locks import SessionLock
from tui_helpers import approval_ready, completed_turn, crashed_turn, make_world, screen_text, top_screen, wait_for
from tui_helpers import fixed_workspace, picture, repaint, submit, write_log
from cairn.widgets.status_bar import StatusBar
from cairn.widgets.tool_card import ToolCard
from cairn.widgets.reasoning import ReasoningBlock
from cairn.widgets.transcript import AssistantText

SIZE = (120, 32)


def status(app: CairnApp) -> str:
    return str(app.chat.query_one(StatusBar).render())


def test_empty_chat(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    assert picture(snap_compare, app, SIZE)


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
        await submit(pilot, "what is in this workspace?")
        final = "The workspace holds `README.md` and `src/`; the README says **hello**."
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["done", "done"], "two cards")
        await wait_for(pilot, lambda: [a.source for a in app.chat.query(AssistantText)][-1:] == [final], "answer")
        await wait_for(pilot, lambda: "idle" in status(app) and "durable through seq 16" in status(app), "idle")

    assert picture(snap_compare, app, SIZE, run_turn)


def test_step_with_reasoning_collapsed_above_its_answer_and_token_usage(snap_compare, tmp_path):
    answer = "A cairn is a pile of stones that marks a trail."
    world = make_world(tmp_path, [
        {"reasoning": "The user asks what a cairn is.\nA short definition will do.", "text": answer,
         "usage": {"input_tokens": 1234, "output_tokens": 56}},
    ])
    app = world.new_app()

    async def run_turn(pilot) -> None:
        await submit(pilot, "what is a cairn?")
        await wait_for(pilot, lambda: [a.source for a in app.chat.query(AssistantText)][-1:] == [answer], "answer")
        await wait_for(pilot, lambda: "idle" in status(app) and "durable through seq 8" in status(app), "idle")
        block = app.chat.query_one(ReasoningBlock)
        assert block.collapsed and not block.streaming
        # the screen shows the whole final title (on a busy loop it once stayed cut short, at the width the title
        # had as "thinking… 0 chars")
        await wait_for(pilot, lambda: "▶ reasoning · 58 chars" in screen_text(app), "the final title on screen")

    assert picture(snap_compare, app, SIZE, run_turn)


def test_approval_modal(snap_compare, tmp_path):
    world = make_world(tmp_path, [
        {"text": "I will write the greeting.",
         "tool_calls": [{"name": "run_command", "arguments": {"command": "echo hello > greeting.txt"}}]},
    ])

    fixed_workspace(world)
    app = world.new_app()

    async def ask(pilot) -> None:
        await submit(pilot, "write a greeting file")
        await approval_ready(pilot, app)  # the hint line says so once typing can no longer decide it
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")
        await repaint(pilot, app, durable=False)

    assert picture(snap_compare, app, SIZE, ask)
    assert not (world.workspace / "greeting.txt").exists()


def approval_snapshot(snap_compare, tmp_path, call: dict, files: dict[str, str] | None = None) -> bool:
    world = make_world(tmp_path, [{"text": "Here is the change.", "tool_calls": [call]}])
    workspace = fixed_workspace(world)
    for name, text in (files or {}).items():
        (workspace / name).write_text(text)
    app = world.new_app()

    async def ask(pilot) -> None:
        await submit(pilot, "make the change")
        await approval_ready(pilot, app)
        # the transcript behind it drawn too (events reach the screen once a frame)
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")
        await repaint(pilot, app, durable=False)

    return picture(snap_compare, app, SIZE, ask)


PARSER = "".join(f"def rule_{n}(tokens):\n    return tokens[{n}:]\n\n" for n in range(12))


def test_approval_preview_of_write_file_as_a_diff_and_the_highlighted_file(snap_compare, tmp_path):
    new = PARSER.replace("return tokens[1:]", "return tokens[1:] or None")
    assert approval_snapshot(snap_compare, tmp_path, {"name": "write_file",
                             "arguments": {"path": "parser.py", "content": new}}, {"parser.py": PARSER})


def test_approval_preview_of_edit_file_as_a_coloured_diff_with_context(snap_compare, tmp_path):
    assert approval_snapshot(snap_compare, tmp_path, {"name": "edit_file", "arguments": {
        "path": "parser.py", "old": "def rule_3(tokens):\n    return tokens[3:]",
        "new": "def rule_3(tokens: list[str]) -> list[str]:\n    return tokens[3:]"}}, {"parser.py": PARSER})


def test_approval_preview_of_a_long_command_verbatim_with_prefix_choice(snap_compare, tmp_path):
    command = ('pytest -q tests/test_parser.py -k "rule and not slow" --maxfail=1 '
               + " ".join(f"--deselect tests/test_parser.py::test_case_{n}" for n in range(8)))
    assert approval_snapshot(snap_compare, tmp_path, {"name": "run_command", "arguments": {"command": command}})


def test_help_screen(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    assert picture(snap_compare, app, SIZE, press=["f1"])


def test_command_palette_with_slash_commands(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()

    async def opened(pilot) -> None:
        from textual.command import CommandPalette

        await pilot.press("ctrl+p", *"/perm")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette)
                       and app.screen.query_one("CommandList").option_count == 1, "the one match")
        # the search is over (its busy countdown stopped) and its spinner is not shown
        palette = app.screen
        await wait_for(pilot, lambda: palette._busy_timer is None and not palette._show_busy, "the search to end")
        await pilot.pause()

    assert picture(snap_compare, app, SIZE, opened)


def test_resume_detail_pane(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    events = crashed_turn()
    command = "rsync -av --delete ./site/ deploy@example.org:/srv/www/site/ && ssh deploy@example.org 'systemctl reload nginx'"
    events[4].tool_calls[0].arguments["command"] = command
    events[-1].arguments["command"] = command
    write_log(world.store, "crashed-id", events)
    fixed_workspace(world)
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")

    assert picture(snap_compare, app, SIZE, shown)


def test_failed_barrier_notice(snap_compare, tmp_path):
    ops = ControlledOps()
    world = make_world(tmp_path, [{"text": "never asked"}], ops=ops)
    app = world.new_app()
    ops.fail_fsync = 1_000  # the disk keeps failing: every barrier from here on gets EIO

    async def fail(pilot) -> None:
        await submit(pilot, "hello")
        await wait_for(pilot, lambda: app.chat.query_one(StatusBar).failed and "CHECKPOINT FAILED" in status(app),
                       "the red notice")
        await wait_for(pilot, lambda: "idle" in status(app), "the failed turn to end")
        assert app.provider.requests_served == 0
        raised = [(n.title, n.message) for n in app._notifications]
        assert any(title == "Checkpoint failed" for title, _ in raised), raised
        app.clear_notifications()  # the toasts stack over the status bar; the picture is about the bar

    def heal() -> None:
        ops.fail_fsync = 0  # so the final close can write what the failed barriers kept queued

    assert picture(snap_compare, app, SIZE, fail, before_close=heal)


def test_resume_screen_with_not_started_and_outcome_unknown_rows(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    fixed_workspace(world)  # the detail pane shows where the command ran
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        assert [c.status for c in app.screen.calls] == ["OUTCOME_UNKNOWN", "NOT_STARTED"]

    assert picture(snap_compare, app, SIZE, shown)


def test_verdict_dialog(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    fixed_workspace(world)  # the detail pane shows where the command ran
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")

    assert picture(snap_compare, app, SIZE, shown, press=["v"])


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

        assert picture(snap_compare, app, SIZE, shown)
    finally:
        lock.release()
