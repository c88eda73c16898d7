"""No keystroke typed as text decides anything (SPEC §11 rev 4; `app/screens/typeahead.py`).

A dialog Cairn raises while the operator is typing (a key other than the Enter that sent the prompt in the last 1.5 s,
or a non-empty prompt) leaves every key in the prompt and decides only after Tab; opened on an idle, empty prompt it
takes keys at once; a dialog the operator opened with a key takes keys at once. Typing is judged by each key's own time
(`events.Key.time`), which these tests set through the driver like a terminal's keys, so nothing here sleeps to make a
key "late": every wait is on state. The typing robot in a real terminal (tmux, or a pty read by pyte) at 0.05 to 1.0 s a
key is the last test here (marked slow).

Mutations tried: "rule removed" (`Dialog.route` passing every key on to the dialog) fails
`test_prose_typed_across_the_opening_never_decides_and_lands_in_the_prompt` at every speed; "typing never seen"
(`KeyRouter.typing_at` always False) fails the 1.5 s window test and every raised-dialog test; the time a key is handled
instead of its own time fails the prose test and the two "pressed before it showed" tests; toasts left visible on
dialogs fail the toast test.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from textual import events
from tui_helpers import approval_ready, crashed_turn, ended_turns, make_world, running, top_screen, wait_for
from tui_helpers import submit, write_log

from cairn.app.screens.approval import ApprovalModal, Choices
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.help import help_table
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.rewind import PendingRewindScreen, RewindScreen
from cairn.app.screens.typeahead import HELD_TEXT, TYPING_WINDOW, Dialog
from cairn.app.screens.verdict import VerdictDialog
from cairn.persistence.events import ApprovalDecided
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.transcript import Notice, Transcript

pytestmark = pytest.mark.anyio

PROSE = "and then ask, so please do add a note"  # a, s, d, n and p among its letters: each one a choice


def key_of(char: str) -> str:
    return {" ": "space", ",": "comma", ".": "full_stop"}.get(char, char)


def press_at(app: Any, char: str, at: float, key: str | None = None) -> None:
    """One key as a terminal delivers it (through the driver), stamped `at` on the monotonic clock."""
    event = events.Key(key or key_of(char), char if len(char) == 1 else None)
    event.time = at
    event.set_sender(app)
    app._driver.send_message(event)


def decisions(app: Any) -> list[str]:
    return [e.decision for e in app.session.events if isinstance(e, ApprovalDecided)]


def prompt(app: Any) -> PromptInput:
    return app.chat.query_one(PromptInput)


def command_script(command: str = "printf ran > ran.txt", **slow: object) -> list[dict]:
    return [{"text": "Running it.", "tool_calls": [{"name": "run_command", "arguments": {"command": command}}],
             **slow}, {"text": "Finished."}]


async def denied_then_quit(pilot: Any, app: Any) -> None:
    """`d` decides the approval: the turn ends with that call denied, the only decision; then Ctrl+Q."""
    await pilot.press("d")
    await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
    assert decisions(app) == ["denied"]
    await pilot.press("ctrl+q")


async def modal_of(pilot: Any, app: Any) -> ApprovalModal:
    return await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen.is_mounted
                          and app.screen.shown_at is not None and app.screen, "the approval dialog")


# -- the approval: typed prose at any speed -----------------------------------------------------------------------------


@pytest.mark.parametrize("gap", [0.05, 0.2, 0.35, 0.5, 1.0, 3.0])
async def test_prose_typed_across_the_opening_never_decides_and_lands_in_the_prompt(tmp_path, gap):
    """The prose's first half was typed before the dialog showed (stamped so, handled after), the rest after it, one
    key every `gap` seconds by the keys' own times: nothing decides, every character is in the prompt, and Tab plus
    one key decides."""
    world = make_world(tmp_path, command_script())
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await modal_of(pilot, app)
        half = len(PROSE) // 2
        for i, char in enumerate(PROSE):
            press_at(app, char, modal.shown_at + (i - half + 0.5) * gap)
        await wait_for(pilot, lambda: prompt(app).text == PROSE, "every typed character in the prompt")
        assert decisions(app) == [] and app.screen is modal and not (world.workspace / "ran.txt").exists()
        assert not modal.armed and modal.guard_text() == HELD_TEXT
        later = modal.shown_at + (len(PROSE) - half + 1) * gap
        press_at(app, "", later, key="tab")  # moves to the dialog on purpose: one extra key
        await wait_for(pilot, lambda: modal.armed, "the dialog to take the keys")
        assert decisions(app) == []
        press_at(app, "a", later + 0.5)
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["allowed_once"] and (world.workspace / "ran.txt").read_text() == "ran"
        assert prompt(app).text == PROSE  # the draft stays where it was typed
        await pilot.press("ctrl+q")


async def test_a_key_typed_in_the_last_moments_before_the_dialog_makes_it_wait_even_with_an_empty_prompt(tmp_path):
    # the model streams for ~0.6 s before asking: typed meanwhile (and rubbed out), the keys are recent when it opens
    world = make_world(tmp_path, command_script(text="thinking " * 6, chunks=6, delay_ms=100))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        now = time.monotonic()
        press_at(app, "x", now)
        press_at(app, "", now + 0.01, key="backspace")
        modal = await modal_of(pilot, app)
        assert prompt(app).text == "" and modal.shown_at - now < TYPING_WINDOW
        assert not modal.armed and modal.guard_text() == HELD_TEXT
        press_at(app, "d", time.monotonic())
        await wait_for(pilot, lambda: prompt(app).text == "d", "the d in the prompt")
        assert decisions(app) == []
        await pilot.press("tab", "d")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["denied"]
        await pilot.press("ctrl+q")


async def test_keys_typed_long_before_and_the_enter_that_sent_do_not_count_an_idle_dialog_takes_keys_at_once(tmp_path):
    world = make_world(tmp_path, command_script(text="thinking " * 3, chunks=3, delay_ms=100))
    app = world.new_app()
    async with running(app) as pilot:
        old = time.monotonic() - TYPING_WINDOW - 1.0
        press_at(app, "x", old)  # typed and rubbed out long before
        press_at(app, "", old + 0.01, key="backspace")
        await submit(pilot, "run it")  # the Enter that sent the prompt is not typing
        modal = await approval_ready(pilot, app)
        assert modal.guard_text().startswith("Choose")
        await denied_then_quit(pilot, app)


async def test_a_key_pressed_before_an_idle_dialog_showed_is_typing_by_its_own_time(tmp_path):
    """Handled after the dialog opened, pressed before it: the key's own time decides, so it is typing."""
    world = make_world(tmp_path, command_script())
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await approval_ready(pilot, app)
        press_at(app, "a", modal.shown_at - 0.01)
        await wait_for(pilot, lambda: prompt(app).text == "a", "the a in the prompt")
        assert decisions(app) == [] and not modal.armed
        await pilot.press("tab", "d")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert decisions(app) == ["denied"]
        await pilot.press("ctrl+q")


