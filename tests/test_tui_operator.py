"""The TUI at 80×24 and by keyboard alone (issue 28): the decision first at every size (approval preview with the
choices on one line, resume table columns, sessions list with whole ids and a size column, a status bar that keeps
`durable through seq N`), every action by keyboard (tool cards, reasoning and compaction lines), `sending…` at the first
refresh after Enter, the cosmetic fixes, and lock files that live exactly as long as their session.

Pictures at 80×24, 120×32 and 200×50; each also asserts the words that must be visible, so a baseline accepted by
mistake cannot hide a clipped word. No test here asserts a duration.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import approval_ready, completed_turn, make_world, screen_text, top_screen, wait_for, write_log
from tui_helpers import fixed_workspace, picture, repaint  # the pictures

from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.tool_card import ToolCard
from cairn.widgets.transcript import Transcript


def ended(app) -> bool:
    from tui_helpers import ended_turns

    return bool(ended_turns(app.session.events))

pytestmark = pytest.mark.anyio

SIZES = [(80, 24), (120, 32), (200, 50)]
SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]
WORKSPACE = Path("/tmp/cairn-operator-workspace")


# -- 1. the approval: ten lines of preview at 80×24, the choices on one line ---------------------------------------------

OLD_CONFIG = "".join(f"setting_{n:02} = {n}\n" for n in range(40))
NEW_CONFIG = "".join(f"setting_{n:02} = {n * 10 if 5 <= n < 20 else n}\n" for n in range(40))


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_approval_of_a_write_file_with_a_30_line_diff_picture(snap_compare, tmp_path, size):
    from cairn.app.screens.approval import ApprovalModal, Choices

    world = make_world(tmp_path, [{"text": "Updating the settings.", "tool_calls": [
        {"name": "write_file", "arguments": {"path": "settings.py", "content": NEW_CONFIG}}]}])
    (fixed_workspace(world, WORKSPACE) / "settings.py").write_text(OLD_CONFIG)
    app = world.new_app()

    async def ask(pilot) -> None:
        app.chat.query_one(PromptInput).insert("raise the settings")
        await pilot.press("enter")
        modal: ApprovalModal = await approval_ready(pilot, app)
        await wait_for(pilot, lambda: [c.status for c in app.chat.query(ToolCard)] == ["awaiting approval"], "card")
        await repaint(pilot, app)
        preview, choices = modal.query_one("#preview"), modal.query_one("#choices", Choices)
        assert preview.content_region.height >= 10, preview.content_region  # ten lines of the diff, at 80×24 too
        assert choices.region.height == 1 and choices.region.bottom <= size[1]  # one line, on screen
        assert choices.region.y > preview.region.bottom - 1  # at the bottom, below the preview
        text = screen_text(app)
        for words in ("Allow write_file?", "changes to settings.py", "-setting_05 = 5",
                      "-setting_08 = 8", "Allow once", "Deny"):
            assert words in text, words
        line = text.splitlines()[choices.region.y]
        for key in ("a ", "s ", "d ", "n "):
            assert key in line  # every choice on that one line

    assert picture(snap_compare, app, size, ask)


# -- 1. the resume screen: tool, status, verdict and call id at 80 columns; whole verdict words from 120 ---------------


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_resume_screen_with_a_verdict_and_evidence_picture(snap_compare, tmp_path, size):
    from rewind_worlds import evidence_world

    from cairn.app.screens.resume import ResumeScreen
    from cairn.app.screens.verdict import VerdictDialog

    world = evidence_world(tmp_path)
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume")
        await wait_for(pilot, lambda: screen.takes_keys, "the resume screen to take keys")  # `v` is a decision
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the verdict dialog")
        await pilot.press("n", "enter")  # "It did not happen"
        await wait_for(pilot, lambda: screen.calls[0].verdict == "did_not_happen", "the verdict")
        await wait_for(pilot, lambda: app.screen is screen, "back on the resume screen")
        await repaint(pilot, app)
        text = screen_text(app)
        for words in ("write_file", "run_command", "OUTCOME_UNKNOWN", "NOT_STARTED", "happened", "call_1_1_1",
                      "call_1_1_2", "Cairn checked: happened", "Your verdict: did_not_happen", "Continue"):
            assert words in text, words
        if size[0] >= 120:
            assert "did_not_happen" in text.split("Cairn checked")[0]  # the whole word, in the table itself
        assert "▌" not in text.split("Cairn checked")[0]  # no stray cursor glyph in the table

    assert picture(snap_compare, app, size, shown)


async def test_resume_footer_offers_continue_when_every_call_is_not_started(tmp_path):
    from tui_helpers import crashed_turn

    from cairn.app.screens.resume import ResumeScreen

    world = make_world(tmp_path, [])
    events = [e for e in crashed_turn() if type(e).__name__ not in ("ToolCall", "ToolProgress", "ApprovalAsked",
                                                                      "ApprovalDecided")]
    write_log(world.store, "ns", events)
    app = world.resume_app("ns")
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume")
            assert {c.status for c in screen.calls} == {"NOT_STARTED"}
            await pilot.pause()
            footer = screen_text(app).splitlines()[-1]
            assert "Continue" in footer and "Record verdict" not in footer, footer
            await app.action_quit()
    finally:
        app.close_if_still_open()


# -- 1. the sessions list: whole ids at 80 columns, a size column, prompts as wide as the screen allows --------------

LONG_PROMPT = ("refactor the storage layer so that every backend shares one write coordinator, then update the "
               "benchmarks and the README to match")


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_sessions_list_with_long_ids_and_prompts_picture(snap_compare, tmp_path, utc, size):
    from cairn.app.screens.sessions import SessionsScreen

    world = make_world(tmp_path, [])
    ids = ["20251202-101500-a1b2c3-storage-refactor", "20251202-113000-d4e5f6-release-notes"]
    write_log(world.store, ids[0], completed_turn(1, LONG_PROMPT, "Done."), created=1_764_670_500_000)
    write_log(world.store, ids[1], completed_turn(1, "write the release notes for version 2.4, with every change "
                                                      "since 2.3 grouped by area", "Done."), created=1_764_675_000_000)
    app = world.sessions_app()

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        await pilot.pause()
        text = screen_text(app)
        for sid in ids:
            assert sid in text, sid  # whole ids, at 80 too
        assert "refactor the st" in text and "completed" in text and "size" in text and "kB" in text
        if size[0] >= 120:
            assert "refactor the storage layer" in text
        if size[0] >= 200:
            assert LONG_PROMPT[:90] in text  # the prompt uses the width

    assert picture(snap_compare, app, size, shown)


# -- 2. by keyboard: a turn with its output expanded without the mouse -----------------------------------------------


def listing_turn(tmp_path):
    world = make_world(tmp_path, [{"text": "Listing.", "tool_calls": [
        {"name": "run_command", "arguments": {"command": "printf 'alpha\\nbeta\\ngamma\\n'"}}]},
        {"text": "Three files: alpha, beta and gamma."}])
    fixed_workspace(world, WORKSPACE)
    return world


async def run_listing_turn(pilot, app) -> ToolCard:
    """Send the listing prompt, allow its command once, and return its card once the turn has ended."""
    from tui_helpers import ended_turns

    app.chat.query_one(PromptInput).insert("list them")
    await pilot.press("enter")
    await approval_ready(pilot, app)
    await pilot.press("a")
    await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
    return await wait_for(pilot, lambda: app.chat.query(ToolCard) and app.chat.query_one(ToolCard), "card")


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_a_turn_with_output_expanded_by_keyboard_picture(snap_compare, tmp_path, size):
    world = listing_turn(tmp_path)
    app = world.new_app()

    async def expanded(pilot) -> None:
        card = await run_listing_turn(pilot, app)
        await wait_for(pilot, lambda: card.status == "done" and card.has_output, "the result")
        for _ in range(6):  # Shift+Tab from the prompt walks back to the card
            if app.focused is card:
                break
            await pilot.press("shift+tab")
        assert app.focused is card
        assert not card.expanded
        await pilot.press("enter")
        await wait_for(pilot, lambda: card.expanded, "the output expanded")
        await pilot.press("space")
        await wait_for(pilot, lambda: not card.expanded, "collapsed again")
        await pilot.press("space")
        await wait_for(pilot, lambda: card.expanded, "expanded again")
        await pilot.pause()
        text = screen_text(app)
        for words in ("✔ done", "run_command", "alpha", "beta", "gamma", "Three files"):
            assert words in text, words

    assert picture(snap_compare, app, size, expanded)


async def test_a_click_on_the_folded_output_line_opens_it_and_the_card_stays_the_one_tab_stop(tmp_path):
    from textual.widgets._collapsible import CollapsibleTitle

    from cairn.widgets.tool_card import OutputFold

    world = listing_turn(tmp_path)
    app = world.new_app()
    async with app.run_test(size=(100, 30)) as pilot:
        card = await run_listing_turn(pilot, app)
        fold = card.query_one(OutputFold)

        def fold_on_screen() -> bool:
            """The folded line is laid out where the click will land: `has_output` turns true before the next layout,
            and the answer still scrolling in moves the card, so a click computed earlier can miss it."""
            if not card.has_output or not fold.region.area or "Three files" not in screen_text(app):
                return False
            return app.screen.get_widget_at(*fold.region.center)[0] is fold

        await wait_for(pilot, fold_on_screen, "the folded output line on screen")
        assert not card.expanded and not card.query(CollapsibleTitle)  # folded: no Collapsible built yet
        await pilot.click(fold)
        await wait_for(pilot, lambda: card.expanded, "the click to open the output")
        assert not fold.display
        assert [t.can_focus for t in card.query(CollapsibleTitle)] == [False]
        assert "gamma" in screen_text(app)
        await app.action_quit()


async def test_reasoning_and_compaction_lines_open_by_keyboard_and_f1_lists_the_keys(tmp_path):
    from cairn.app.screens.help import KEYS
    from cairn.persistence.events import ContextCompaction
    from cairn.widgets.reasoning import ReasoningBlock

    keys = " ".join(f"{k} {d}" for _, k, d in KEYS)
    assert "Tab / Shift+Tab" in keys and "tool card" in keys and "Enter / Space" in keys and "compaction" in keys
    world = make_world(tmp_path, [{"text": "Answer.", "reasoning": "Thinking it over."}])
    app = world.new_app()
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            app.chat.query_one(PromptInput).insert("think")
            await pilot.press("enter")
            block = await wait_for(pilot, lambda: app.chat.query(ReasoningBlock) and app.chat.query_one(ReasoningBlock),
                                   "the reasoning block")
            await wait_for(pilot, lambda: ended(app), "the turn to end")
            title = block.query_one("CollapsibleTitle")
            title.focus()
            await pilot.press("space")
            await wait_for(pilot, lambda: not block.collapsed, "opened by Space")
            await pilot.press("enter")
            await wait_for(pilot, lambda: block.collapsed, "folded by Enter")
            transcript = app.chat.query_one(Transcript)
            await transcript.apply(ContextCompaction(summary="the earlier turns, in short", through_seq=3, model="m"))
            compaction = transcript.query_one(".compaction")
            for _ in range(8):  # Tab walks from the reasoning block's title to the compaction line
                await pilot.press("tab")
                if app.focused in compaction.query("CollapsibleTitle"):
                    break
            assert app.focused in compaction.query("CollapsibleTitle")
            await pilot.press("space")
            await wait_for(pilot, lambda: not compaction.collapsed, "the compaction line opened by Space")
            await pilot.pause()
            assert "the earlier turns, in short" in screen_text(app)
            await app.action_quit()
    finally:
        app.close_if_still_open()


# -- 3. `sending…` at the first refresh after Enter, before the server has answered -------------------------------------


async def test_status_says_sending_at_the_first_refresh_after_enter(tmp_path):
    from openai_server import OpenAIServer, text
    from tui_helpers import strict_app

    from cairn.widgets.status_bar import StatusBar

    held = dict(text("Hello."), hold_before=True)
    with OpenAIServer([held]) as server:
        async with strict_app(tmp_path, server) as (app, pilot):
            status = app.chat.query_one(StatusBar)
            assert "idle" in str(status.render())
            app.chat.query_one(PromptInput).insert("hello")
            await pilot.press("enter")
            assert "sending…" in str(status.render())  # the first refresh after Enter
            assert not any(type(e).__name__ == "AssistantChunk" for e in app.session.events)  # nothing answered yet
            server.release()
            await wait_for(pilot, lambda: ended(app), "the turn to end")
            await wait_for(pilot, lambda: "idle" in str(status.render()), "idle again")
            assert "sending…" not in str(status.render())
            await pilot.press("ctrl+q")


# -- 5. lock files live exactly as long as their session -----------------------------------------------------------


async def test_a_launch_with_no_prompt_leaves_no_lock_file_and_a_closed_session_removes_its_own(tmp_path):
    world = make_world(tmp_path, [{"text": "Hello."}])
    locks = world.store.lock_dir
    untouched = world.store.create(cwd="/w", session_id="untouched", deferred=True)
    from cairn.app.tui import CairnApp

    app = CairnApp(world.config, untouched, world.store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not (locks / "untouched.lock").exists()  # not created: no session, no lock file
        await pilot.press("ctrl+q")
    assert not (locks / "untouched.lock").exists() and world.store.list_sessions() == []

    used = world.store.create(cwd="/w", session_id="used", deferred=True)
    app = CairnApp(world.config, used, world.store)
    async with app.run_test(size=(80, 24)) as pilot:
        app.chat.query_one(PromptInput).insert("hi")
        await pilot.press("enter")
        await wait_for(pilot, lambda: ended(app), "the turn to end")
        assert (locks / "used.lock").exists()  # created with the session, and held while it is live
        from cairn.persistence.errors import SessionLocked

        with pytest.raises(SessionLocked):
            world.store.open_for_resume("used")
        await pilot.press("ctrl+q")
    assert not (locks / "used.lock").exists()  # closing removed it
    world.store.open_for_resume("used").lock.release()  # and the session opens again
    assert list(locks.iterdir()) == []
