"""A TUI that keeps up with any answer and any session (issue 12): answers cut into sealed pieces at Markdown boundaries,
history mounted from the tail, follow mode with a "↓ new output" line, tool-card titles that keep status and safety
visible at 80 columns, and screens that keep what matters on screen at 80×24, 120×32 and 200×50 (the resume screen's
statuses and button down to 60×15, the sessions list's ids at 80 columns), as snapshots.

Timing is never asserted here (P6/P8/P9 in bench/ measure it); these tests check what is cut where, what is mounted,
and where the view is.
"""

from __future__ import annotations

import pytest
from tui_helpers import (
    completed_turn,
    crashed_turn,
    ended_turns,
    make_world,
    picture,
    screen_text,
    top_screen,
    wait_for,
    write_log,
)

from cairn.persistence.events import AssistantChunk
from cairn.widgets.answer_pieces import LIVE_LIMIT, Sealer, pieces_of
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.tool_card import ToolCard
from cairn.widgets.transcript import AssistantText, Transcript, UserPrompt

pytestmark = pytest.mark.anyio

LIST = "Items:\n\n" + "".join(f"- item {i} with a few words\n" for i in range(300))
TABLE = "| # | name |\n|---|---|\n" + "".join(f"| {i} | name {i} |\n" for i in range(300))
CODE = "```python\n" + "".join(f"x_{i} = {i}\n" for i in range(600)) + "```\n\nDone.\n"


def fed_in_chunks(text: str, size: int = 7) -> list:
    sealer = Sealer()
    pieces = []
    for i in range(0, len(text), size):
        pieces += sealer.feed(text[i:i + size])
    return pieces + sealer.finish()


# -- sealing --------------------------------------------------------------------------------------------------------


def test_a_tight_list_is_sealed_between_items_and_no_piece_grows_past_the_live_limit():
    pieces = fed_in_chunks(LIST)
    assert len(pieces) > 5
    assert all(len(p.text) <= LIVE_LIMIT + 100 for p in pieces)
    for piece in pieces[1:]:
        assert piece.text.startswith("- item "), piece.text[:30]  # cut only where an item starts
    assert "".join(p.text for p in pieces).count("- item ") == 300


def test_a_table_cut_between_rows_keeps_its_header_columns_and_shows_the_header_once():
    pieces = fed_in_chunks(TABLE)
    assert len(pieces) > 2
    assert pieces[0].last_table is not None and pieces[0].last_table.show_header
    widths = pieces[0].last_table.widths
    for piece in pieces[1:]:
        assert piece.text.startswith("| # | name |\n|---|---|\n")  # a valid table on its own
        assert piece.first_table is not None and not piece.first_table.show_header
        assert piece.first_table.widths == widths
    rows = [line for p in pieces for line in p.text.splitlines()[2:] if line.startswith("| ") and "name " in line]
    assert [int(r.split("|")[1]) for r in rows] == list(range(300))


def test_a_code_block_cut_between_lines_is_closed_and_reopened_with_its_language():
    pieces = fed_in_chunks(CODE)
    code_pieces = [p for p in pieces if "x_" in p.text]
    assert len(code_pieces) > 2
    for piece in code_pieces[1:]:
        assert piece.text.startswith("```python\n")
    for piece in code_pieces[:-1]:
        assert piece.text.endswith("```\n")
    assert pieces[-1].text.strip().endswith("Done.")


def test_feeding_chunk_by_chunk_cuts_where_feeding_the_whole_text_does():
    for text in (LIST, TABLE, CODE, "word " * 50 + "\n\n" + "para two\n" * 400):
        assert [p.text for p in fed_in_chunks(text, 13)] == [p.text for p in pieces_of(text)]


def test_an_ordered_list_continued_in_a_new_piece_keeps_its_numbers():
    text = "".join(f"{i}. step {i}\n" for i in range(1, 200))
    pieces = pieces_of(text)
    assert len(pieces) > 1
    from rich.console import Console

    from cairn.widgets.answer_markdown import AnswerMarkdown

    console = Console(width=60, record=True)
    console.print(AnswerMarkdown(pieces[1]))
    first_number = pieces[1].text.split(".")[0]
    assert console.export_text().lstrip().startswith(f"{first_number} step {first_number}")