async def test_tab_on_a_dialog_that_has_the_keys_changes_nothing_it_decides(tmp_path):
    world = make_world(tmp_path, command_script())
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await approval_ready(pilot, app)
        choices = modal.query_one("#choices", Choices)
        await pilot.press("tab", "tab", "shift+tab", "tab", "enter")
        await pilot.pause()
        assert app.screen is modal and modal.armed and decisions(app) == []
        assert choices.highlighted is None and choices.has_focus  # Enter chose nothing: nothing was highlighted
        await denied_then_quit(pilot, app)


async def test_letters_typed_into_the_approval_note_are_the_note_and_never_choose(tmp_path):
    world = make_world(tmp_path, command_script())
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        modal = await approval_ready(pilot, app)
        await pilot.press("n")
        note = "use make clean as said and pass"
        await pilot.press(*(key_of(c) for c in note))
        assert app.screen is modal and decisions(app) == []
        await pilot.press("enter")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        decided = [e for e in app.session.events if isinstance(e, ApprovalDecided)]
        assert [d.decision for d in decided] == ["denied"]
        assert not (world.workspace / "ran.txt").exists()
        await pilot.press("ctrl+q")


# -- every dialog that changes something ----------------------------------------------------------------------------


def pending_plan() -> Any:
    return SimpleNamespace(to_turn=2, files=[SimpleNamespace(path="a.txt")], conversation=True)


RAISED = {
    "confirm": (lambda typist: ConfirmDialog("Overwrite a.txt?", yes="Overwrite", no="Leave it", typist=typist),
                "y", True),
    "pending rewind": (lambda typist: PendingRewindScreen(pending_plan(), set(), typist=typist), "f", "finish"),
    "verdict": (lambda typist: VerdictDialog("call_1", "run_command", typist=typist), "escape", None),
}


