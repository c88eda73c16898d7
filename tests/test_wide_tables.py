"""Wide Markdown tables are readable (SPEC §11 rev 4): a table whose columns cannot all be as wide as their longest
word is drawn one record per row (each cell beside its heading), a table that fits wraps its cells, and no cell is ever
cut to `val…` — every cell's full text is on the drawn lines, at 80 and 120 columns, streamed or read from history,
in one piece or cut into many (answers are drawn piece by piece, see widgets/answer_text.py)."""

from __future__ import annotations

import pytest
from rich.console import Console
from textual.app import App, ComposeResult
from tui_helpers import completed_turn, make_world, screen_text, wait_for, write_log

from cairn.widgets.answer_markdown import RECORDS_NOTE, AnswerMarkdown
from cairn.widgets.answer_pieces import pieces_of
from cairn.widgets.answer_text import AssistantText

pytestmark = pytest.mark.anyio

SIZES = [(80, 24), (120, 40)]


def table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


COLUMNS = [f"metric_{c:02d}" for c in range(1, 13)]


def wide_rows(count: int) -> list[list[str]]:
    return [[f"value_{r}_{c}" for c in range(1, 13)] for r in range(1, count + 1)]


def answer(rows: int) -> str:
    return "Here are the numbers:\n\n" + table(COLUMNS, wide_rows(rows)) + "\nThat is all.\n"


class OneAnswer(App[None]):
    def compose(self) -> ComposeResult:
        yield AssistantText()


async def drawn(text: str, size: tuple[int, int], chunk: int = 37) -> list[str]:
    """Every line of the answer, streamed in chunks as a model sends it, then finished."""
    app = OneAnswer()
    async with app.run_test(size=size) as pilot:
        widget = app.query_one(AssistantText)
        for at in range(0, len(text), chunk):
            await widget.write(text[at:at + chunk])
            if at % (chunk * 20) == 0:
                await pilot.pause()  # drawn while streaming too (the live piece)
        await widget.finish()
        await pilot.pause()
        await wait_for(pilot, lambda: widget.size.height > 0, "the answer laid out")
        return [widget.render_line(y).text.rstrip() for y in range(widget.size.height)]


def every_cell_whole(lines: list[str], columns: list[str], rows: list[list[str]]) -> None:
    words = {word for line in lines for word in line.split()}
    missing = [cell for cell in [*columns, *(c for row in rows for c in row)] if cell not in words]
    assert not missing, missing[:10]
    assert not any("…" in line for line in lines)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_12_column_table_shows_every_cell_whole_one_record_per_row(size):
    rows = wide_rows(4)
    lines = await drawn(answer(4), size)
    every_cell_whole(lines, COLUMNS, rows)
    assert sum(line == RECORDS_NOTE for line in lines) == 1
    # a record: each cell on its own line beside its heading, in the columns' order
    first = next(i for i, line in enumerate(lines) if line.startswith("metric_01"))
    assert [line.split() for line in lines[first:first + 12]] == [[c, f"value_1_{k}"] for k, c in
                                                                   enumerate(COLUMNS, 1)]
    assert sum(1 for line in lines if set(line) == {"─"}) == len(rows) - 1  # a rule between two rows
    assert lines[-1] == "That is all."


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_long_wide_table_cut_into_pieces_is_records_in_every_piece(size):
    rows = wide_rows(60)
    text = answer(60)
    assert len(pieces_of(text)) > 5  # the table spans many pieces
    lines = await drawn(text, size)
    every_cell_whole(lines, COLUMNS, rows)
    assert sum(line == RECORDS_NOTE for line in lines) == 1  # the note once, in the table's first piece
    assert sum(1 for line in lines if set(line) == {"─"}) == len(rows) - 1  # pieces join without a seam
    assert [line.split()[1] for line in lines if line.startswith("metric_01")] == [f"value_{r}_1" for r in
                                                                                 range(1, 61)]


async def test_a_wide_table_fits_as_a_table_on_a_wide_screen():
    lines = await drawn(answer(4), (200, 50))
    every_cell_whole(lines, COLUMNS, wide_rows(4))
    assert RECORDS_NOTE not in lines
    assert any(line.split() == COLUMNS for line in lines)  # the header is one line
    assert any(line.split() == [f"value_2_{c}" for c in range(1, 13)] for line in lines)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_narrow_table_stays_a_table(size):
    columns, rows = ["name", "region", "state"], [["api", "eu-west-1", "up"], ["db", "us-east-2", "degraded"]]
    lines = await drawn(table(columns, rows), size)
    assert RECORDS_NOTE not in lines
    assert lines[0].split() == columns and lines[2].split() == rows[0]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_table_that_fits_word_by_word_wraps_its_cells_and_cuts_nothing(size):
    columns = ["service", "what happened", "since", "who is on it", "next step"]
    sentence = "the gateway answers 502 to about one request in forty since the deploy"
    rows = [["api-gateway", sentence, "Tuesday 14:02 UTC", "platform team (Ana, Joe)", "roll back the deploy and watch"]]
    lines = await drawn(table(columns, rows), size)
    assert RECORDS_NOTE not in lines  # every column can be as wide as its longest word: a table, cells wrapped
    words = [word for line in lines for word in line.split()]
    for cell in [*columns, *rows[0]]:
        for word in cell.split():
            assert word in words, word
    assert not any("…" in line for line in lines)


def test_a_word_longer_than_its_column_folds_instead_of_being_cut():
    url = "https://example.com/" + "segment/" * 12 + "end"
    piece = pieces_of(table(["a", "link"], [["x", url]]))[0]
    console = Console(width=60, color_system=None)
    with console.capture() as captured:
        console.print(AnswerMarkdown(piece))
    text = captured.get()
    assert "…" not in text
    assert url in "".join(text.split())  # folded over lines (the first column is blank on the next ones)


async def test_the_resumed_chat_shows_every_cell_of_a_wide_table_at_80_columns(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "wide", completed_turn(1, "the numbers please", answer(2)))
    app = world.resume_app("wide")
    async with app.run_test(size=(80, 40)) as pilot:
        answer_widget = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        await wait_for(pilot, lambda: answer_widget[0].size.height > 20, "the answer laid out")
        lines = [answer_widget[0].render_line(y).text.rstrip() for y in range(answer_widget[0].size.height)]
        every_cell_whole(lines, COLUMNS, wide_rows(2))
        assert "metric_12" in screen_text(app)
        await pilot.press("ctrl+q")
