"""The approval dialog's opening grace holds for keys, not only for clicks (README: "Keys and clicks within 0.4 s of
the dialog opening or during a typing burst never decide it"; `app/screens/approval.py`, OPEN_GRACE).

The grace is time-based, so the test drives the dialog's clock through the seam it reads: a key's own timestamp
(`events.Key.time`, what `CairnApp.on_event` hands to `ApprovalModal.diverts`), set relative to the moment the dialog
opened (`opened_at`). Nothing sleeps; every wait is on state (a decision in the log).

The key pressed inside the grace is `d` (deny), the one after it `a` (allow once): if the early key decided anything,
the log says `denied`. (SPEC §11 rev 4 will replace the time-based grace for type-ahead by a rule about what the
operator was doing when the dialog opened; this test pins the grace as it is documented today.)
"""

from __future__ import annotations

from typing import Any

import pytest
from textual import events
from tui_helpers import ended_turns, make_world, running, wait_for

from cairn.app.screens import approval as approval_module
from cairn.app.screens.approval import ApprovalModal
from cairn.persistence.events import ApprovalDecided
from cairn.widgets.prompt_input import PromptInput

pytestmark = pytest.mark.anyio


def press_at(app: Any, key: str, at: float) -> None:
    """One key as a terminal delivers it (through the driver), stamped `at` on the monotonic clock."""
    event = events.Key(key, key)
    event.time = at
    event.set_sender(app)
    app._driver.send_message(event)


def decisions(app: Any) -> list[str]:
    return [e.decision for e in app.session.events if isinstance(e, ApprovalDecided)]


@pytest.mark.parametrize("early", [0.05, "just before the end"])
async def test_a_key_within_the_grace_decides_nothing_and_one_after_it_decides(tmp_path, early):
    grace, gap = approval_module.OPEN_GRACE, approval_module.TYPING_GAP
    assert grace == 0.4
    early_at = grace - 0.01 if early == "just before the end" else early
    late_at = max(grace, early_at + gap) + 0.01  # after the grace, and not part of a typing burst with the early key
    call = {"name": "run_command", "arguments": {"command": "printf ran > ran.txt"}}
    world = make_world(tmp_path, [{"text": "Running it.", "tool_calls": [call]}, {"text": "Finished."}])
    app = world.new_app()
    async with running(app) as pilot:
        app.chat.query_one(PromptInput).insert("run it")
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen.is_mounted
                               and app.screen, "the approval dialog")
        press_at(app, "d", modal.opened_at + early_at)  # deny, pressed inside the grace
        press_at(app, "a", modal.opened_at + late_at)  # allow once, pressed after it
        await wait_for(pilot, lambda: decisions(app), "a decision")
        assert decisions(app) == ["allowed_once"]  # the early `d` decided nothing
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        assert (world.workspace / "ran.txt").read_text() == "ran"
        await pilot.press("ctrl+q")