# -- history from the tail ------------------------------------------------------------------------------------------


def session_of_turns(tmp_path, turns: int):
    """An app resuming a session of `turns` short completed turns, and the session's events."""
    world = make_world(tmp_path, [])
    events = []
    for turn in range(1, turns + 1):
        events += completed_turn(turn, f"prompt {turn}", f"Answer {turn}.\n\n" + "line\n" * 5)
    write_log(world.store, "long", events)
    return world.resume_app("long"), events


async def opened_transcript(pilot, app) -> Transcript:
    transcript = await wait_for(pilot, lambda: app.chat and app.chat.query_one(Transcript), "the transcript")
    await wait_for(pilot, lambda: list(transcript.query(UserPrompt)), "the history")
    return transcript


async def test_a_long_session_opens_at_its_tail_and_home_mounts_the_rest(tmp_path):
    app, events = session_of_turns(tmp_path, 80)
    async with app.run_test(size=(100, 30)) as pilot:
        transcript = await opened_transcript(pilot, app)
        prompts = [str(p.render()) for p in transcript.query(UserPrompt)]
        assert prompts[-1] == "> prompt 80"
        assert len(prompts) < 40  # only the tail is mounted
        assert len(transcript.older_turns) >= 80 - len(prompts) - len(transcript.older) // 2  # older turns: events
        assert all(len(turn) == len(events) // 80 for turn in transcript.older_turns)
        await pilot.pause()
        assert transcript.scroll_y == transcript.max_scroll_y  # at the end

        app.chat.query_one(PromptInput).focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: not transcript.older_remaining, "the whole history")
        await wait_for(pilot, lambda: transcript.scroll_y == 0, "the top")
        prompts = [str(p.render()) for p in transcript.query(UserPrompt)]
        assert prompts == [f"> prompt {t}" for t in range(1, 81)]
        await pilot.press("ctrl+q")


async def test_one_huge_answer_opens_with_only_its_last_pieces_shown(tmp_path):
    world = make_world(tmp_path, [])
    text = "".join(f"- item {i} with a few words\n" for i in range(2000))
    write_log(world.store, "list", completed_turn(1, "list them", text))
    app = world.resume_app("list")
    async with app.run_test(size=(100, 30)) as pilot:
        answer = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        answer = answer[0]
        assert answer.source == text
        shown = answer.shown_pieces
        assert 0 < len(shown) < len(answer.pieces) // 4
        assert shown[-1].text.endswith("- item 1999 with a few words\n")
        transcript = app.chat.query_one(Transcript)
        transcript.scroll_to(y=0, animate=False)  # the view nears the top: older pieces are shown above
        await wait_for(pilot, lambda: len(answer.shown_pieces) > len(shown), "older pieces")

        def drawn() -> list[str]:
            return [answer.render_line(y).text.strip() for y in range(answer.size.height)]

        await wait_for(pilot, lambda: drawn()[-1:] == ["• item 1999 with a few words"], "laid out again")
        lines = drawn()
        first = int(lines[0].split()[2])
        assert lines == [f"• item {i} with a few words" for i in range(first, 2000)]  # contiguous, no seam, no twice
        await pilot.press("ctrl+q")


async def test_a_list_cut_into_pieces_is_drawn_without_a_seam(tmp_path):
    """Rich starts every list with a blank line; a piece that starts between two items must not show it."""
    world = make_world(tmp_path, [])
    text = "Items:\n\n" + "".join(f"- item {i} with a few words\n" for i in range(120))
    write_log(world.store, "list", completed_turn(1, "list them", text))
    app = world.resume_app("list")
    async with app.run_test(size=(80, 100)) as pilot:
        answer = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        answer = answer[0]
        await wait_for(pilot, lambda: answer.size.height > 100, "the answer laid out")
        assert answer.hidden == 0 and len(answer.pieces) > 2  # every piece shown, and there are several
        lines = [answer.render_line(y).text.strip() for y in range(answer.size.height)]
        items = lines[lines.index("Items:") + 2:]
        assert items == [f"• item {i} with a few words" for i in range(120)]  # no blank line between any two
        await pilot.press("ctrl+q")


