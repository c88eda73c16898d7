"""An assistant answer drawn from sealed Markdown pieces plus one small live piece, in one line-API widget.

Why: a widget that re-parses and re-lays-out the whole answer on every frame makes each chunk dearer as the answer grows
(a 2000-item list took minutes). Here the text is cut into pieces (`answer_pieces.py`) and every finished piece is
rendered to lines once (per width) and never touched again. Only the live piece is re-rendered per frame. Sealed and
live pieces use the same renderer (`AnswerMarkdown`, or `PlainMarkdown` for a piece of plain paragraphs and bullet
lists, which draws the same lines without loading Markdown), so there is no seam.

The same pieces serve history: an answer read from the log is cut the same way, so a long one can be shown from its
tail (`hidden`) and grow upwards as the user scrolls.

A finished answer holding fenced code is a Tab stop: focused, one code block is marked (a bar on its left), Tab /
Shift+Tab move between its blocks (then on to the next widget), and `c` or `y` asks the screen to copy that block whole
(`CopyRequested`; see `answer_code`).
"""

from __future__ import annotations

from bisect import bisect_right

from rich.cells import cell_len
from rich.console import ConsoleRenderable
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from .answer_code import CodeBlock, block_of, code_blocks, code_line, marked, may_hold_code
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

    DEFAULT_CSS = """
    AssistantText { height: auto; width: 1fr; padding: 0 1; }
    AssistantText > .answer-text--code-focus { color: $accent; text-style: bold; }
    """
    COMPONENT_CLASSES = {"answer-text--code-focus"}
    BINDINGS = [
        Binding("c,y", "copy_block", "Copy code block"),
        Binding("tab", "next_block(1)", "Next block", show=False),
        Binding("shift+tab", "next_block(-1)", "Previous block", show=False),
    ]

    class CopyRequested(Message):
        """Copy `text` to the clipboard (the screen does it, and says so); `what` names it in the notice."""

        def __init__(self, text: str, what: str) -> None:
            super().__init__()
            self.text = text
            self.what = what

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
        self.can_focus = False  # a Tab stop once finished with a code block in it
        self.code_at = 0  # the focused code block (an index into `code_blocks`)
        self._blocks: list[CodeBlock] | None = None  # parsed when first focused or copied from
        if text:
            self.pieces = self._sealer.feed(text) + self._sealer.finish()
            self._live = None
            self.finished = True
            self.can_focus = may_hold_code(text)

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
            if offset >= len(lines):
                return Strip.blank(0)
            if self.has_focus and self._focused_line(self._drawn[index].piece, lines[offset]):
                return marked(lines[offset], self.get_component_rich_style("answer-text--code-focus"))
            return lines[offset]
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
        self._blocks = None
        self.can_focus = may_hold_code(self.source)
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
        self._blocks = None
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
        if self._blocks is not None:  # blocks revealed above: the focused one keeps its place
            before, self._blocks = len(self._blocks), None
            self.code_at += len(self.code_blocks) - before
        self.can_focus = self.finished and may_hold_code(self.source)
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

    # -- code blocks: focus and copy ---------------------------------------------------------------------------------

    @property
    def code_blocks(self) -> list[CodeBlock]:
        """The answer's fenced code blocks that are shown (one continued from hidden pieces counts)."""
        if self._blocks is None:
            shown = self.shown_pieces
            first = shown[0].line - shown[0].prefix_lines if shown else 0
            self._blocks = [b for b in code_blocks(self.source) if b.end > first] if self.finished else []
        return self._blocks

    def _focused_line(self, piece: Piece, line: Strip) -> bool:
        blocks = self.code_blocks
        at = code_line(line, piece)
        return at is not None and self.code_at < len(blocks) and block_of(blocks, at) == self.code_at

    def _on_focus(self, event: events.Focus) -> None:
        super()._on_focus(event)
        if not self.code_blocks:  # what looked like a fence was none, or its block is not shown yet: no Tab stop
            self.can_focus = False
            self.call_after_refresh(self.screen.focus_next)
            return
        self.code_at = min(self.code_at, len(self.code_blocks) - 1)
        self.refresh()
        self.call_after_refresh(self._show_block)

    def _on_blur(self, event: events.Blur) -> None:
        super()._on_blur(event)
        self.refresh()

    def action_next_block(self, step: int) -> None:
        """Tab / Shift+Tab: the next (previous) code block of this answer, then on to the next (previous) widget."""
        at = self.code_at + step
        if 0 <= at < len(self.code_blocks):
            self.code_at = at
            self.refresh()
            self._show_block()
        elif step > 0:
            self.screen.focus_next()
        else:
            self.screen.focus_previous()

    def action_copy_block(self) -> None:
        blocks = self.code_blocks
        if self.code_at < len(blocks):
            self.post_message(self.CopyRequested(blocks[self.code_at].text, "the code block"))

    def _show_block(self) -> None:
        """Scroll the focused block into view: its first lines, in the piece its opening fence is in."""
        blocks, parent = self.code_blocks, self.parent
        if not (self.code_at < len(blocks) and self._drawn and isinstance(parent, Widget)):
            return
        start = blocks[self.code_at].start
        index = max((i for i, d in enumerate(self._drawn) if d.piece.line <= start), default=0)
        drawn = self._drawn[index]
        focused = [n for n, line in enumerate(self._lines_of(index)) if self._focused_line(drawn.piece, line)]
        y = self._starts[index] + drawn.gap + (focused[0] if focused else 0)
        top = self.virtual_region.y + self.styles.padding.top
        parent.scroll_to_region(Region(0, top + y, 1, max(1, min(len(focused), parent.size.height))), animate=False)


class _Drawn:
    """A shown sealed piece: its lines (None until drawn: plain code measured only), how many, and whether a blank
    line separates it from the piece above."""

    __slots__ = ("piece", "lines", "height", "gap")

    def __init__(self, piece: Piece, lines: list[Strip] | None, height: int, gap: bool) -> None:
        self.piece, self.lines, self.height, self.gap = piece, lines, height, gap
