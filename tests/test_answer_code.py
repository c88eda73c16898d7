"""Sealed pieces of plain code are measured without being highlighted and drawn only when asked for (P6): the measure
must be what Rich draws, and the widget must show the same lines as when every piece is drawn at once."""

from __future__ import annotations

import random

import pytest
from rich.console import Console
from tui_helpers import completed_turn, make_world, wait_for, write_log

from cairn.widgets import answer_text
from cairn.widgets.answer_markdown import AnswerMarkdown
from cairn.widgets.answer_pieces import Piece, Sealer, code_lines
from cairn.widgets.transcript import AssistantText

pytestmark = pytest.mark.anyio


def code_answer(rng: random.Random, lines: int) -> str:
    body = []
    for i in range(lines):
        kind = rng.random()
        if kind < 0.1:
            body.append("")
        elif kind < 0.15:
            body.append("    " * rng.randint(0, 2))  # whitespace only
        elif kind < 0.2:
            body.append("\tif x:\t# tab")
        else:
            body.append("    " * rng.randint(0, 3) + f"value_{i} = compute({rng.randint(0, 999)}, 'é日本')  # step {i}")
    return "Code:\n\n```python\n" + "\n".join(body) + "\n```\n\nDone.\n"


def drawn_lines(console: Console, piece: Piece, width: int) -> list[str]:
    options = console.options.update(width=width, height=None, highlight=False)
    lines = ["".join(s.text for s in line) for line in console.render_lines(AnswerMarkdown(piece), options, pad=False)]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def test_a_code_piece_is_measured_as_rich_draws_it() -> None:
    console = Console(width=120, color_system="truecolor", force_terminal=True)
    rng = random.Random(6)
    measured = 0
    for _ in range(40):
        sealer = Sealer()
        pieces = sealer.feed(code_answer(rng, rng.randint(5, 300))) + sealer.finish()
        for piece in pieces:
            code = code_lines(piece.text)
            if code is None:
                continue
            for width in (60, 80, 120):
                if any(len(line.expandtabs(4)) + 2 > width for line in code):
                    continue  # a line that would wrap: such a piece is drawn at once
                assert len(drawn_lines(console, piece, width)) == len(code), (piece.text, width)
                measured += 1
    assert measured > 100


@pytest.mark.parametrize("text", ["Some prose\n", "Code:\n\n```python\nx = 1\n```\n", "```python\nx\n```\n\nDone.\n",
                                  "```\nx\n", "```\n```\n", "```\na\n```\n```\nb\n```\n", "```\nbell\x07\n```\n"])
def test_only_a_piece_that_is_one_whole_code_block_is_measured(text: str) -> None:
    assert not code_lines(text)


async def test_a_long_code_answer_shows_the_same_lines_measured_as_drawn_at_once(tmp_path, monkeypatch) -> None:
    rng = random.Random(7)
    text = code_answer(rng, 600)

    async def every_line(measure: bool) -> tuple[list[str], int]:
        if not measure:
            monkeypatch.setattr(answer_text, "code_lines", lambda text: None)
        (tmp_path / str(measure)).mkdir()
        world = make_world(tmp_path / str(measure), [])
        write_log(world.store, "code", completed_turn(1, "code please", text))
        app = world.resume_app("code")
        async with app.run_test(size=(100, 40)) as pilot:
            answer = (await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "answer"))[0]
            await wait_for(pilot, lambda: answer.size.height > 40, "the answer laid out")
            while await answer.reveal_older(500):
                await pilot.pause()
            await wait_for(pilot, lambda: answer.size.height > 600, "every piece shown")
            lazy = sum(1 for d in answer._drawn if d.lines is None)
            lines = [answer.render_line(y).text for y in range(answer.size.height)]
            await pilot.press("ctrl+q")
        return lines, lazy

    measured, lazy = await every_line(True)
    drawn, none_lazy = await every_line(False)
    assert lazy > 0 and none_lazy == 0  # the first way did measure pieces without drawing them
    assert measured == drawn
