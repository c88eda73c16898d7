"""An assistant answer drawn from sealed Markdown pieces plus one small live piece, in one line-API widget.

Why: a widget that re-parses and re-lays-out the whole answer on every frame makes each chunk dearer as the answer grows
(a 2000-item list took minutes). Here the text is cut into pieces (`answer_pieces.py`) and every finished piece is
rendered to lines once (per width) and never touched again. Only the live piece is re-rendered per frame. Sealed and
live pieces use the same renderer (`AnswerMarkdown`), so there is no seam.

The same pieces serve history: an answer read from the log is cut the same way, so a long one can be shown from its
tail (`hidden`) and grow upwards as the user scrolls.
"""

from __future__ import annotations

from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from .answer_pieces import Piece, Sealer


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