async def test_scrolling_up_builds_older_turns_in_order_above_what_is_shown(tmp_path):
    app, events = session_of_turns(tmp_path, 40)
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await opened_transcript(pilot, app)
        waiting = len(transcript.older_turns)
        assert waiting > 0
        transcript.scroll_to(y=0, animate=False)  # near the top: the next older turns are built and mounted
        await wait_for(pilot, lambda: len(transcript.older_turns) < waiting, "older turns built")
        prompts = [str(p.render()) for p in transcript.query(UserPrompt)]
        first = int(prompts[0].split()[-1])
        assert prompts == [f"> prompt {t}" for t in range(first, 41)]  # contiguous, in order, nothing twice
        assert transcript.scroll_y > 0  # the view kept its place instead of jumping to the new top
        await pilot.press("ctrl+q")


async def test_a_theme_change_redraws_a_finished_answer_in_the_new_colours(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "one", completed_turn(1, "hello", "Plain words of an answer."))
    app = world.resume_app("one")
    async with app.run_test(size=(80, 24)) as pilot:
        answer = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        answer = answer[0]
        await pilot.pause()

        def text_colour():
            strip = answer.render_line(0)
            return next(seg.style.color for seg in strip if seg.text.strip())

        before = text_colour()
        app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
        await wait_for(pilot, lambda: text_colour() != before, "the answer drawn in the new theme's colours")
        await pilot.press("ctrl+q")


# -- follow mode ----------------------------------------------------------------------------------------------------


async def test_follow_mode_follows_at_the_bottom_stays_when_scrolled_up_and_end_follows_again(tmp_path):
    long_answer = "".join(f"- line {i}\n" for i in range(400))
    world = make_world(tmp_path, [{"text": long_answer, "chunks": 200, "delay_ms": 15}])
    app = world.new_app()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = app.chat.query_one(Transcript)
        prompt = app.chat.query_one(PromptInput)
        prompt.insert("stream")
        await pilot.press("enter")
        await wait_for(pilot, lambda: transcript.max_scroll_y > 40, "output longer than two screens")
        assert transcript.following
        await pilot.pause()
        assert transcript.scroll_y >= transcript.max_scroll_y - 1  # at the bottom: follows

        await pilot.press("pageup")
        await wait_for(pilot, lambda: not transcript.following, "follow mode to stop")
        where = transcript.scroll_y
        chunks = sum(isinstance(e, AssistantChunk) for e in app.session.events)
        await wait_for(pilot, lambda: sum(isinstance(e, AssistantChunk) for e in app.session.events) > chunks + 20,
                       "more output")
        await wait_for(pilot, lambda: transcript.new_output.has_class("-visible"), "the ↓ new output line")
        await pilot.pause()
        badge = transcript.new_output.region
        assert badge.height == 1 and badge.y >= transcript.region.bottom  # a row of its own, never over the text
        assert transcript.scroll_y == where  # never yanked back down
        assert transcript.max_scroll_y > where + 5

        prompt.focus()
        await pilot.press("end")
        await wait_for(pilot, lambda: transcript.following, "follow mode again")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        await pilot.pause()
        await pilot.pause()
        assert transcript.scroll_y >= transcript.max_scroll_y - 1
        assert not transcript.new_output.has_class("-visible")
        await pilot.press("ctrl+q")


# -- tool cards -----------------------------------------------------------------------------------------------------


async def test_at_80_columns_card_titles_show_status_and_safety_and_the_two_recovery_outcomes_differ(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed", crashed_turn())
    app = world.resume_app("crashed")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat and len(app.chat.query(ToolCard)) == 2, "two cards")
        await pilot.pause()
        cards = {c.tool_name: c for c in app.chat.query(ToolCard)}
        deploy, changelog = cards["run_command"], cards["edit_file"]
        await wait_for(pilot, lambda: deploy.status == "outcome unknown", "the repaired statuses")
        titles = {name: str(card._title.render()) for name, card in cards.items()}
        assert titles["run_command"].startswith("⚠ OUTCOME_UNKNOWN  [side_effecting]  run_command(")
        assert changelog.status == "not started"
        assert titles["edit_file"].startswith("⊘ NOT_STARTED")
        assert deploy.styles.border_top != changelog.styles.border_top
        await pilot.press("ctrl+q")


