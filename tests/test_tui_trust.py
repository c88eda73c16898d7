"""Pilot tests of the TUI an operator can trust (issue 11): type-ahead never decides an approval, previews show what
will happen, scoped and revocable grants, deny with a note, history, slash commands, help, palette and theme, the
resume screen's detail pane, the verdict dialog, queued prompt editing, leaving a running turn, keyboard scrolling.

Real store, real tools, real subprocesses, the `script` provider; keys go through the app's driver like a terminal's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest
from textual import events
from textual.command import CommandPalette
from textual.widgets import Input, OptionList, Static
from tui_helpers import (
    SIZE,
    approval_ready,
    crashed_turn,
    ended_turns,
    make_world,
    results,
    submit,
    top_screen,
    wait_for,
    write_log,
)

from cairn.app.agent.approval import Grants, command_prefix_covers
from cairn.app.agent.notices import Compacting
from cairn.app.agent.previews import preview_parts
from cairn.app.history import PromptHistory, history_path, redact
from cairn.app.screens.approval import ApprovalModal, Choices
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.help import HelpScreen
from cairn.app.screens.resume import ResumeScreen, process_state
from cairn.app.screens.sessions import SessionsScreen
from cairn.app.screens.typeahead import HELD_TEXT
from cairn.app.screens.verdict import VerdictDialog
from cairn.app.tui import CairnApp
from cairn.persistence.events import (
    DENIED,
    ApprovalDecided,
    ContextCompaction,
    RequestHeader,
    ToolProgress,
    UserMessage,
)
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.status_bar import StatusBar
from cairn.widgets.transcript import Notice, Transcript

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(app: CairnApp, size: tuple[int, int] = SIZE) -> AsyncIterator:
    try:
        async with app.run_test(size=size) as pilot:
            yield pilot
    finally:
        app.close_if_still_open()


def prompt_of(app: CairnApp) -> PromptInput:
    assert app.chat is not None
    return app.chat.query_one(PromptInput)


def decisions(app: CairnApp) -> list[str]:
    return [e.decision for e in app.session.events if isinstance(e, ApprovalDecided)]


def status_text(app: CairnApp) -> str:
    return str(app.chat.query_one(StatusBar).render())


def notices(app: CairnApp) -> list[str]:
    return [str(n.render()) for n in app.chat.query_one(Transcript).query(Notice)]


def send_key(app: CairnApp, char: str) -> None:
    """One key as a terminal delivers it: through the driver, stamped now, without waiting for the app to idle."""
    key = "space" if char == " " else char
    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)


def command_script(*commands: str, text: str = "Running it.", **extra: object) -> list[dict]:
    calls = [{"name": "run_command", "arguments": {"command": c}} for c in commands]
    return [{"text": text, "tool_calls": calls, **extra}, {"text": "Finished."}]


# -- type-ahead -------------------------------------------------------------------------------------------------------

AFTER_OPEN = 32  # keys typed after the modal opened: about two seconds at 50–80 ms a key
SENTENCE = "now save it as a draft and add a summary as said and sort the list by date and size and so on as needed"


async def test_typing_across_the_moment_the_modal_opens_never_decides_it_and_loses_no_character(tmp_path):
    # the model streams for ~1 s before asking, so the modal opens in the middle of the typing
    world = make_world(tmp_path, command_script("printf ran > ran.txt", text="thinking " * 10, chunks=10,
                                                delay_ms=100))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        typed_at_open = None
        for i, char in enumerate(SENTENCE):
            send_key(app, char)
            await asyncio.sleep(0.05 + 0.03 * (i % 2))  # a typist's pace, 50–80 ms a key (the input, not a wait)
            if typed_at_open is None and isinstance(app.screen, ApprovalModal):
                typed_at_open = i + 1
            if typed_at_open is not None and i + 1 - typed_at_open >= AFTER_OPEN:
                break
        assert typed_at_open is not None, "the modal never opened while typing"
        assert 0 < typed_at_open < i, "the typing must straddle the moment the modal opened"
        assert i + 1 - typed_at_open >= AFTER_OPEN  # kept typing after it opened (~2 s: well past the typing window)
        typed = SENTENCE[: i + 1]
        await wait_for(pilot, lambda: prompt_of(app).text == typed, "every typed key in the prompt", timeout=5)

        modal = app.screen
        assert isinstance(modal, ApprovalModal)
        assert decisions(app) == [] and not (world.workspace / "ran.txt").exists()
        assert not modal.armed and guard_text(modal) == HELD_TEXT  # it waits for Tab, and says so

        await pilot.press("tab")  # the operator moves to it on purpose
        await wait_for(pilot, lambda: modal.armed, "the dialog to take the keys")
        await pilot.press("d")  # a deliberate key decides
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["denied"]
        assert prompt_of(app).text == typed  # the draft is still there, untouched by the decision
        assert not (world.workspace / "ran.txt").exists()
        await pilot.press("ctrl+q")


async def test_a_letter_that_is_not_a_choice_sends_the_keys_back_to_the_prompt_until_tab(tmp_path):
    world = make_world(tmp_path, command_script("printf ran > ran.txt"))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await approval_ready(pilot, app)
        for char in "xsad":  # someone starts typing again: "x" is no choice, so it and every key after it is typing
            send_key(app, char)
            await asyncio.sleep(0.06)
        await wait_for(pilot, lambda: prompt_of(app).text == "xsad", "the typing in the prompt")
        assert app.screen is modal and decisions(app) == [] and not modal.armed
        await pilot.press("tab")
        await wait_for(pilot, lambda: modal.armed, "the dialog to take the keys")
        await pilot.press("a")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["allowed_once"]
        assert (world.workspace / "ran.txt").read_text() == "ran"
        await pilot.press("ctrl+q")


def send_mouse(app: CairnApp, kind: type, x: int, y: int) -> None:
    """A mouse button event as a terminal delivers it: through the driver, so the app itself makes the Click."""
    event = kind(None, x, y, 0, 0, 1, False, False, False, screen_x=x, screen_y=y)
    event.set_sender(app)
    app._driver.send_message(event)


def choice_at(modal: ApprovalModal, option_id: str) -> tuple[int, int]:
    return modal.query_one("#choices", Choices).offset_of(option_id)


async def click(app: CairnApp, at: tuple[int, int], held: float = 0.05) -> None:
    send_mouse(app, events.MouseDown, *at)
    await asyncio.sleep(held)
    send_mouse(app, events.MouseUp, *at)
    await asyncio.sleep(0.1)


def guard_text(modal: ApprovalModal) -> str:
    return str(modal.query_one("#guard").render())


async def test_a_click_on_a_dialog_that_waits_for_tab_only_moves_to_it_and_the_next_click_decides(tmp_path):
    # the model streams for ~1 s before asking: the draft is in the prompt before the dialog opens
    world = make_world(tmp_path, command_script("printf ran > ran.txt", text="thinking " * 10, chunks=10,
                                                delay_ms=100))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        prompt_of(app).insert("a draft")  # typing when the dialog opens: it waits for Tab (or a click)
        modal = await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen.is_mounted
                               and app.screen, "the modal")
        assert not modal.armed and guard_text(modal) == HELD_TEXT
        allow = choice_at(modal, "allowed_once")
        await click(app, allow)
        await wait_for(pilot, lambda: modal.armed, "the click to move the operator to the dialog")
        assert app.screen is modal and decisions(app) == [] and not (world.workspace / "ran.txt").exists()
        assert modal.query_one("#choices", Choices).highlighted is None  # not even highlighted
        await click(app, allow)  # a deliberate click on a dialog that has the keys decides
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["allowed_once"] and (world.workspace / "ran.txt").read_text() == "ran"
        assert prompt_of(app).text == "a draft"
        await pilot.press("ctrl+q")


async def test_a_click_during_typing_decides_nothing_and_the_typing_still_lands(tmp_path):
    world = make_world(tmp_path, command_script("printf ran > ran.txt"))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await approval_ready(pilot, app)
        deny = choice_at(modal, "denied")
        typed = "x so said"  # "x" is no choice: typing; the click comes in the middle of it
        for i, char in enumerate(typed):
            send_key(app, char)
            await asyncio.sleep(0.06)
            if i == 3:
                send_mouse(app, events.MouseDown, *deny)
                send_mouse(app, events.MouseUp, *deny)
        await wait_for(pilot, lambda: prompt_of(app).text == typed, "the typing in the prompt")
        assert app.screen is modal and decisions(app) == []
        await pilot.press("tab")
        await wait_for(pilot, lambda: modal.armed, "the dialog to take the keys")
        await click(app, deny)
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["denied"] and not (world.workspace / "ran.txt").exists()
        assert prompt_of(app).text == typed
        await pilot.press("ctrl+q")


# -- previews ---------------------------------------------------------------------------------------------------------


def test_previews_show_a_command_verbatim_with_its_directory_and_files_as_diffs(tmp_path):
    (tmp_path / "notes.py").write_text("a = 1\nb = 2\nc = 3\n")
    command = 'printf "%s\\n" "it\'s" > out.txt && echo \\"done\\"'
    [run] = preview_parts("run_command", {"command": command}, tmp_path)
    assert run.text == command and run.lexer == "bash" and str(tmp_path) in run.caption

    diff, whole = preview_parts("write_file", {"path": "notes.py", "content": "a = 1\nb = 20\nc = 3\n"}, tmp_path)
    assert diff.lexer == "diff" and "-b = 2\n+b = 20\n" in diff.text and " a = 1\n" in diff.text
    assert whole.lexer == "python" and whole.text == "a = 1\nb = 20\nc = 3\n" and whole.line_numbers

    [new_file] = preview_parts("write_file", {"path": "new.md", "content": "# Title\n"}, tmp_path)
    assert "new file" in new_file.caption and new_file.lexer == "markdown"

    [edit] = preview_parts("edit_file", {"path": "notes.py", "old": "c = 3", "new": "c = 30"}, tmp_path)
    assert edit.lexer == "diff" and "-c = 3\n+c = 30\n" in edit.text and " b = 2\n" in edit.text  # with context
    [missing] = preview_parts("edit_file", {"path": "notes.py", "old": "zzz", "new": "y"}, tmp_path)
    assert "will fail" in missing.caption

    [outside] = preview_parts("write_file", {"path": "../escape.txt", "content": "x"}, tmp_path)
    assert "cannot be read" in outside.caption  # confined like the tools: nothing outside is read


async def test_a_long_preview_scrolls_and_the_choices_stay_on_screen_at_80x24(tmp_path):
    content = "".join(f"line {n}\n" for n in range(400))
    script = [{"text": "Writing.", "tool_calls": [{"name": "write_file",
                                                   "arguments": {"path": "big.txt", "content": content}}]}]
    world = make_world(tmp_path, script)
    app = world.new_app()
    async with running(app, (80, 24)) as pilot:
        await submit(pilot, "write it")
        modal = await approval_ready(pilot, app)
        choices = modal.query_one("#choices", Choices)
        preview = modal.query_one("#preview")
        assert choices.region.bottom <= 24 and choices.region.height == 1  # every choice visible, on one line
        assert preview.content_region.height >= 10
        assert preview.max_scroll_y > 0 and preview.scroll_y == 0
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: preview.scroll_y > 0, "the preview to scroll")
        await pilot.press("ctrl+q")


# -- grants, notes -----------------------------------------------------------------------------------------------------


def test_a_prefix_grant_covers_that_command_only_never_a_chained_one():
    assert command_prefix_covers("pytest", "pytest -q tests")
    assert command_prefix_covers("pytest", "pytest")
    for other in ("pytest-evil", "pytest; rm -rf ~", "pytest && rm x", "pytest $(curl x)", "pytest > ~/.bashrc",
                  "pytest `id`", "pytest\nrm x", "pytest | sh", "rm -rf ~ pytest"):
        assert not command_prefix_covers("pytest", other), other
    grants = Grants()
    grants.add("run_command", "pytest")
    grants.add("write_file")
    assert grants.covers("run_command", {"command": "pytest -x"}) and not grants.covers("run_command", {"command": "ls"})
    assert grants.labels() == ["write_file", "run_command: pytest"]
    assert grants.revoke("run_command: pytest") and not grants.covers("run_command", {"command": "pytest"})


async def test_deny_with_a_note_sends_the_note_to_the_model_as_the_tool_result(tmp_path):
    world = make_world(tmp_path, command_script("rm -rf build"))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "clean up")
        modal = await approval_ready(pilot, app)
        await pilot.press("n")
        note = modal.query_one("#note", Input)
        assert note.has_focus
        note.value = "use make clean instead"
        await pilot.press("enter")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        result = results(app.session.events)["call_1_1_1"]
        assert result.error_code == DENIED and result.content.endswith("The operator's note: use make clean instead")
        assert decisions(app) == ["denied"]
        await pilot.press("ctrl+q")


async def test_allowing_a_command_prefix_is_shown_covers_only_it_and_permissions_revokes_it(tmp_path):
    script = [{"text": "One.", "tool_calls": [{"name": "run_command", "arguments": {"command": "echo one"}}]},
              {"text": "Two.", "tool_calls": [{"name": "run_command", "arguments": {"command": "echo two"}}]},
              {"text": "Three.", "tool_calls": [{"name": "run_command", "arguments": {"command": "printf x > b"}}]},
              {"text": "Done."}]
    world = make_world(tmp_path, script + [{"text": "Four.", "tool_calls": [
        {"name": "run_command", "arguments": {"command": "echo four"}}]}, {"text": "Done again."}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "go")
        await approval_ready(pilot, app)
        await pilot.press("p")  # allow commands starting with `echo`
        # "echo two" runs unasked; "printf x > b" asks
        modal = await approval_ready(pilot, app)
        assert modal.request.arguments == {"command": "printf x > b"}
        await wait_for(pilot, lambda: "allowed: run_command: echo" in status_text(app), "the grant in the status bar")
        await pilot.press("d")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        # "echo two" was never asked about, and the log says which grant let it run (SPEC §2 rev 3)
        assert decisions(app) == ["allowed_prefix", "granted", "denied"]
        scopes = [e.scope for e in app.session.events if isinstance(e, ApprovalDecided)]
        assert scopes == ["echo", "run_command: echo", None]
        from cairn.app.commands.housekeeping import markdown
        from cairn.app.render import render_session

        events = list(app.session.events)
        assert "approval: granted (run_command: echo)" in markdown("s", "/w", events, len(events))  # export
        assert "call_1_2_1: granted (run_command: echo)" in render_session(events)  # cairn show

        await submit(pilot, "/permissions")
        await wait_for(pilot, lambda: any("1. run_command: echo" in n for n in notices(app)), "the grants listed")
        await submit(pilot, "/permissions revoke 1")
        await wait_for(pilot, lambda: any("Revoked: run_command: echo" in n for n in notices(app)), "the revoke")
        assert "allowed:" not in status_text(app)
        await submit(pilot, "again")
        modal = await approval_ready(pilot, app)  # echo asks again
        assert modal.request.arguments == {"command": "echo four"}
        await pilot.press("d")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 2, "the second turn to end")
        await pilot.press("ctrl+q")


# -- history, slash commands, help, palette -----------------------------------------------------------------------------


async def test_up_recalls_prompts_across_launches_and_a_failed_turns_prompt_comes_back(tmp_path):
    world = make_world(tmp_path, [{"text": "fine"}, {"text": "cut", "finish_reason": "length"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "first prompt")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "turn 1")
        await submit(pilot, "the prompt that fails with key sk-abcdefghijklmnopqrstuv")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 2, "turn 2")
        assert ended_turns(app.session.events)[1].reason == "error"
        await pilot.press("up")
        assert prompt_of(app).text == "the prompt that fails with key ***"  # back, with the secret masked
        await pilot.press("up")
        assert prompt_of(app).text == "first prompt"
        await pilot.press("down", "down")
        assert prompt_of(app).text == ""  # past the newest: the (empty) draft
        await pilot.press("ctrl+q")

    stored = history_path(world.config.home, world.config.workspace).read_text()
    assert "sk-abc" not in stored
    app2 = world.new_app("second-id")
    async with running(app2) as pilot:
        await pilot.press("up")
        assert prompt_of(app2).text == "the prompt that fails with key ***"
        await pilot.press("ctrl+q")


def test_history_masks_credentials_and_skips_damaged_lines(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"text": "kept"}\nnot json\n')
    history = PromptHistory(path, secrets=("hunter2-key",))
    history.add("login with hunter2-key and password=abc https://me:pw@host/x")
    assert history.entries == ["kept", "login with *** and password=*** https://***@host/x"]
    fresh = PromptHistory(tmp_path / "private" / "h.jsonl")
    fresh.add("hello")
    assert (tmp_path / "private" / "h.jsonl").stat().st_mode & 0o077 == 0  # private to the user
    assert redact("token: abcdef") == "token: ***"


async def test_slash_commands_run_in_the_tui_complete_with_tab_and_never_reach_the_model(tmp_path):
    world = make_world(tmp_path, [{"text": "answer"}])
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press("/", "p", "e")
        popup = app.chat.query_one("#slash", OptionList)
        assert popup.display and popup.option_count == 1 and popup.get_option_at_index(0).id == "permissions"
        await pilot.press("tab")
        assert prompt_of(app).text == "/permissions "
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("Nothing is allowed" in n for n in notices(app)), "the /permissions answer")
        assert not popup.display

        await submit(pilot, "/model other-model")
        await submit(pilot, "/nope")
        await wait_for(pilot, lambda: any("Unknown command /nope" in n for n in notices(app)), "the refusal")
        await submit(pilot, "/help")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.press("escape")
        assert not any(isinstance(e, UserMessage) for e in app.session.events)  # none of it went to the model

        await submit(pilot, "a real prompt")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn")
        [header] = [e for e in app.session.events if isinstance(e, RequestHeader)]
        assert header.model == "other-model"  # /model NAME applies from the next request
        assert "script/other-model" in status_text(app)
        await pilot.press("ctrl+q")


async def test_compact_summarises_the_conversation_before_the_next_request(tmp_path):
    world = make_world(tmp_path, [{"text": "first answer"}, {"text": "Summary: the first thing was done."},
                                  {"text": "second answer"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "first thing")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the first turn")
        await submit(pilot, "/compact")
        await wait_for(pilot, lambda: any("will be compacted" in n for n in notices(app)), "the /compact answer")
        seen: list[str] = []
        app.chat.agent.loop.notices.append(
            lambda n: seen.append(status_text(app)) if isinstance(n, Compacting) and n.active else None)
        await submit(pilot, "second thing")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 2, "the second turn")
        compactions = [e for e in app.session.events if isinstance(e, ContextCompaction)]
        blocks = await wait_for(pilot, lambda: list(app.chat.query(".compaction")), "the compaction to be shown")
        await pilot.press("ctrl+q")
    (compaction,) = compactions
    assert compaction.summary == "Summary: the first thing was done."
    (block,) = blocks
    assert block.collapsed and "context compacted" in str(block.title)
    assert len(seen) == 1 and "compacting…" in seen[0], seen  # the status bar says so while the summary is written


async def test_f1_and_question_mark_in_an_empty_prompt_open_help_listing_every_binding(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help from F1")
        await pilot.press("escape")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help from ?")
        await pilot.press("escape")
        await pilot.press("w", "h", "y", "question_mark")  # not empty: `?` is just text
        assert prompt_of(app).text == "why?" and not isinstance(app.screen, HelpScreen)
        from cairn.app.screens.help import KEYS

        listed = " ".join(key for _, key, _ in KEYS)

        def shown(key: str) -> str:
            key = key.split(",")[0]
            if key == "escape":
                return "Esc"
            if key.startswith("ctrl+"):
                return "Ctrl+" + key[5:].upper()
            return key.upper() if key.startswith("f") and key[1:].isdigit() else key

        for screen_bindings in (app.chat.BINDINGS, ApprovalModal.BINDINGS):
            for binding in screen_bindings:
                if binding.show:
                    assert shown(binding.key) in listed, binding.key
        await pilot.press("ctrl+q")


async def test_the_palette_offers_slash_commands_and_the_chosen_theme_is_kept(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press("ctrl+p")
        palette = await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette) and app.screen, "the palette")
        await pilot.press(*"permis")
        await wait_for(pilot, lambda: "/permissions" in str(palette.query_one("CommandList").get_option_at_index(0).prompt)
                       if palette.query_one("CommandList").option_count else False, "the command offered")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("Nothing is allowed" in n for n in notices(app)), "the command run")
        app.theme = "nord"
        await pilot.pause()
        await pilot.press("ctrl+q")
    assert json.loads((world.config.home / "tui.json").read_text())["theme"] == "nord"
    app2 = world.new_app("second-id")
    async with running(app2) as pilot:
        assert app2.theme == "nord"
        await pilot.press("ctrl+q")


# -- queue, scrolling, leaving ----------------------------------------------------------------------------------------

SLOW = {"text": "streaming a long answer " * 10, "chunks": 60, "delay_ms": 50}


def queue_line(app: CairnApp) -> str:
    return str(app.chat.query_one("#queue", Static).render())


async def test_up_walks_back_through_the_queue_and_enter_puts_the_edit_back_in_its_place(tmp_path):
    world = make_world(tmp_path, [SLOW, {"text": "second"}, {"text": "third"}, {"text": "fourth"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "one")
        await wait_for(pilot, lambda: app.chat.turn_running, "the first turn")
        for text in ("two", "three with a typo", "four"):
            await submit(pilot, text)
        assert app.chat.pending == ["two", "three with a typo", "four"]
        prompt_of(app).insert("my draft")
        await pilot.press("up")
        assert prompt_of(app).text == "four"  # newest queued first
        await pilot.press("up")
        assert prompt_of(app).text == "three with a typo" and prompt_of(app).queue_at == 1
        assert "✎ editing: three with a typo" in queue_line(app) and "prompt 2 of 3:" in queue_line(app)
        prompt_of(app).text = "three"
        await pilot.press("enter")
        assert app.chat.pending == ["two", "three", "four"]  # back in its place, not at the end
        assert prompt_of(app).text == "my draft" and prompt_of(app).queue_at is None
        await wait_for(pilot, lambda: "✎" not in queue_line(app), "the queue line to leave editing")
        assert app.chat.turn_running and [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one"]
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 4, "every turn", timeout=20)
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one", "two", "three", "four"]
        await pilot.press("ctrl+q")


async def test_ctrl_r_removes_any_queued_prompt_and_esc_leaves_one_as_it_was(tmp_path):
    world = make_world(tmp_path, [SLOW, {"text": "second"}, {"text": "third"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "one")
        await wait_for(pilot, lambda: app.chat.turn_running, "the first turn")
        for text in ("two", "three", "four"):
            await submit(pilot, text)
        await pilot.press("up", "up", "up")  # the oldest queued one, not only the last
        assert prompt_of(app).text == "two"
        await pilot.press("ctrl+r")
        assert app.chat.pending == ["three", "four"] and prompt_of(app).text == ""
        await pilot.press("up")
        prompt_of(app).text = "four, changed but not kept"
        await pilot.press("escape")  # leaves it as it was; it does not cancel the running turn
        assert app.chat.pending == ["three", "four"] and prompt_of(app).text == ""
        assert app.chat.turn_running and not ended_turns(app.session.events)
        await pilot.press("up")
        prompt_of(app).text = ""
        await pilot.press("enter")  # an emptied queued prompt is removed too
        assert app.chat.pending == ["three"]
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 2, "both turns", timeout=20)
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one", "three"]
        assert [e.reason for e in ended_turns(app.session.events)] == ["completed", "completed"]
        await pilot.press("ctrl+q")


async def test_the_queue_waits_while_a_queued_prompt_is_open_so_the_old_text_is_never_sent(tmp_path):
    quick = {"text": "a short answer, slowly", "chunks": 15, "delay_ms": 60}
    world = make_world(tmp_path, [quick, {"text": "second"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "one")
        await wait_for(pilot, lambda: app.chat.turn_running, "the first turn")
        await submit(pilot, "two with a typo")
        assert app.chat.pending == ["two with a typo"]
        await pilot.press("up")
        assert prompt_of(app).queue_at == 0
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the first turn to end")
        await asyncio.sleep(0.3)
        assert app.chat.pending == ["two with a typo"] and len(ended_turns(app.session.events)) == 1  # held
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one"]
        prompt_of(app).text = "two"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 2, "the edited prompt's turn")
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one", "two"]
        assert app.chat.pending == []
        await pilot.press("ctrl+q")


async def test_pageup_scrolls_the_transcript_while_the_prompt_keeps_the_focus(tmp_path):
    world = make_world(tmp_path, [{"text": "\n\n".join(f"paragraph {n}" for n in range(60))}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "long")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn")
        transcript = app.chat.query_one(Transcript)
        await wait_for(pilot, lambda: transcript.max_scroll_y > 0 and transcript.scroll_y == transcript.max_scroll_y,
                       "the transcript at its end")
        await pilot.press("pageup")
        await wait_for(pilot, lambda: transcript.scroll_y < transcript.max_scroll_y, "a page up")
        await pilot.press("home")
        await wait_for(pilot, lambda: transcript.scroll_y == 0, "the top")
        await pilot.press("end")
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, "the end")
        assert app.focused is prompt_of(app)
        await pilot.press("ctrl+q")


async def test_leaving_a_running_turn_for_another_session_asks_first(tmp_path):
    world = make_world(tmp_path, [SLOW])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "long")
        await wait_for(pilot, lambda: app.chat.turn_running, "the turn")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "sessions")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("enter")  # the default is to stay
        await pilot.pause()
        assert app.is_running and app.chat.turn_running and not ended_turns(app.session.events)
        await pilot.press("ctrl+q")


# -- resume screen, verdict ---------------------------------------------------------------------------------------------


def test_process_state_checks_the_pid_and_its_start_time(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = int(time.time() * 1000)
        assert process_state(child.pid, started) == "running"
        assert process_state(child.pid, started - 3_600_000) == "not running"  # same pid, another process's time
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid, started) == "not running"


async def test_resume_detail_pane_shows_the_full_command_what_the_model_hears_and_the_process(tmp_path):
    long_command = "rsync -av --delete ./site/ deploy@example.org:/srv/www/site/ && " + "echo " + "x" * 150
    events = crashed_turn()
    events[4].tool_calls[0].arguments["command"] = long_command
    events[-1].arguments["command"] = long_command
    events.append(ToolProgress(turn=1, step=1, call_id="call_1_1_1", pid=os.getpid(), started=int(time.time() * 1000)))
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", events)
    app = world.resume_app("crashed-id")
    async with running(app, (160, 40)) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        assert "was interrupted" in str(screen.query_one("#title").render())
        detail = screen.detail(screen.calls[0])
        assert "The model will be told: Cairn stopped" in str(detail)
        assert f"pid {os.getpid()} — not running" in str(detail)  # this process started long before `started`
        from rich.console import Console

        console = Console(width=400, record=True, file=open(os.devnull, "w"))
        console.print(screen.shown_detail)
        assert long_command in console.export_text()  # verbatim and whole, not cut to a column
        cell = str(screen.query_one("#calls").get_row_at(0)[1])
        assert len(cell) > 60 and long_command[:50] in cell  # wider than the old 28 characters at 160 columns
        await pilot.press("c")
        await pilot.press("ctrl+q")


async def test_no_resume_screen_when_nothing_was_recovered_only_a_notice(tmp_path):
    from tui_helpers import completed_turn

    events = completed_turn(1, "hello", "hi")[:-2]  # cut before step/end: repair closes it, no call in flight
    world = make_world(tmp_path, [])
    write_log(world.store, "cut-id", events)
    app = world.resume_app("cut-id")
    async with running(app) as pilot:
        await wait_for(pilot, lambda: any("no tool call was in flight" in n for n in notices(app)), "the notice")
        assert not isinstance(app.screen, ResumeScreen)
        await pilot.press("ctrl+q")


async def test_verdict_dialog_preselects_nothing_and_enter_records_the_highlighted_answer(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        await pilot.press("v")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog) and app.screen, "the dialog")
        assert dialog.query_one(OptionList).highlighted is None
        await pilot.press("enter")  # nothing chosen: nothing recorded
        assert app.screen is dialog
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, "cancelled")
        assert screen.calls[0].verdict == ""
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the dialog again")
        await pilot.press("down", "down", "down", "enter")  # the third: leave it unknown
        await wait_for(pilot, lambda: app.screen is screen, "recorded")
        assert screen.calls[0].verdict == "unknown"
        await pilot.press("c")
        await pilot.press("ctrl+q")


@pytest.mark.parametrize("command", ["ls; echo x > f.txt", "ls && rm -rf build", "cat a | sh", "echo $(id)",
                                     "ls\nrm x", "echo `id`", "ls > out"])
async def test_a_compound_command_is_never_offered_a_prefix_grant(tmp_path, command):
    world = make_world(tmp_path, command_script(command))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "go")
        modal = await approval_ready(pilot, app)
        assert modal.prefix == ""
        choices = modal.query_one("#choices", Choices)
        offered = [choices.get_option_at_index(i).id for i in range(choices.option_count)]
        assert offered == ["allowed_once", "allowed_session", "denied", "note"], offered
        await pilot.press("p")  # no choice here: typing, so it goes to the prompt and the dialog waits for Tab
        await wait_for(pilot, lambda: prompt_of(app).text == "p", "the p in the prompt")
        assert app.screen is modal and not modal.armed
        await pilot.press("tab", "d")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["denied"]
        await pilot.press("ctrl+q")
