"""Rich's Markdown with the two changes an answer's pieces need (see `answer_text`): code blocks without vertical
padding (a block cut in two pieces draws as one), and tables drawn with a given look (fixed column widths, the header
only in the first piece), so a table cut between rows reads as one table. A code block's cells also carry, as style
meta, the line its fence opens on (`CODE_META`): a focused block is found on the drawn lines by it (`answer_code`).

Wide tables stay readable (SPEC §11 rev 4). A table whose columns cannot all be as wide as their longest word at the
width it is drawn at (Rich would cut every cell to `val…`) is drawn one record per row instead: each cell on a line of
its own beside its column's heading, the value wrapped under itself, rows separated by a rule. A table that fits is
drawn as a table whose cells wrap, and a word longer than its column folds onto the next line rather than being cut:
no cell's text is ever lost. The choice depends only on the table's columns and the width (a table cut into pieces
decides from the smallest widths frozen in its look, so all its pieces agree), and it is made again when the width
changes. Cheap: one sum over the cells' longest words, no extra render.

A module of its own so that Markdown and Pygments load with the first answer drawn, not at start-up.
"""

from __future__ import annotations

from typing import ClassVar

from markdown_it.token import Token
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, TableElement
from rich.markdown import Markdown as RichMarkdown
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from .answer_pieces import CODE_META, Piece, TableLook


class _Code(CodeBlock):
    line = 0  # the piece's line the block starts on

    @classmethod
    def create(cls, markdown: RichMarkdown, token: Token) -> "_Code":
        block = cls(token.info.partition(" ")[0] or "text", markdown.code_theme)  # (what CodeBlock.create makes)
        block.line = token.map[0] if token.map else 0
        return block

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The block, every cell carrying its line as `CODE_META`: a focused block is found and marked on the drawn
        lines (`answer_code`)."""
        code = str(self.text).rstrip("\n")
        # wrapping only when a line needs it: the same lines, drawn ~40 % cheaper (a streamed code block, P6)
        wrap = any(cell_len(line.expandtabs(4)) > options.max_width - 2 for line in code.splitlines())
        syntax = Syntax(code, self.lexer_name, theme=self.theme, word_wrap=wrap, padding=(0, 1))
        yield from Segment.apply_style(console.render(syntax, options), post_style=Style.from_meta({CODE_META:
                                                                                                    self.line}))


class _Table(TableElement):
    look: TableLook | None = None

    @classmethod
    def create(cls, markdown: RichMarkdown, token: object) -> "_Table":
        table = cls()
        assert isinstance(markdown, AnswerMarkdown)
        index = markdown.tables_seen
        markdown.tables_seen += 1
        if index == 0 and markdown.piece.first_table is not None:
            table.look = markdown.piece.first_table
        elif index == markdown.tables_total - 1 and markdown.piece.last_table is not None:
            table.look = markdown.piece.last_table
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        look = self.look
        headings = [column.content for column in self.header.row.cells] if self.header and self.header.row else []
        rows = [[cell.content for cell in row.cells] for row in self.body.rows] if self.body is not None else []
        if headings and self._too_wide(console, options, headings, rows):
            yield from _records(console, options, headings, rows, first=look is None or look.show_header)
            return
        table = _table(show_header=look is None or look.show_header)
        for index, column in enumerate(headings):
            heading = column.copy()
            heading.stylize("markdown.table.header")
            width = look.widths[index] if look is not None and index < len(look.widths) else None
            table.add_column(heading, width=width, overflow="fold")  # a word wider than its column folds, not cut
        for cells in rows:
            table.add_row(*cells)
        yield table

    def _too_wide(self, console: Console, options: ConsoleOptions, headings: list[Text],
                  rows: list[list[Text]]) -> bool:
        """Whether the columns cannot all be as wide as their longest word (the look's frozen smallest widths, for a
        table cut into pieces) at this width."""
        look = self.look
        if look is not None and len(look.min_widths) == len(headings):
            least = look.min_widths
        else:
            least = [longest_word(h.plain) for h in headings]
            for cells in rows:
                for index, cell in enumerate(cells[: len(least)]):
                    least[index] = max(least[index], longest_word(cell.plain))
        narrowest = _table(show_header=True)
        for width in least:
            narrowest.add_column(width=max(1, width))
        room = sum(least) + 4 * len(least) + 8  # measured wider than it can be: a measurement is cut at the width
        return Measurement.get(console, options.update_width(room), narrowest).minimum > options.max_width


def longest_word(text: str) -> int:
    """The width a cell cannot be drawn narrower than without cutting a word (what Rich measures as its minimum)."""
    return max((cell_len(word) for word in text.split()), default=0)


def _table(show_header: bool) -> Table:
    return Table(box=box.SIMPLE, pad_edge=False, style="markdown.table.border", show_edge=False, collapse_padding=True,
                 show_header=show_header)


RECORDS_NOTE = "(a table too wide to show side by side: one block per row)"


def _records(console: Console, options: ConsoleOptions, headings: list[Text], rows: list[list[Text]],
             first: bool) -> RenderResult:
    """A table as records: per row, each cell beside its column's heading (the heading column at most a third of the
    width; headings and values wrap, a word wider than its place folds), rows separated by a rule. `first`: the
    table's first piece (its note, no rule above its first row); a continued piece starts with a rule."""
    width = options.max_width
    names = [h.copy() if h.plain.strip() else Text(f"column {i + 1}") for i, h in enumerate(headings)]
    for name in names:
        name.stylize("markdown.table.header")
    key_width = max(1, min(max(cell_len(n.plain) for n in names), max(1, width // 3)))
    rule = Segment("─" * width, console.get_style("markdown.table.border", default="none"))
    new_line = Segment.line()
    if first:
        yield Text(RECORDS_NOTE, style="dim italic")
    for number, cells in enumerate(rows):
        if number or not first:
            yield rule
            yield new_line
        grid = Table.grid(padding=(0, 2), collapse_padding=True)
        grid.add_column(width=key_width, overflow="fold")
        grid.add_column(ratio=1, overflow="fold")
        for index, name in enumerate(names):
            grid.add_row(name, cells[index] if index < len(cells) else Text(""))
        yield grid


class AnswerMarkdown(RichMarkdown):
    """Rich's Markdown with the two changes pieces need: code without vertical padding, tables with a given look."""

    elements: ClassVar[dict] = {**RichMarkdown.elements, "fence": _Code, "code_block": _Code, "table_open": _Table}

    def __init__(self, piece: Piece) -> None:
        super().__init__(piece.text)
        self.piece = piece
        self.tables_total = sum(1 for token in self.parsed if token.type == "table_open")
        self.tables_seen = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        self.tables_seen = 0
        yield from super().__rich_console__(console, options)
