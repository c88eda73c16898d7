"""An assistant answer drawn from sealed Markdown pieces plus one small live piece, in one line-API widget.

Why: a widget that re-parses and re-lays-out the whole answer on every frame makes each chunk dearer as the answer grows
(a 2000-item list took minutes). Here the text is cut into pieces at boundaries where Markdown allows it — blank lines,
between top-level list items, between table rows, between lines of a code block, between lines of a long paragraph —
and every finished piece is rendered to lines once (per width) and never touched again. Only the live piece (at most about `LIVE_LIMIT`
characters past its last boundary) is re-rendered per frame. Sealed and live pieces use the same renderer
(`AnswerMarkdown`), so there is no seam: a code block cut in two is drawn without vertical padding in both halves, and a
table cut between rows keeps one set of column widths and one header.

The same pieces serve history: an answer read from the log is cut the same way, so a long one can be shown from its
tail (`hidden`) and grow upwards as the user scrolls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

LIVE_LIMIT = 1000  # characters in the live piece before its finished part is sealed
LIST_ITEM = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
TABLE_DELIM = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
SETEXT = re.compile(r" {0,3}(?:=+|-+)\s*$")
MAX_COLUMN = 40  # a frozen table column is never wider than this (longer cells wrap)


@dataclass
class TableLook:
    """How a table that spans pieces is drawn in each of them: fixed column widths, the header only in the first."""

    widths: list[int]
    show_header: bool = True


@dataclass
class Piece:
    text: str  # Markdown, complete in itself (a cut fence closed, a continued table given its header back)
    gap: bool = False  # a blank line separated it from the piece before
    first_table: TableLook | None = None  # look of the piece's first table (the continuation of a cut table)
    last_table: TableLook | None = None  # look of the piece's last table (a table cut after it)

    def estimated_lines(self) -> int:
        """A guess of its height before it is rendered (deciding how much history to show)."""
        return self.text.count("\n") + 1 + self.gap


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)]


class Sealer:
    """Cuts a growing Markdown text into finished pieces and a live rest, looking at each line once."""

    def __init__(self) -> None:
        self.text = ""  # everything written
        self.prefix = ""  # synthetic start of the live piece: a reopened fence, or a continued table's header
        self.body = ""  # the live piece's real text
        self.gap = False  # the live piece follows a blank line
        self.first_table: TableLook | None = None  # the live piece starts inside this (cut) table
        self._scanned = 0  # offset in body of the first line not looked at yet
        self._cut: tuple[int, str] | None = None  # the latest place the body may be cut, and how
        self._fence: tuple[str, str] | None = None  # (closing marker, opening line) while inside a code fence
        self._table: list[str] | None = None  # [header, delimiter, rows…] while inside a table
        self._table_look: TableLook | None = None
        self._prev = "blank"  # kind of the last line looked at
        self._prev_line = ""

    def feed(self, text: str) -> list[Piece]:
        """Add text; return the pieces it finished (the live rest stays in `prefix` + `body`)."""
        self.text += text
        self.body += text
        sealed: list[Piece] = []
        while True:
            end = self.body.find("\n", self._scanned)
            if end < 0:
                break
            self._line(self._scanned, self.body[self._scanned:end])
            self._scanned = end + 1
            if self._scanned > LIVE_LIMIT and self._cut is not None:
                sealed.append(self._seal(*self._cut))
        return sealed

    def finish(self) -> list[Piece]:
        """Everything left becomes one last piece (none if it is blank)."""
        if not self.body.strip():
            return []
        piece = Piece(self.prefix + self.body, self.gap, self.first_table)
        self.prefix, self.body, self._scanned, self._cut = "", "", 0, None
        return [piece]

    @property
    def live(self) -> Piece:
        return Piece(self.prefix + self.body, self.gap, self.first_table)

    def _line(self, start: int, line: str) -> None:
        """Decide whether the body may be cut just before this line, then update the scanner's state with it."""
        blank = not line.strip()
        indented = line[:1] in (" ", "\t")
        kind = ""
        if self._fence is not None:
            marker = self._fence[0]
            closes = line.strip().startswith(marker) and not line.strip().strip(marker[0])
            if not closes and self._prev == "code":
                kind = "code"
            self._prev = "fence_end" if closes else "code"
            if closes:
                self._fence = None
        else:
            if self._prev == "blank" and not blank and not indented and start > 0:
                kind = "gap"
            elif self._table is not None and len(self._table) > 2 and "|" in line and not blank:
                kind = "row"
            elif self._prev in ("list", "list_more") and LIST_ITEM.match(line):
                kind = "item"
            elif (self._prev in ("text", "quote", "heading") and not blank and not indented
                  and not SETEXT.match(line) and not TABLE_DELIM.match(line)):
                kind = "line"
            self._classify(line, blank, indented)
        if kind:
            self._cut = (start, kind)
        self._prev_line = line

    def _classify(self, line: str, blank: bool, indented: bool) -> None:
        opened = FENCE_OPEN.match(line)
        if self._table is not None and not blank and "|" in line:
            self._table.append(line)
            return
        self._table = None
        if opened:
            marker = opened.group(1)
            self._fence = (marker, line)
            self._prev = "fence_start"
        elif blank:
            self._prev = "blank"
        elif self._prev == "text" and "|" in self._prev_line and TABLE_DELIM.match(line) and "-" in line:
            self._table = [self._prev_line, line]
            self._table_look = None
            self._prev = "table"
        elif LIST_ITEM.match(line):
            self._prev = "list"
        elif indented and self._prev in ("list", "list_more"):
            self._prev = "list_more"
        elif line.startswith(">"):
            self._prev = "quote"
        elif line.startswith("#"):
            self._prev = "heading"
        else:
            self._prev = "text"

    def _seal(self, at: int, kind: str) -> Piece:
        head, rest = self.body[:at], self.body[at:]
        piece = Piece(self.prefix + head.rstrip("\n") + "\n", self.gap, self.first_table)
        prefix, first_table = "", None
        if kind == "code":
            assert self._fence is not None
            piece.text += self._fence[0] + "\n"
            prefix = self._fence[1] + "\n"
        elif kind == "row":
            assert self._table is not None
            header, delimiter, *rows = self._table
            if self._table_look is None:  # the first cut of this table freezes its columns for every later piece
                widths = [len(c) for c in _cells(header)]
                for row in rows:
                    for index, cell in enumerate(_cells(row)[: len(widths)]):
                        widths[index] = max(widths[index], len(cell))
                self._table_look = TableLook([min(MAX_COLUMN, max(3, w + max(2, w // 2))) for w in widths])
                piece.last_table = self._table_look
            else:
                piece.last_table = TableLook(self._table_look.widths, show_header=False)
            prefix = f"{header}\n{delimiter}\n"
            first_table = TableLook(self._table_look.widths, show_header=False)
        self.gap = kind == "gap"
        self.prefix, self.body, self.first_table = prefix, rest, first_table
        self._scanned -= at
        self._cut = None
        return piece


class AssistantText(Widget):
    """One assistant answer. `write()` while it streams, `finish()` when its message arrives; `source` is its text.

    One widget draws the whole answer line by line (Textual's line API): each sealed piece is rendered to lines once
    per width and kept; only the live piece is rendered again when it changes; Textual asks only for the lines on
    screen. However long the answer, a frame costs the live piece plus one screenful, and the transcript lays out one
    widget per answer, not one per piece.
    """

    DEFAULT_CSS = "AssistantText { height: auto; width: 1fr; padding: 0 1; }"

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self._sealer = Sealer()
        self.pieces: list[Piece] = []  # sealed pieces, in order
        self.hidden = 0  # leading pieces not shown yet (an answer from history, shown from its tail)
        self._live: Piece | None = Piece("")  # None once finished
        self.finished = False
        self._width = 0  # the content width the lines below were rendered at (0: not yet)
        self._piece_lines: list[list[Strip]] = []  # per shown piece (pieces[hidden:]): its lines, a gap line first
        self._lines: list[Strip] = []  # all shown sealed lines, in order
        self._live_lines: list[Strip] = []
        self._live_stale = True
        self._style: object = None  # the widget style the lines were rendered with
        if text:
            self.pieces = self._sealer.feed(text) + self._sealer.finish()
            self._live = None
            self.finished = True

    @property
    def source(self) -> str:
        return self._sealer.text

    @property
    def shown_pieces(self) -> list[Piece]:
        return self.pieces[self.hidden:]

    # -- rendering ---------------------------------------------------------------------------------------------------

    def _render_piece(self, piece: Piece, width: int, first: bool) -> list[Strip]:
        from .answer_markdown import AnswerMarkdown  # (Markdown and Pygments load with the first answer, not at start)

        console = self.app.console
        options = self.app.console_options.update(highlight=False, width=width, height=None)
        lines = console.render_lines(AnswerMarkdown(piece), options, style=self.visual_style.rich_style, pad=False)
        blank = [not "".join(segment.text for segment in line).strip() for line in lines]
        start, end = 0, len(lines)
        while start < end and blank[start]:
            start += 1  # Rich starts a list with a blank line: a list cut between items would show a seam
        while end > start and blank[end - 1]:
            end -= 1  # and ends some pieces with one; spacing between pieces is the piece's gap alone
        lines = lines[start:end]
        strips = [Strip(line) for line in lines]
        return [Strip.blank(0)] + strips if piece.gap and not first else strips

    def notify_style_update(self) -> None:
        """A theme change (or a style that reaches the text) renders the shown pieces again; a change that leaves the
        text's style as it was (hover, focus elsewhere) renders nothing."""
        super().notify_style_update()
        if self._width and self.is_attached and self.visual_style.rich_style != self._style:
            self._width = 0
            self.refresh(layout=True)

    def _render_all(self, width: int) -> None:
        self._width = width
        self._style = self.visual_style.rich_style
        self._piece_lines = [self._render_piece(p, width, i == 0) for i, p in enumerate(self.shown_pieces)]
        self._lines = [line for lines in self._piece_lines for line in lines]
        self._live_stale = True

    def _ensure_rendered(self, width: int) -> None:
        if width != self._width:
            self._render_all(width)
        if self._live_stale:
            live = self._live
            self._live_lines = (self._render_piece(live, width, not self._lines)
                                if live is not None and live.text.strip() else [])
            self._live_stale = False

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width <= 0:
            return 0
        self._ensure_rendered(width)
        return len(self._lines) + len(self._live_lines)

    def render_line(self, y: int) -> Strip:
        if self._width:
            self._ensure_rendered(self._width)
        if y < len(self._lines):
            return self._lines[y]
        y -= len(self._lines)
        return self._live_lines[y] if y < len(self._live_lines) else Strip.blank(0)

    # -- streaming ---------------------------------------------------------------------------------------------------

    async def write(self, text: str) -> None:
        self._add(self._sealer.feed(text))
        self._live = self._sealer.live
        self._changed()

    async def finish(self, suffix: str = "") -> None:
        """The answer is complete: the live rest is sealed like the rest (optionally after a suffix)."""
        pieces = self._sealer.feed(suffix) if suffix else []
        self._add(pieces + self._sealer.finish())
        self._live = None
        self.finished = True
        self._changed()

    def _add(self, pieces: list[Piece]) -> None:
        self.pieces.extend(pieces)
        if self._width:  # rendered already: render only the new pieces
            for piece in pieces:
                lines = self._render_piece(piece, self._width, not self._lines)
                self._piece_lines.append(lines)
                self._lines.extend(lines)

    def _changed(self) -> None:
        self._live_stale = True
        self.refresh(layout=True)

    # -- history from the tail ---------------------------------------------------------------------------------------

    def hide_older(self, keep_lines: int) -> int:
        """Before it is shown from history: keep only the last pieces that hold about `keep_lines` lines. Returns the
        lines kept."""
        lines, index = 0, len(self.pieces)
        while index > 0 and lines < keep_lines:
            index -= 1
            lines += self.pieces[index].estimated_lines()
        self.hidden = index
        self._width = 0
        return lines

    async def reveal_older(self, lines: int) -> bool:
        """Show about `lines` more lines of hidden pieces above the shown ones; False when none were hidden."""
        if not self.hidden:
            return False
        index, shown = self.hidden, 0
        while index > 0 and shown < lines:
            index -= 1
            shown += self.pieces[index].estimated_lines()
        revealed, self.hidden = self.pieces[index:self.hidden], index
        if self._width:  # render only the pieces now shown; the old first piece gets its gap line back
            width = self._width
            if self._piece_lines and self.pieces[self.hidden + len(revealed)].gap:
                self._piece_lines[0] = [Strip.blank(0)] + self._piece_lines[0]
            rendered = [self._render_piece(p, width, i == 0) for i, p in enumerate(revealed)]
            self._piece_lines[:0] = rendered
            self._lines = [line for lines in self._piece_lines for line in lines]
        self._changed()
        return True

    def estimated_lines(self) -> int:
        return sum(p.estimated_lines() for p in self.shown_pieces) + 1


def pieces_of(text: str) -> Iterable[Piece]:
    """The pieces a whole text is cut into (what history shows, and what a finished stream leaves)."""
    sealer = Sealer()
    return sealer.feed(text) + sealer.finish()
