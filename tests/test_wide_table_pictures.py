"""Pictures of a 12-column Markdown table in a resumed chat (SPEC §11 rev 4, issue 42): at 80×24 and 120×40 it is
drawn one record per row, every cell whole beside its heading; at 200×50 it fits and is a table. Snapshots
(pytest-textual-snapshot) so a change to how answers are drawn shows up as a picture."""

from __future__ import annotations

import pytest
from test_wide_tables import COLUMNS, answer, wide_rows
from tui_helpers import completed_turn, fixed_workspace, make_world, picture, screen_text, wait_for, write_log

from cairn.widgets.answer_markdown import RECORDS_NOTE
from cairn.widgets.answer_text import AssistantText

SIZES = [(80, 24), (120, 40), (200, 50)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_12_column_table_answer_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    fixed_workspace(world)
    write_log(world.store, "wide-table", completed_turn(1, "the numbers please", answer(2)))
    app = world.resume_app("wide-table")

    async def shown(pilot) -> None:
        widgets = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        await wait_for(pilot, lambda: widgets[0].size.height > 0, "the answer laid out")
        lines = [widgets[0].render_line(y).text.rstrip() for y in range(widgets[0].size.height)]
        words = {word for line in lines for word in line.split()}
        assert set(COLUMNS) <= words and {cell for row in wide_rows(2) for cell in row} <= words  # every cell whole
        assert not any("…" in line for line in lines)
        assert (RECORDS_NOTE in lines) == (size[0] < 200)
        await pilot.pause()
        assert "That is all." in screen_text(app)

    assert picture(snap_compare, app, size, shown)
