"""An assistant answer drawn from sealed Markdown pieces plus one small live piece, in one line-API widget.

Why: a widget that re-parses and re-lays-out the whole answer on every frame makes each chunk dearer as the answer grows
(a 2000-item list took minutes). Here the text is cut into pieces (`answer_pieces.py`) and every finished piece is
rendered to lines once (per width) and never touched again. Only the live piece is re-rendered per frame. Sealed and
live pieces use the same renderer (`AnswerMarkdown`, or `PlainMarkdown` for a piece of plain paragraphs and bullet
lists, which draws the same lines without loading Markdown), so there is no seam.

The same pieces serve history: an answer read from the log is cut the same way, so a long one can be shown from its
tail (`hidden`) and grow upwards as the user scrolls.
"""

from __future__ import annotations

from bisect import bisect_right

from rich.cells import cell_len
from rich.console import ConsoleRenderable
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from .answer_pieces import Piece, Sealer, code_lines
from .answer_prose import PlainMarkdown, plain_blocks


class AssistantText(Widget):
    """One assistant answer. `write()` while it streams, `finish()` when its message arrives; `source` is its text.

    One widget draws the whole answer line by line (Textual's line API): each sealed piece is rendered to lines once
    per width and kept; only the live piece is rendered again when it changes; Textual asks only for the lines on
    screen. However long the answer, a frame costs the live piece plus one screenful, and the transcript lays out one
    widget per answer, not one per piece. A sealed piece of plain code (no line to wrap) is measured without being
    highlighted and drawn only when a line of it is asked for: a fast stream seals several between two frames, most
    of them never on screen (P6, the code shape).
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
        self._drawn: list[_Drawn] = []  # per shown piece (pieces[hidden:]), in order
        self._starts: list[int] = []  # the first line of each, in the widget
        self._sealed_height = 0  # lines of all shown sealed pieces
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

    def _render_piece(self, piece: Piece, width: int) -> list[Strip]:
        console = self.app.console
        options = self.app.console_options.update(highlight=False, width=width, height=None)
        blocks = plain_blocks(piece.text)
        if blocks is not None:  # plain paragraphs and lists: the same lines without the Markdown stack (start-up, P8)
            renderable: ConsoleRenderable = PlainMarkdown(blocks)
        else:
            from .answer_markdown import AnswerMarkdown  # (Markdown and Pygments load with the first such piece)

            renderable = AnswerMarkdown(piece)
        lines = console.render_lines(renderable, options, style=self.visual_style.rich_style, pad=False)
        blank = [not "".join(segment.text for segment in line).strip() for line in lines]
        start, end = 0, len(lines)
        while start < end and blank[start]:
            start += 1  # Rich starts a list with a blank line: a list cut between items would show a seam
        while end > start and blank[end - 1]:
            end -= 1  # and ends some pieces with one; spacing between pieces is the piece's gap alone
        return [Strip(line) for line in lines[start:end]]

    def _draw(self, piece: Piece, width: int, first: bool) -> _Drawn:
        """A sealed piece, drawn now or, plain code, only measured (its lines drawn when first asked for)."""
        gap = piece.gap and not first
        code = code_lines(piece.text)
        if code and not any(cell_len(line.expandtabs(4)) > width - 2 for line in code):  # no wrap: a line per line
            return _Drawn(piece, None, len(code), gap)
        lines = self._render_piece(piece, width)
        return _Drawn(piece, lines, len(lines), gap)

    def _lines_of(self, index: int) -> list[Strip]:
        drawn = self._drawn[index]
        if drawn.lines is None:
            drawn.lines = self._render_piece(drawn.piece, self._width)
            if len(drawn.lines) != drawn.height:  # measured wrong: the drawn lines win (a layout more, nothing lost)
                drawn.height = len(drawn.lines)
                self._restart()
                self.refresh(layout=True)
        return drawn.lines

    def _restart(self) -> None:
        """Recount where each shown piece starts (after pieces were added in front or a height changed)."""
        self._starts, total = [], 0
        for drawn in self._drawn:
            self._starts.append(total)
            total += drawn.height + drawn.gap
        self._sealed_height = total

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
        self._drawn = [self._draw(p, width, i == 0) for i, p in enumerate(self.shown_pieces)]
        self._restart()
        self._live_stale = True

    def _ensure_rendered(self, width: int) -> None:
        if width != self._width:
            self._render_all(width)
        if self._live_stale:
            live = self._live
            if live is not None and live.text.strip():
                lines = self._render_piece(live, width)
                self._live_lines = [Strip.blank(0)] + lines if live.gap and self._sealed_height else lines
            else:
                self._live_lines = []
            self._live_stale = False

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width <= 0:
            return 0
        self._ensure_rendered(width)
        return self._sealed_height + len(self._live_lines)

    def render_line(self, y: int) -> Strip:
        if self._width:
            self._ensure_rendered(self._width)
        if y < self._sealed_height:
            index = bisect_right(self._starts, y) - 1
            offset = y - self._starts[index]
            if self._drawn[index].gap:
                if offset == 0:
                    return Strip.blank(0)
                offset -= 1
            lines = self._lines_of(index)
            return lines[offset] if offset < len(lines) else Strip.blank(0)
        y -= self._sealed_height
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
        if self._width:  # rendered already: render (or measure) only the new pieces
            for piece in pieces:
                drawn = self._draw(piece, self._width, not self._sealed_height)
                self._drawn.append(drawn)
                self._starts.append(self._sealed_height)
                self._sealed_height += drawn.height + drawn.gap

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
            if self._drawn and self.pieces[self.hidden + len(revealed)].gap:
                self._drawn[0].gap = True
            self._drawn[:0] = [self._draw(p, width, i == 0) for i, p in enumerate(revealed)]
            self._restart()
        self._changed()
        return True

    def estimated_lines(self) -> int:
        return sum(p.estimated_lines() for p in self.shown_pieces) + 1


class _Drawn:
    """A shown sealed piece: its lines (None until drawn: plain code measured only), how many, and whether a blank
    line separates it from the piece above."""

    __slots__ = ("piece", "lines", "height", "gap")

    def __init__(self, piece: Piece, lines: list[Strip] | None, height: int, gap: bool) -> None:
        self.piece, self.lines, self.height, self.gap = piece, lines, height, gap
