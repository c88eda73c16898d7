"""Rich's Markdown with the two changes an answer's pieces need (see `answer_text`): code blocks without vertical
padding (a block cut in two pieces draws as one), and tables drawn with a given look (fixed column widths, the header
only in the first piece), so a table cut between rows reads as one table.

A module of its own so that Markdown and Pygments load with the first answer drawn, not at start-up.
"""

from __future__ import annotations

from typing import ClassVar

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, TableElement
from rich.markdown import Markdown as RichMarkdown
from rich.syntax import Syntax
from rich.table import Table

from .answer_pieces import Piece, TableLook


class _Code(CodeBlock):
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip("\n")
        # wrapping only when a line needs it: the same lines, drawn ~40 % cheaper (a streamed code block, P6)
        wrap = any(cell_len(line.expandtabs(4)) > options.max_width - 2 for line in code.splitlines())
        yield Syntax(code, self.lexer_name, theme=self.theme, word_wrap=wrap, padding=(0, 1))


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
        table = Table(box=box.SIMPLE, pad_edge=False, style="markdown.table.border", show_edge=False,
                      collapse_padding=True, show_header=look is None or look.show_header)
        if self.header is not None and self.header.row is not None:
            for index, column in enumerate(self.header.row.cells):
                heading = column.content.copy()
                heading.stylize("markdown.table.header")
                width = look.widths[index] if look is not None and index < len(look.widths) else None
                table.add_column(heading, width=width)
        if self.body is not None:
            for row in self.body.rows:
                table.add_row(*[cell.content for cell in row.cells])
        yield table


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
