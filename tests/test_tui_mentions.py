"""`@path` mentions in the TUI (issue 42): Tab completion from the workspace files in the popup the slash commands use,
directories completing step by step, the attachments named under the prompt in the transcript, and the popup's
picture at 80×24."""

from __future__ import annotations

import subprocess

import pytest
from textual.widgets import OptionList

from cairn.app.screens.mention_completion import as_mention, matches, mention_at
from cairn.persistence.events import UserMessage
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.transcript import UserPrompt
from tui_helpers import SNAPSHOT_WORKSPACE, ended_turns, fixed_workspace, make_world, picture, running, submit
from tui_helpers import wait_for

FILES = ["notes.md", "numbers.txt", "src/app.py", "src/util/strings.py", "docs/guide.md", "README.md"]


def populate(root) -> None:
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"contents of {rel}\n")


def popup_items(app) -> list[str]:
    popup = app.chat.query_one("#slash", OptionList)
    if not popup.display:
        return []
    return [str(popup.get_option_at_index(i).prompt) for i in range(popup.option_count)]


def prompt_of(app) -> PromptInput:
    return app.chat.query_one(PromptInput)


# -- the pieces ---------------------------------------------------------------------------------------------------------


def test_the_word_at_the_cursor():
    assert mention_at("read @no", 8) == (5, "no", False)
    assert mention_at('read @"my no', 12) == (5, "my no", True)
    assert mention_at("@", 1) == (0, "", False)
    assert mention_at("mail a@b", 8) is None  # inside a word: an e-mail address, not a mention
    assert mention_at("read @notes.md more", 8) is None  # the cursor inside the word: Tab would cut it in two
    assert mention_at("read @notes.md done", 14) == (5, "notes.md", False)


def test_matches_list_the_directory_then_any_path_containing_the_text():
    assert matches(FILES, "no") == ["notes.md"]
    assert matches(FILES, "") == ["docs/", "src/", "notes.md", "numbers.txt", "README.md"]
    assert matches(FILES, "src/") == ["src/util/", "src/app.py"]
    assert matches(FILES, "str") == ["src/util/strings.py"]  # no name starts with it: found inside a path
    assert matches(FILES, "n") == ["notes.md", "numbers.txt", "src/util/strings.py"]
    assert len(matches([f"f{i}.txt" for i in range(50)], "f")) == 7  # what the popup shows without scrolling
    assert as_mention("notes.md", False) == "@notes.md " and as_mention("src/", False) == "@src/"
    assert as_mention("my notes.md", False) == '@"my notes.md" ' and as_mention("my dir/", True) == '@"my dir/'


# -- in the app ---------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tab_completes_a_mention_from_the_workspace(tmp_path):
    world = make_world(tmp_path, [])
    populate(world.workspace)
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press(*"read @no")
        await wait_for(pilot, lambda: popup_items(app) == ["notes.md"], "notes.md offered")
        await pilot.press("tab")
        assert prompt_of(app).text == "read @notes.md "
        await wait_for(pilot, lambda: popup_items(app) == [], "the popup closed after the completed word")
        await pilot.press(*"and @s")
        await wait_for(pilot, lambda: popup_items(app)[:1] == ["src/"], "src/ offered")
        await pilot.press("tab")
        assert prompt_of(app).text == "read @notes.md and @src/"
        await wait_for(pilot, lambda: popup_items(app) == ["src/util/", "src/app.py"], "the directory's entries")
        await pilot.press("tab", "tab")
        assert prompt_of(app).text == "read @notes.md and @src/util/strings.py "
        await pilot.press(*"/x")  # not at a word's start: plain text, no popup
        assert popup_items(app) == [] and prompt_of(app).mention is None


@pytest.mark.anyio
async def test_completion_respects_gitignore(tmp_path):
    world = make_world(tmp_path, [])
    populate(world.workspace)
    subprocess.run(["git", "init", "--quiet"], cwd=world.workspace, check=True)
    (world.workspace / ".gitignore").write_text("numbers.txt\n")
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press(*"@n")
        await wait_for(pilot, lambda: popup_items(app)[:1] == ["notes.md"], "the files offered")
        assert "numbers.txt" not in popup_items(app)


@pytest.mark.anyio
async def test_slash_completion_still_works_beside_mentions(tmp_path):
    world = make_world(tmp_path, [])
    populate(world.workspace)
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press(*"@no")
        await wait_for(pilot, lambda: popup_items(app) == ["notes.md"], "notes.md offered")
        await pilot.press("backspace", "backspace", "backspace")  # the mention is gone: Tab must not bring it back
        await pilot.press("/", "p", "e")
        assert [app.chat.query_one("#slash", OptionList).get_option_at_index(0).id] == ["permissions"]
        await pilot.press("tab")
        assert prompt_of(app).text == "/permissions "


@pytest.mark.anyio
async def test_the_prompt_card_names_its_attachments(tmp_path):
    world = make_world(tmp_path, [{"text": "read it"}])
    populate(world.workspace)
    (world.workspace / "big.txt").write_text("x" * 150_000)
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "summarise @notes.md and @big.txt")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn")
        (message,) = [e for e in app.session.events if isinstance(e, UserMessage)]
        assert [a.path for a in message.attachments] == ["notes.md", "big.txt"]
        shown = [str(card.render()) for card in app.chat.query(UserPrompt)]
        assert shown == ["> summarise @notes.md and @big.txt\n  attached: notes.md (21 B), big.txt (146.5 KB, cut)"]


def test_popup_of_file_completions_at_80x24(snap_compare, tmp_path):
    world = make_world(tmp_path, [])
    fixed_workspace(world)
    populate(SNAPSHOT_WORKSPACE)
    app = world.new_app()

    async def typed(pilot) -> None:
        await pilot.press(*"explain @")
        await wait_for(pilot, lambda: len(popup_items(app)) == 5, "the workspace's top entries")
        await pilot.pause()

    assert picture(snap_compare, app, (80, 24), typed)
