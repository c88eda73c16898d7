"""A verdict is what the operator chose (SPEC §11 rev 4; `app/screens/verdict.py`).

Text typed into the verdict's note never changes the chosen verdict, and the note is kept with it: the log's
`recovery/verdict` says the answer chosen and the note exactly as typed. The keys go through the app like a terminal's
(`pilot.press`), at 80×24, without a mouse. Found before the fix: `v`, `h`, "found nothing", Enter logged
`did_not_happen` with an empty note (the note's letters went to the choice list: `n` = did not happen).
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from textual.widgets import Input, OptionList
from tui_helpers import DEPLOY, crashed_turn, make_world, running, top_screen, wait_for, write_log

from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.verdict import VerdictDialog
from cairn.persistence.events import RecoveryVerdict

pytestmark = pytest.mark.anyio

EVERYTHING = string.ascii_lowercase + " " + string.digits + " " + string.ascii_lowercase[::-1]
CHOICES = {"h": "happened", "n": "did_not_happen", "u": "unknown"}


def keys(text: str) -> list[str]:
    return ["space" if c == " " else c for c in text]


def logged(world: Any) -> list[tuple[str, str, str]]:
    return [(e.call_id, e.verdict, e.note) for e in world.log("crashed-id") if isinstance(e, RecoveryVerdict)]


async def open_dialog(pilot: Any, app: Any) -> tuple[ResumeScreen, VerdictDialog]:
    screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
    await pilot.press("v")  # the cursor is on the OUTCOME_UNKNOWN call
    dialog = await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog) and app.screen.is_mounted
                            and app.screen, "the verdict dialog")
    return screen, dialog


def resumed(tmp_path: Any) -> tuple[Any, Any]:
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    return world, world.resume_app("crashed-id")


@pytest.mark.parametrize("choice", list(CHOICES))
async def test_every_letter_typed_into_the_note_is_the_note_and_the_verdict_is_the_one_chosen(tmp_path, choice):
    world, app = resumed(tmp_path)
    async with running(app, (80, 24)) as pilot:
        screen, dialog = await open_dialog(pilot, app)
        await pilot.press(choice)
        assert dialog.choice == list(CHOICES).index(choice)
        await pilot.press(*keys(EVERYTHING))  # h, n and u among them, twice
        assert dialog.choice == list(CHOICES).index(choice)  # unchanged by any of them
        assert dialog.query_one("#note", Input).value == EVERYTHING
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert logged(world) == [(DEPLOY.call_id, CHOICES[choice], EVERYTHING)]
        assert (screen.calls[0].verdict, screen.calls[0].note) == (CHOICES[choice], EVERYTHING)
        await pilot.press("c")
        await app.action_quit()


async def test_the_issue_keys_happened_then_found_nothing_log_happened_with_the_note(tmp_path):
    world, app = resumed(tmp_path)
    async with running(app, (80, 24)) as pilot:
        screen, _ = await open_dialog(pilot, app)
        await pilot.press("h", *keys("found nothing"), "enter")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert logged(world) == [(DEPLOY.call_id, "happened", "found nothing")]
        await pilot.press("c")
        await app.action_quit()


async def test_a_note_typed_before_any_choice_starts_the_note_and_enter_records_nothing_until_one_is_chosen(tmp_path):
    world, app = resumed(tmp_path)
    async with running(app, (80, 24)) as pilot:
        screen, dialog = await open_dialog(pilot, app)
        # `f` is no choice: it starts the note, and the rest (n and h among it) is the note's
        await pilot.press(*keys("found nothing here"), "enter")
        assert app.screen is dialog and dialog.choice is None and logged(world) == []
        assert "Choose an answer first" in str(dialog.query_one("#hint").render())
        assert dialog.query_one("#note", Input).value == "found nothing here"
        assert dialog.query_one(OptionList).has_focus  # back on the list, the note kept
        await pilot.press("u")  # the list's key: leave it unknown, and on to the note
        assert dialog.query_one("#note", Input).has_focus
        await pilot.press("down", "enter")  # ↓ from the note: the next answer (not text)
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert logged(world) == [(DEPLOY.call_id, "happened", "found nothing here")]
        await pilot.press("c")
        await app.action_quit()


async def test_the_dialog_lists_its_keys_and_fits_80x24(tmp_path):
    world, app = resumed(tmp_path)
    async with running(app, (80, 24)) as pilot:
        _, dialog = await open_dialog(pilot, app)
        shown = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        for words in ("h  It happened", "n  It did not happen", "u  Leave it unknown", "h / n / u or ↑↓ choose",
                      "Tab list ⇄ note", "Enter records", "Esc cancels", "Record [enter]", "Cancel [esc]"):
            assert words in shown, words
        box = dialog.query_one("Vertical").region
        assert box.y >= 0 and box.bottom <= 24 and box.right <= 80
        await pilot.press("escape")
        await app.action_quit()
