"""Cutting an answer's Markdown into pieces that can each be rendered once (no Textual here).

Pieces end at boundaries where Markdown allows it — blank lines, between top-level list items, between table rows,
between lines of a code block, between lines of a long paragraph. A code block cut in two is closed and reopened, and a
table cut between rows keeps one set of column widths (`TableLook`) and one header, so the pieces render without a seam.
`answer_text.py` draws them; `answer_markdown.py` renders one.
"""

from __future__ import annotations

import re
from typing import Iterable

import msgspec

LIVE_LIMIT = 1000  # characters in the live piece before its finished part is sealed
# A paragraph is cut between its lines only past this length: each piece is its own paragraph, so a cut inside one ends
# a line early (Markdown rewraps soft line breaks); below it the paragraph stays whole and wraps at word boundaries.
PARAGRAPH_LIMIT = 8 * LIVE_LIMIT
LIST_ITEM = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
TABLE_DELIM = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
SETEXT = re.compile(r" {0,3}(?:=+|-+)\s*$")
CODE_META = "cairn.code"  # style meta on a drawn code block's cells: the piece's line its fence opens on
MAX_COLUMN = 40  # a frozen table column is never wider than this (longer cells wrap)


class TableLook(msgspec.Struct):
    """How a table that spans pieces is drawn in each of them: fixed column widths, the header only in the first."""

    widths: list[int]
    show_header: bool = True
    # the smallest width of each column (its longest word, as written): whether the table fits at a width or is drawn
    # one record per row (`answer_markdown`) is decided from these, so every piece of the table decides alike
    min_widths: list[int] = msgspec.field(default_factory=list)


class Piece(msgspec.Struct):
    text: str  # Markdown, complete in itself (a cut fence closed, a continued table given its header back)
    gap: bool = False  # a blank line separated it from the piece before
    first_table: TableLook | None = None  # look of the piece's first table (the continuation of a cut table)
    last_table: TableLook | None = None  # look of the piece's last table (a table cut after it)
    line: int = 0  # the answer's line its own text starts at (after the prefix): where its code blocks are in the answer
    prefix_lines: int = 0  # lines of synthetic start (a reopened fence, a continued table's header)

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


def _longest_word(cell: str) -> int:
    return max((len(word) for word in cell.split()), default=0)


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
        self._text_from = 0  # offset in body where the current run of paragraph lines began
        self._body_line = 0  # the answer's line the body starts at

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
        piece = Piece(self.prefix + self.body, self.gap, self.first_table, line=self._body_line,
                      prefix_lines=self.prefix.count("\n"))
        self._body_line += self.body.count("\n")
        self.prefix, self.body, self._scanned, self._cut = "", "", 0, None
        return [piece]

    @property
    def live(self) -> Piece:
        return Piece(self.prefix + self.body, self.gap, self.first_table, line=self._body_line,
                     prefix_lines=self.prefix.count("\n"))

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
                kind = "line" if self._prev != "text" or start - self._text_from > PARAGRAPH_LIMIT else ""
            before = self._prev
            self._classify(line, blank, indented)
            if self._prev == "text" and before != "text":
                self._text_from = start
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
        piece = Piece(self.prefix + head.rstrip("\n") + "\n", self.gap, self.first_table, line=self._body_line,
                      prefix_lines=self.prefix.count("\n"))
        self._body_line += head.count("\n")
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
                least = [_longest_word(c) for c in _cells(header)]
                for row in rows:
                    for index, cell in enumerate(_cells(row)[: len(least)]):
                        least[index] = max(least[index], _longest_word(cell))
                self._table_look = TableLook([min(MAX_COLUMN, max(3, w + max(2, w // 2))) for w in widths],
                                             min_widths=least)
                piece.last_table = self._table_look
            else:
                piece.last_table = TableLook(self._table_look.widths, False, self._table_look.min_widths)
            prefix = f"{header}\n{delimiter}\n"
            first_table = TableLook(self._table_look.widths, False, self._table_look.min_widths)
        self.gap = kind == "gap"
        self.prefix, self.body, self.first_table = prefix, rest, first_table
        self._scanned -= at
        self._text_from -= at
        self._cut = None
        return piece


def pieces_of(text: str) -> Iterable[Piece]:
    """The pieces a whole text is cut into (what history shows, and what a finished stream leaves)."""
    sealer = Sealer()
    return sealer.feed(text) + sealer.finish()


_FENCE_LINE = re.compile(r"(`{3,}|~{3,})([^`]*)")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def code_lines(text: str) -> list[str] | None:
    """The lines a piece that is nothing but one fenced code block draws, one per line (blank lines at either edge
    dropped, as `answer_text` drops them); None for any other piece. Lets a sealed code piece be measured without
    being highlighted (`answer_text`: it is drawn only if it ever comes on screen)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        return None
    opening = _FENCE_LINE.fullmatch(lines[0])
    if opening is None or lines[-1].rstrip(" ") != opening[1]:
        return None
    marker = opening[1]
    closing = re.compile(r" {0,3}" + re.escape(marker[0]) + "{" + str(len(marker)) + r",}[ \t]*")
    code = lines[1:-1]
    if any(_CONTROL.search(line) or closing.fullmatch(line) for line in code):
        return None
    while code and not code[0].strip():
        code.pop(0)
    while code and not code[-1].strip():
        code.pop()
    return code