@pytest.mark.parametrize("kind", list(RAISED))
async def test_every_dialog_cairn_raises_keeps_typed_keys_in_the_prompt_until_tab(tmp_path, kind):
    build, decide, result = RAISED[kind]
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        prompt(app).insert("draft ")  # a non-empty prompt: the operator is typing
        answers: list[Any] = []
        dialog = build(app.chat.keys)
        app.push_screen(dialog, answers.append)
        await wait_for(pilot, lambda: dialog.is_mounted and dialog.shown_at is not None, "the dialog")
        assert dialog.held and dialog.guard_text() == HELD_TEXT
        key = decide if decide != "escape" else "x"
        await pilot.press(key)
        await wait_for(pilot, lambda: prompt(app).text.endswith(key), "the key in the prompt")
        assert app.screen is dialog and answers == []
        await pilot.press("tab")
        assert dialog.takes_keys and dialog.guard_text() != HELD_TEXT
        await pilot.press(decide)
        await wait_for(pilot, lambda: answers, "the answer")
        assert answers == [result]
        await pilot.press("ctrl+q")


@pytest.mark.parametrize("kind", list(RAISED))
async def test_a_dialog_raised_on_an_idle_empty_prompt_or_opened_by_a_key_takes_keys_at_once(tmp_path, kind):
    build, decide, result = RAISED[kind]
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        for typist in (app.chat.keys, None):  # raised by Cairn on an idle prompt / opened by the operator
            answers: list[Any] = []
            dialog = build(typist)
            app.push_screen(dialog, answers.append)
            await wait_for(pilot, lambda: dialog.is_mounted, "the dialog")
            assert dialog.takes_keys and dialog.guard_text() != HELD_TEXT
            await pilot.press(decide)
            await wait_for(pilot, lambda: answers, "the answer")
            assert answers == [result]
        await pilot.press("ctrl+q")


async def test_the_resume_screen_cairn_opens_takes_no_key_pressed_before_it_showed(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        press_at(app, "c", screen.shown_at - 0.01)  # "continue", typed before the screen was there
        press_at(app, "v", screen.shown_at - 0.005)
        await wait_for(pilot, lambda: prompt(app).text == "cv", "the keys in the prompt")
        assert app.screen is screen and screen.held
        await pilot.press("tab", "v")
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the verdict dialog (opened by a key)")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, "back on the resume screen")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the chat")
        assert prompt(app).text == "cv"
        await pilot.press("ctrl+q")


async def test_a_stray_letter_on_the_evidence_question_is_typing_not_an_answer(tmp_path):
    from rewind_worlds import evidence_world

    world = evidence_world(tmp_path)
    app = world.resume_app("crashed-id")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        press_at(app, "e", time.monotonic() + 1.0)  # on its own: a decision (the resume screen's typing gap)
        question = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "the question")
        base = time.monotonic() + 2.0
        for i, char in enumerate("very"):  # "every", at one key a second: no `y` may answer it
            press_at(app, char, base + i)
        await wait_for(pilot, lambda: prompt(app).text == "very", "the typing in the prompt")
        assert app.screen is question and screen.calls[0].verdict == ""
        await pilot.press("ctrl+q")


# -- the rewind dialog (opened by a key) and its per-path question (raised by Cairn) -------------------------------


async def test_a_y_typed_on_the_heels_of_b_never_answers_the_rewinds_overwrite_question(tmp_path):
    """The rewind dialog is opened by the operator (keys at once); its per-path question is raised by Cairn: a `y`
    pressed before the question was on screen (handled after it) is typing, not a yes."""
    from rewind_worlds import PICTURE_WORKSPACE, choose_turn, fixed_turns, open_by_slash

    world = make_world(tmp_path, [])
    fixed_turns(world)
    app = world.resume_app("rewind-id")
    async with running(app) as pilot:
        dialog = await open_by_slash(pilot, app)
        assert dialog.takes_keys and "↑↓ choose the turn" in dialog.guard_text()
        await choose_turn(pilot, dialog, 2)
        await pilot.press("b")
        question = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen.is_mounted
                                  and app.screen, "the question")
        press_at(app, "y", question.shown_at - 0.001)  # pressed before the question was on screen, handled after
        await wait_for(pilot, lambda: prompt(app).text == "y", "the y in the prompt")
        assert question.held and question.guard_text() == HELD_TEXT
        assert (PICTURE_WORKSPACE / "notes.md").read_text() == "edited by hand\n"
        await pilot.press("tab", "n")  # moves to the question, then: leave it
        await wait_for(pilot, lambda: app.screen is app.chat and not app.chat.rewinding, "the rewind to end")
        assert (PICTURE_WORKSPACE / "notes.md").read_text() == "edited by hand\n"  # never overwritten
        await app.action_quit()


