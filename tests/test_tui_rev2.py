"""Pilot tests of the TUI's rev 2 parts: reasoning (live, expandable, from history), token usage in the status bar,
terminal escapes shown as visible symbols, and the MAX_TOKENS turn error.

Real store and composition as in test_tui.py; the model is the `script` provider, or `GatedProvider` where a test must
look at the screen while the reasoning is still streaming.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest
from textual.widgets._collapsible import CollapsibleTitle

from cairn.app.providers.base import ModelRequest, ReasoningDelta, StreamEnd, TextDelta
from cairn.app.tui import CairnApp
from cairn.persistence.events import (
    MAX_TOKENS,
    TRUNCATED,
    AssistantMessage,
    ReasoningChunk,
    StepStart,
    TurnStart,
    Usage,
    UserMessage,
)
from cairn.widgets.reasoning import ReasoningBlock, ReasoningPiece
from cairn.widgets.status_bar import StatusBar, TokenTotals, format_tokens, usage_text
from cairn.widgets.tool_card import ToolCard
from cairn.widgets.transcript import AssistantText, Notice, Transcript, UserPrompt
from tui_helpers import completed_turn, ended_turns, make_world, running, screen_text, submit, wait_for, write_log

pytestmark = pytest.mark.anyio


class GatedProvider:
    """Streams reasoning pieces, each released by the test, then the answer: the screen can be looked at mid-stream."""

    name = "gated"
    model = "gated-1"

    def __init__(self, reasoning: list[str], answer: str) -> None:
        self.reasoning = reasoning
        self.answer = answer
        # gates[i] releases reasoning piece i + 1; the last gate used releases the answer
        self.gates = [asyncio.Event() for _ in range(len(reasoning))]

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        for i, piece in enumerate(self.reasoning):
            if i:
                await self.gates[i - 1].wait()
            yield ReasoningDelta(piece)
        await self.gates[len(self.reasoning) - 1].wait()
        yield TextDelta(self.answer)
        yield StreamEnd([], "stop")

    async def aclose(self) -> None:
        pass


def blocks(app: CairnApp) -> list[ReasoningBlock]:
    return app.chat.query_one(Transcript).reasoning_blocks


def title(block: ReasoningBlock) -> str:
    return str(block.query_one(CollapsibleTitle).render())


def shown_text(block: ReasoningBlock) -> str:
    """The reasoning as the expanded block's widgets hold it (sealed pieces, then the live tail)."""
    return "".join(str(p.render()) for p in block.query(ReasoningPiece))


def order(app: CairnApp, *widgets: Any) -> list[int]:
    children = list(app.chat.query_one(Transcript).children)
    return [children.index(w) for w in widgets]


def status(app: CairnApp) -> str:
    return str(app.chat.query_one(StatusBar).render())


# -- reasoning ----------------------------------------------------------------------------------------------------


async def test_reasoning_streams_as_a_collapsed_thinking_line_expandable_by_key_and_stays_open_when_the_answer_starts(
        tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    provider = GatedProvider(["The user wants ", "a greeting.\nSay hi."], "Hi there!")
    app.provider = provider
    async with running(app) as pilot:
        await submit(pilot, "greet me")
        block = await wait_for(pilot, lambda: blocks(app) and blocks(app)[0], "the reasoning block")
        await wait_for(pilot, lambda: title(block).endswith("thinking… 15 chars"), "the live count")
        assert block.collapsed and block.streaming
        assert shown_text(block) == ""  # collapsed: the text is not laid out at all

        provider.gates[0].set()
        await wait_for(pilot, lambda: title(block).endswith("thinking… 34 chars"), "the count to grow")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: shown_text(block) == "The user wants a greeting.\nSay hi.", "the expanded text")
        assert not block.collapsed

        provider.gates[1].set()
        answer = await wait_for(pilot, lambda: [a for a in app.chat.query(AssistantText) if a.source], "the answer")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the turn to end")
        await pilot.pause()
        assert not block.collapsed and not block.streaming  # opened by the operator (Ctrl+T): it does not fold itself
        assert title(block).endswith("reasoning · 34 chars")
        assert order(app, block, answer[0]) == sorted(order(app, block, answer[0]))  # above the answer

        stored = [e for e in app.session.events if isinstance(e, AssistantMessage)]
        assert stored[0].reasoning == "The user wants a greeting.\nSay hi."
        assert "".join(e.delta for e in app.session.events if isinstance(e, ReasoningChunk)) == stored[0].reasoning
        await pilot.press("ctrl+q")