# -- layouts at 80×24, 120×32 and 200×50 (baselines in snapshots/test_tui_fit/) -------------------------------------
#
# Plain `def`s: `snap_compare` runs the app on its own loop. Each picture is checked for what must be on it at that
# size as well (the words, not the pixels), so a baseline accepted by mistake cannot hide a clipped status.

SIZES = [(80, 24), (120, 32), (200, 50)]
size_ids = [f"{w}x{h}" for w, h in SIZES]


def in_workspace(world, path: str = "/tmp/cairn-fit-workspace"):
    """Previews and cards show where a command runs: a fixed directory, so no picture carries pytest's tmp path."""
    import shutil
    from pathlib import Path

    shutil.rmtree(path, ignore_errors=True)
    Path(path).mkdir(parents=True)
    world.config.workspace = Path(path)
    world.workspace = Path(path)


@pytest.mark.parametrize("size", SIZES, ids=size_ids)
def test_fit_chat_with_a_running_card(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [{"text": "Deploying now.", "tool_calls": [
        {"name": "run_command", "arguments": {"command": "sleep 20 && make deploy ENV=production TARGET=www-eu-1"}}]}])
    in_workspace(world)
    app = world.new_app()

    async def running(pilot) -> None:
        from tui_helpers import approval_ready

        app.chat.query_one(PromptInput).insert("deploy the site")
        await pilot.press("enter")
        await approval_ready(pilot, app)
        await pilot.press("a")
        card = await wait_for(pilot, lambda: app.chat.query(ToolCard) and app.chat.query_one(ToolCard), "the card")
        await wait_for(pilot, lambda: card.status == "running" and app.screen is app.chat, "the running card")
        await pilot.pause()
        title = str(card._title.render())
        assert title.startswith("⟳ running  [side_effecting]  run_command(")
        shown = screen_text(app)
        assert "⟳ running" in shown and "[side_effecting]" in shown

    assert picture(snap_compare, app, size, running)