# -- nothing covers a dialog's choices ---------------------------------------------------------------------------------


async def test_a_toast_never_covers_the_approval_and_what_cairn_reports_meanwhile_goes_to_the_transcript(tmp_path):
    content = "".join(f"line {n}\n" for n in range(400))  # a preview long enough for the dialog's full height
    world = make_world(tmp_path, [{"text": "Writing.", "tool_calls": [
        {"name": "write_file", "arguments": {"path": "big.txt", "content": content}}]}, {"text": "Finished."}])
    app = world.new_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        try:
            left_out = "left out of workspace snapshots (not restorable): build/huge.bin"
            app.chat._toast(left_out, severity="error", timeout=8)  # shown just before the dialog opens
            await submit(pilot, "run it")
            modal = await approval_ready(pilot, app)
            app.chat.report("checkpoint trouble while the dialog is up")
            await wait_for(pilot, lambda: any("checkpoint trouble" in str(n.render())
                                              for n in app.chat.query_one(Transcript).query(Notice)),
                           "the report in the transcript")
            assert not any("checkpoint trouble" in n.message for n in app._notifications)  # no toast for it
            await pilot.pause()
            lines = [strip.text for strip in app.screen._compositor.render_strips()]
            box = modal.query_one("#dialog").region
            inside = "\n".join(line[box.x:box.right] for line in lines[box.y:box.bottom])
            for label in ("a once", "s session", "d deny", "n deny + note", "Choose with a key"):
                assert label in inside, (label, inside)
            # the toast shown before stays on the chat, under the dialog; what was reported meanwhile is in the
            # transcript, under it too
            assert "left out of" not in inside and "restorable" not in inside
            assert "checkpoint trouble" not in inside
            choices = modal.query_one("#choices", Choices)
            assert choices.region.bottom < box.bottom <= 24
            await pilot.press("d")
            await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
            await wait_for(pilot, lambda: "left out of" in "\n".join(
                strip.text for strip in app.screen._compositor.render_strips()), "the toast back on the chat")
            await pilot.press("ctrl+q")
        finally:
            app.close_if_still_open()


# -- every dialog lists its keys, and help lists them all ----------------------------------------------------------


def test_help_lists_every_dialogs_keys_and_the_tab_rule():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(help_table())
    text = console.export_text()
    for words in ("Tab", "typing… Tab to decide", "approval", "allow this call once", "deny, and type a note",
                  "verdict", "h / n / u", "yes / no", "y / n", "rewind", "f / a", "resume", "v / e / c / i"):
        assert words in text, words
    assert "0.4 s" not in text