async def test_history_shows_each_answers_reasoning_collapsed_above_it_and_a_click_expands_it(tmp_path):
    world = make_world(tmp_path, [])
    first, second = completed_turn(1, "plan it", "Step one."), completed_turn(2, "go on", "Step two.")
    first[4].reasoning = "Think [b]first[/b]."
    second[4].reasoning = "Then think again."
    write_log(world.store, "thoughtful", first + second)
    app = world.resume_app("thoughtful")
    async with running(app) as pilot:
        found = await wait_for(pilot, lambda: len(blocks(app)) == 2 and blocks(app), "two reasoning blocks")
        await pilot.pause()
        assert [b.collapsed for b in found] == [True, True]
        assert [title(b) for b in found] == ["▶ reasoning · 19 chars", "▶ reasoning · 17 chars"]
        answers = list(app.chat.query(AssistantText))
        assert order(app, found[0], answers[0], found[1], answers[1]) == sorted(
            order(app, found[0], answers[0], found[1], answers[1]))

        await pilot.click(found[0].query_one(CollapsibleTitle))
        await wait_for(pilot, lambda: not found[0].collapsed, "the click to expand it")
        await wait_for(pilot, lambda: shown_text(found[0]) == "Think [b]first[/b].", "the text, markup shown verbatim")
        assert found[1].collapsed
        await pilot.press("ctrl+q")


async def test_reasoning_whose_answer_never_came_is_shown_as_cut_off_by_a_crash(tmp_path):
    world = make_world(tmp_path, [])
    events = [TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="think hard"),
              ReasoningChunk(turn=1, step=1, delta="Considering "), ReasoningChunk(turn=1, step=1, delta="options")]
    write_log(world.store, "cut", events)
    app = world.resume_app("cut")  # repair closes the turn as interrupted
    async with running(app) as pilot:
        found = await wait_for(pilot, lambda: blocks(app), "the reasoning block")
        assert found[0].text == "Considering options"
        assert title(found[0]) == "▶ reasoning · 19 chars · cut off by a crash"
        await pilot.press("ctrl+q")


# -- usage --------------------------------------------------------------------------------------------------------


def test_token_counts_are_compact():
    assert [format_tokens(n) for n in (0, 999, 1000, 12_345, 99_999, 123_456, 1_234_567)] == [
        "0", "999", "1.0k", "12.3k", "100.0k", "123k", "1.2M"]
    assert usage_text(TokenTotals(), TokenTotals()) == ""
    session = TokenTotals()
    session.add(Usage(input_tokens=None, output_tokens=None, cached_tokens=5))
    assert not session.known  # a usage object without input or output counts says nothing to show


async def test_status_bar_shows_the_turns_and_the_sessions_token_totals_only_once_known(tmp_path):
    world = make_world(tmp_path, [
        {"text": "no usage reported"},
        {"text": "one", "usage": {"input_tokens": 12_300, "output_tokens": 1_200}},
        {"text": "two", "usage": {"input_tokens": 900, "output_tokens": 40}},
    ])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "first")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "turn 1")
        await pilot.pause()
        assert "↑" not in status(app) and "tokens" not in status(app)

        await submit(pilot, "second")
        await wait_for(pilot, lambda: "tokens ↑12.3k ↓1.2k" in status(app), "turn 2's usage")
        assert "idle" in status(app) or "running" in status(app)  # the existing parts stay
        assert "durable through seq" in status(app) or "writing" in status(app)

        await submit(pilot, "third")
        await wait_for(pilot, lambda: "turn ↑900 ↓40 · session ↑13.2k ↓1.2k" in status(app), "turn 3's usage")
        await pilot.press("ctrl+q")

    app = world.resume_app(app.session.id)  # the totals come back from the log
    async with running(app) as pilot:
        await wait_for(pilot, lambda: "turn ↑900 ↓40 · session ↑13.2k ↓1.2k" in status(app), "the totals on resume")
        await pilot.press("ctrl+q")