@pytest.mark.parametrize("size", SIZES, ids=size_ids)
def test_fit_chat_with_recovered_cards(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    in_workspace(world)
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")

    async def recovered(pilot) -> None:
        from cairn.app.screens.resume import ResumeScreen

        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        await pilot.press("c")
        await wait_for(pilot, lambda: app.screen is app.chat and len(app.chat.query(ToolCard)) == 2, "the chat")
        cards = list(app.chat.query(ToolCard))
        await wait_for(pilot, lambda: [c.status for c in cards] == ["outcome unknown", "not started"], "statuses")
        await pilot.pause()
        shown = screen_text(app)
        assert "OUTCOME_UNKNOWN" in shown and "NOT_STARTED" in shown

    assert picture(snap_compare, app, size, recovered)


@pytest.mark.parametrize("size", SIZES + [(60, 15)], ids=size_ids + ["60x15"])
def test_fit_resume_screen(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    in_workspace(world)
    events = crashed_turn()
    events[2].text = "deploy the site to every region, then note the version in the changelog and tell me when done"
    events[4].text = "Deploying first, then I will edit the changelog.\n\n" + "Checking the targets first. " * 30
    write_log(world.store, "20251202-113000-d4e5f6", events)
    app = world.resume_app("20251202-113000-d4e5f6")

    async def shown(pilot) -> None:
        from textual.widgets import Button

        from cairn.app.screens.resume import ResumeScreen

        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        await pilot.pause()
        text = screen_text(app)
        assert "OUTCOME_UNKNOWN" in text and "NOT_STARTED" in text  # the point of the screen, at every size
        assert "The model will be told" in text
        button = app.screen.query_one("#continue", Button)
        assert button.region.height >= 1 and app.screen.region.contains_region(button.region)
        assert "Continue to the chat" in text

    assert picture(snap_compare, app, size, shown)


@pytest.mark.parametrize("size", SIZES, ids=size_ids)
def test_fit_sessions_list(snap_compare, tmp_path, utc, size):
    from cairn.app.screens.sessions import SessionsScreen

    world = make_world(tmp_path, [])
    write_log(world.store, "20251202-101500-a1b2c3", completed_turn(1, "list the files in the workspace and explain them",
                                                                    "Here they are."), created=1_764_670_500_000)
    write_log(world.store, "20251202-113000-d4e5f6", crashed_turn(), created=1_764_675_000_000)
    app = world.sessions_app()

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        await pilot.pause()
        text = screen_text(app)
        assert "20251202-101500-a1b2c3" in text and "20251202-113000-d4e5f6" in text  # whole ids, at 80 too
        assert "interrupted" in text and "completed" in text

    assert picture(snap_compare, app, size, shown)


# -- garbage collection at quiet moments ----------------------------------------------------------------------------


async def test_full_collections_are_held_while_the_app_runs_and_python_defaults_come_back_after(tmp_path):
    import gc

    from cairn.app import quiet_gc

    before = gc.get_threshold()
    world = make_world(tmp_path, [{"text": "short answer"}])
    app = world.new_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: gc.get_threshold()[2] == quiet_gc.HELD_BACK, "full collections held back")
        assert gc.get_freeze_count() > 0  # what start-up made is out of the collector's sight
        assert gc.get_threshold()[:2] == before[:2]  # young generations still collected as usual
        collections = gc.get_stats()[2]["collections"]
        app.chat.query_one(PromptInput).insert("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: gc.get_stats()[2]["collections"] > collections, "a full collection at turn end")
        await pilot.press("ctrl+q")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_the_tui_start_up_collects_nothing_until_the_first_frame_then_collection_is_back_on(tmp_path):
    """The CLI pauses the collector before Textual is imported (P8: start-up makes no garbage worth a collection);
    the first frame freezes what start-up built and turns collection back on."""
    import gc

    from cairn.app import quiet_gc

    world = make_world(tmp_path, [{"text": "short answer"}])
    quiet_gc.pause_until_first_frame()
    try:
        assert not gc.isenabled()
        app = world.new_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, gc.isenabled, "collection back on after the first frame")
            assert gc.get_freeze_count() > 0  # frozen before collection resumed: start-up's objects are never scanned
            await pilot.press("ctrl+q")
    finally:
        quiet_gc.resume_collections()
    assert gc.isenabled()


def test_a_tui_start_that_fails_before_its_first_frame_turns_collection_back_on(tmp_path, capsys):
    import gc

    from cairn.app.cli import main
    from cairn.app.exit_codes import EXIT_USAGE

    assert gc.isenabled()
    code = main(["--home", str(tmp_path / "home"), "resume", "no-such-session"])  # fails inside the paused start-up
    assert code == EXIT_USAGE and "no session 'no-such-session'" in capsys.readouterr().err
    assert gc.isenabled()


async def test_drawing_while_no_event_arrived_does_not_slow_the_next_frames(tmp_path):
    """Frame pacing counts Textual's drawing since the last drain; after a quiet spell (typing, a blinking cursor) that
    drawing is not a frame's cost, so the first events after it are shown at the normal frame rate."""
    from cairn.app.screens.chat import MAX_FRAME

    world = make_world(tmp_path, [{"text": "a short answer"}])
    app = world.new_app()
    async with app.run_test(size=(80, 24)) as pilot:
        chat = app.chat
        chat._drawn = 10.0  # as if the screen had drawn for ten seconds since the last batch of events
        chat._due -= 60.0  # and the last batch was a minute ago
        frames: list[float] = []
        pace = chat._pace_frames
        chat._pace_frames = lambda lateness, cost: (pace(lateness, cost), frames.append(chat._frame))
        chat.query_one(PromptInput).insert("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: frames and not chat.turn_running, "the turn")
        # paced by the first batch's own cost (UI_SHARE × it), not by the quiet spell's drawing (which gives MAX_FRAME)
        assert frames[0] < MAX_FRAME
        await pilot.press("ctrl+q")