async def test_every_dialog_shows_its_keys_on_itself(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        expected = {
            ConfirmDialog("Sure?"): ("y yes", "n or Esc no"),
            VerdictDialog("call_1", "run_command"): ("h / n / u", "Enter records", "Esc cancels"),
            PendingRewindScreen(pending_plan(), set()): ("f finish", "a abandon"),
            RewindScreen([], world.workspace, None): ("Files [f]", "Conversation [c]", "Both [b]", "Cancel [esc]",
                                                      "↑↓ choose the turn"),
        }
        for dialog, words in expected.items():
            app.push_screen(dialog)
            assert isinstance(dialog, Dialog)

            def shown() -> str:
                return "\n".join(strip.text for strip in app.screen._compositor.render_strips())

            await wait_for(pilot, lambda: dialog.is_mounted and all(word in shown() for word in words),
                           f"{type(dialog).__name__} to show {words}", timeout=5)
            dialog.dismiss(None)
            await wait_for(pilot, lambda: app.screen is app.chat, "back to the chat")
        await pilot.press("ctrl+q")


# -- a typing robot in a real terminal (tmux, or a pty read by pyte: tests/terminal_driver.py) -----------------------

ROBOT_PROSE = "and then ask, so please do add a note as said "  # every choice's letter, soon after any moment
ROBOT_RESULTS: dict[float, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.05, 0.2, 0.35, 0.5, 1.0])
def test_a_typing_robot_in_a_real_terminal_never_decides_an_approval_at_any_speed(tmp_path, gap):
    """`cairn` in a real terminal; the model streams ~1.2 s and then asks to run a command. The robot sends the prompt,
    then types prose one key at a time, `gap` seconds apart, across the moment the dialog appears and on after
    it. No decision, no command run, every character in the prompt; then Tab and `a` (one extra key) allow it."""
    import math
    import os
    import sys as _sys
    from pathlib import Path

    from agent_helpers import write_script
    from terminal_driver import terminal
    from tui_helpers import iter_ids, types_of, wait_sync

    from cairn.persistence.store import SessionStore

    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    made = ws / "made.txt"
    script = write_script(tmp_path / "script.json", [
        {"text": "Let me think about that for a moment. " * 2, "chunks": 5, "delay_ms": 300,
         "tool_calls": [{"name": "run_command", "arguments": {"command": "printf made > made.txt"}}]},
        {"text": "Done."}])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "TERM": "xterm-256color", "CAIRN_HOME": str(home), "CAIRN_SNAPSHOTS": "off"}
    cairn = str(Path(_sys.executable).parent / "cairn")
    term = terminal(env)
    try:
        term.start("robot", ws, f"{cairn} --provider script --script {script}")
        term.wait_screen("robot", "New session")
        term.send_text("robot", "run the deploy")
        term.send_keys("robot", "Enter")
        keys_after = max(6, math.ceil(1.0 / gap))  # typing goes on a second (six keys at least) after it appeared
        give_up = math.ceil(25 / gap)  # keys (25 s at this pace) before the dialog is declared never to have opened
        typed, opened_after, sent_at = "", None, time.monotonic()
        i = 0
        while True:
            char = ROBOT_PROSE[i % len(ROBOT_PROSE)]
            i += 1
            next_at = sent_at + gap  # the robot's pace (the input, not a wait)
            while time.monotonic() < next_at:
                time.sleep(0.005)
            sent_at = time.monotonic()
            term.send_text("robot", char)
            typed += char
            if opened_after is None and "Allow run_command?" in term.screen("robot"):
                opened_after = len(typed)  # keys sent before the dialog was seen on screen (at most)
            if opened_after is not None and len(typed) - opened_after >= keys_after:
                break
            assert opened_after is not None or i < give_up, "the dialog never opened"
        assert 0 < opened_after < len(typed), "the typing must straddle the moment the dialog opened"
        assert set(typed[opened_after:]) & set("asdnp"), "a choice's letter must be typed while the dialog is up"
        term.wait_screen("robot", "Allow run_command?", "Tab to decide")
        assert not made.exists(), "a typed key decided the approval"
        (session_id,) = iter_ids(home)
        store = SessionStore(home)
        log_types = types_of(store.backend.load(session_id).events)
        assert "approval/asked" in log_types and "approval/decided" not in log_types
        # no character lost: the prompt behind the dialog holds all of it (the screen trims a trailing space)
        wait_sync(lambda: typed.rstrip() in term.screen("robot"), "every typed character in the prompt", 10)

        term.send_keys("robot", "Tab")  # one extra key: the operator moves to the dialog
        term.wait_screen("robot", "Allow run_command?", "Choose with a key")
        term.send_keys("robot", "a")
        wait_sync(made.exists, "the command allowed by the deliberate key to run", 20)
        events = store.backend.load(session_id).events
        assert [e.decision for e in events if type(e).__name__ == "ApprovalDecided"] == ["allowed_once"]
        wait_sync(lambda: "Allow run_command?" not in term.screen("robot") and typed.rstrip() in term.screen("robot"),
                  "the draft still in the prompt", 10)
        ROBOT_RESULTS[gap] = (f"{gap:.2f} s/key: {len(typed)} keys, {opened_after} before the dialog was seen, "
                              f"{len(typed) - opened_after} after; no decision, no character lost; Tab + a allowed it")
        print("\nrobot:", ROBOT_RESULTS[gap])
        term.send_keys("robot", "C-q")
    finally:
        term.close()