# -- terminal escapes ---------------------------------------------------------------------------------------------

ESCAPES = "red \x1b[31mRED\x1b[0m title \x1b]0;pwned\x07 clip \x1b]52;c;Zm9v\x07 c1 \x9b2J end"


async def test_escape_sequences_from_the_model_tools_and_prompt_are_rendered_as_visible_symbols(tmp_path):
    world = make_world(tmp_path, [
        {"text": f"Answer: {ESCAPES}", "reasoning": f"Thought: {ESCAPES}",
         "tool_calls": [{"name": "read_file", "arguments": {"path": "evil.txt"}}]},
        {"text": "done"},
    ])
    (world.workspace / "evil.txt").write_text(f"File: {ESCAPES}\n")
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, f"Prompt: {ESCAPES}")
        await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the turn to end")
        # the screen draws the logged events a frame at a time: wait until the card shows the tool's output
        card = await wait_for(pilot, lambda: next((c for c in app.chat.query(ToolCard) if c.has_output), None),
                              "the tool card's output")
        await card.action_toggle_output()
        blocks(app)[0].collapsed = False
        await pilot.pause()
        assert card.expanded and card._output is not None

        visible = "red ␛[31mRED␛[0m title ␛]0;pwned␇ clip ␛]52;c;Zm9v␇ c1 �2J end"
        prompt = str(app.chat.query_one(UserPrompt).render())
        output = str(card._output.render())
        answer = [a.source for a in app.chat.query(AssistantText)][0]
        assert prompt == f"> Prompt: {visible}"
        assert output.startswith(f"File: {visible}")
        assert answer == f"Answer: {visible}"
        assert shown_text(blocks(app)[0]) == f"Thought: {visible}"

        picture = screen_text(app)  # what the terminal would be sent, as drawn
        for control in ("\x1b", "\x07", "\x9b"):
            assert control not in picture
        assert "Answer: red ␛[31mRED␛[0m" in picture
        assert "File: red ␛[31mRED␛[0m" in picture
        await pilot.press("ctrl+q")


async def test_markup_like_text_in_a_checkpoint_error_is_shown_verbatim(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        bar = app.chat.query_one(StatusBar)
        bar.show_durability("failed", 3, "disk [/b] gone \x1b[2J")
        await pilot.pause()
        assert "CHECKPOINT FAILED: disk [/b] gone ␛[2J" in status(app)
        assert "CHECKPOINT FAILED: disk [/b] gone ␛[2J" in screen_text(app)
        await pilot.press("ctrl+q")


# -- MAX_TOKENS -----------------------------------------------------------------------------------------------------


async def test_an_answer_cut_at_the_token_limit_shows_an_error_line_naming_the_limit_and_unrun_calls(tmp_path):
    world = make_world(tmp_path, [
        {"text": "Writing the file", "finish_reason": "length",
         "tool_calls": [{"name": "write_file", "arguments": {"path": "x.txt", "content": "cut"}}]},
    ])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "write x")
        ended = await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn to end")
        await pilot.pause()
        assert ended[0].error is not None and ended[0].error.code == MAX_TOKENS
        errors = [str(n.render()) for n in app.chat.query(Notice) if n.has_class("-error")]
        assert len(errors) == 1
        assert errors[0].startswith(f"turn 1 error ({MAX_TOKENS}): ") and "output limit" in errors[0]
        card = app.chat.query_one(ToolCard)
        assert card.status == "truncated" and "TRUNCATED, not run" in str(card._title.render())
        assert not (world.workspace / "x.txt").exists()
        assert [e.error_code for e in app.session.events if getattr(e, "error_code", None)] == [TRUNCATED]
        await pilot.press("ctrl+q")
