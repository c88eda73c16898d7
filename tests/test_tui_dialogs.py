"""Pictures of every dialog that decides something, at 80×24 and 120×40 (SPEC §11 rev 4): the approval (taking keys,
and waiting for Tab while the operator types), the verdict dialog with a note, the rewind dialog and its per-path
question. Baselines in the top-level `snapshots/test_tui_dialogs/` (see conftest.py); each test also says in words
what must be on screen — every choice and the dialog's keys, nothing cut, nothing covering them.

Deterministic: fixed session ids and times, fixed workspaces for the previews, the theme set, no blinking cursor.
"""

from __future__ import annotations

import pytest
from rewind_worlds import dialog_at_turn, fixed_turns
from tui_helpers import approval_ready, crashed_turn, make_world, screen_text, top_screen, wait_for, write_log
from tui_helpers import fixed_workspace, picture, repaint  # the pictures

from cairn.app.screens.approval import ApprovalModal, Choices
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.typeahead import HELD_TEXT
from cairn.app.screens.verdict import VerdictDialog
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.tool_card import ToolCard

SIZES = [(80, 24), (120, 40)]
SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]
COMMAND = "pytest -q tests/test_parser.py -k 'rule and not slow'"


def inside(app, region) -> str:
    lines = screen_text(app).splitlines()
    return "\n".join(line[region.x:region.right] for line in lines[region.y:region.bottom])


def assert_shows(app, region, size, *words: str) -> None:
    assert region.x >= 0 and region.y >= 0 and region.right <= size[0] and region.bottom <= size[1]
    text = inside(app, region)
    for word in words:
        assert word in text, (word, text)


def approval_world(tmp_path, **slow):
    world = make_world(tmp_path, [{"text": "Running the parser tests.", "tool_calls": [
        {"name": "run_command", "arguments": {"command": COMMAND}}], **slow}])
    fixed_workspace(world)
    return world


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_approval_dialog_picture(snap_compare, tmp_path, size):
    world = approval_world(tmp_path)
    app = world.new_app()

    async def ask(pilot) -> None:
        app.chat.query_one(PromptInput).insert("run the parser tests")
        await pilot.press("enter")
        modal: ApprovalModal = await approval_ready(pilot, app)
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")
        await repaint(pilot, app, durable=False)
        labels = modal.query_one("#choices", Choices).labels()
        assert_shows(app, modal.query_one("#dialog").region, size, "Allow run_command?", COMMAND, *labels,
                     "Choose with a key")

    assert picture(snap_compare, app, size, ask)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_approval_dialog_waiting_for_tab_while_the_operator_types_picture(snap_compare, tmp_path, size):
    # the model streams for ~0.6 s before asking: the operator's next prompt is half typed when the dialog opens
    world = approval_world(tmp_path, chunks=6, delay_ms=100)
    app = world.new_app()

    async def ask(pilot) -> None:
        prompt = app.chat.query_one(PromptInput)
        prompt.insert("run the parser tests")
        await pilot.press("enter")
        prompt.insert("and then add a test for rule 3")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen.is_mounted
                               and app.screen, "the dialog")
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")
        # mounted is not yet drawn: repaint the chat behind the dialog until its last layout holds the card
        card = app.chat.query_one(ToolCard)
        for _ in range(100):
            await repaint(pilot, app, durable=False)
            if card in app.chat._compositor.visible_widgets:
                break
        assert card in app.chat._compositor.visible_widgets, "the card was never laid out behind the dialog"
        assert not modal.armed
        assert_shows(app, modal.query_one("#dialog").region, size, "Allow run_command?", HELD_TEXT,
                     *modal.query_one("#choices", Choices).labels())

    assert picture(snap_compare, app, size, ask)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_verdict_dialog_with_a_note_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    fixed_workspace(world)
    app = world.resume_app("crashed-id")

    async def noted(pilot) -> None:
        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        await pilot.press("v")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog) and app.screen, "the dialog")
        await pilot.press("n", *("space" if c == " " else c for c in "found nothing on the server"))
        await repaint(pilot, app, durable=False)
        assert dialog.choice == 1
        assert_shows(app, dialog.query_one("Vertical").region, size, "Did run_command (call_1_1_1) take effect?",
                     "h  It happened", "n  It did not happen", "u  Leave it unknown",
                     "Your answer: It did not happen", "found nothing on the server", "h / n / u or ↑↓ choose",
                     "Record [enter]", "Cancel [esc]")

    assert picture(snap_compare, app, size, noted)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_rewind_dialog_and_its_keys_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    fixed_turns(world)
    app = world.resume_app("rewind-id")

    async def shown(pilot) -> None:
        dialog = await dialog_at_turn(pilot, app, 2)
        await repaint(pilot, app, durable=False)
        assert_shows(app, dialog.query_one("Vertical").region, size, "Rewind", "2  change a.txt and add b.txt",
                     "Files [f]", "Conversation [c]", "Both [b]", "Cancel [esc]", "↑↓ choose the turn")

    assert picture(snap_compare, app, size, shown)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_rewind_per_path_question_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    fixed_turns(world)
    app = world.resume_app("rewind-id")

    async def asked(pilot) -> None:
        await dialog_at_turn(pilot, app, 2)
        await pilot.press("b")
        question = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "the question")
        await repaint(pilot, app, durable=False)
        assert question.takes_keys  # `b` is the operator's own key on a dialog: no typing, keys at once
        assert_shows(app, question.query_one("Vertical").region, size, "notes.md", "Overwrite it?",
                     "Leave it [n]", "Overwrite [y]", "y yes · n or Esc no")

    assert picture(snap_compare, app, size, asked)
