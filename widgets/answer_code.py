"""The fenced code blocks of an answer, so that one can be focused and copied whole (SPEC §11: copy).

An answer is drawn from pieces, and a long code block may be cut over several of them; copying must give the block as
the model wrote it, not a piece of it. So the blocks come from one parse of the whole answer (the parser Rich's
Markdown uses, with its settings), and each drawn code cell carries, as style meta, the line its block opens on in its
piece (`answer_markdown.CODE_META`); a piece's `line` and `prefix_lines` turn that into a line of the whole answer,
which names the block. Parsed only when an answer is focused or copied from: drawing never pays for it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from .answer_pieces import CODE_META, Piece
HAS_FENCE = re.compile(r"^[ \t>*+\-\d.)]*(?:`{3,}|~{3,})", re.MULTILINE)  # a cheap "may hold a fenced block"
FOCUS_MARK = "▌"


class CodeBlock(NamedTuple):
    start: int  # the answer's line its opening fence is on
    end: int  # the line after its closing fence
    text: str  # the code as written (no fences)


def may_hold_code(source: str) -> bool:
    return HAS_FENCE.search(source) is not None


def code_blocks(source: str) -> list[CodeBlock]:
    """Every fenced code block of an answer, in order (those inside lists and quotes too)."""
    if not may_hold_code(source):
        return []
    from markdown_it import MarkdownIt

    tokens = MarkdownIt().enable("strikethrough").enable("table").parse(source)
    blocks: list[CodeBlock] = []
    stack = list(reversed(tokens))
    while stack:
        token = stack.pop()
        if token.type == "fence" and token.map:
            blocks.append(CodeBlock(token.map[0], token.map[1], token.content))
        stack.extend(reversed(token.children or []))
    return blocks


def block_of(blocks: list[CodeBlock], line: int) -> int | None:
    """The index of the block holding the answer's `line`."""
    for index, block in enumerate(blocks):
        if block.start <= line < block.end:
            return index
    return None


def code_line(strip: Strip, piece: Piece) -> int | None:
    """The answer's line the code block drawn on this line opens on (None: no code here)."""
    for segment in strip:
        style = segment.style
        if style is not None and style._meta is not None:
            at = style.meta.get(CODE_META)
            if isinstance(at, int):
                return piece.line + at - piece.prefix_lines
    return None


def marked(strip: Strip, style: Style) -> Strip:
    """The line with its code's first cell (the block's left padding) drawn as a focus bar."""
    segments = list(strip)
    for index, segment in enumerate(segments):
        meta = segment.style.meta if segment.style is not None and segment.style._meta is not None else {}
        if CODE_META in meta and segment.text:
            text, segment_style, control = segment
            bar = Segment(FOCUS_MARK, (segment_style or Style()) + style)
            rest = [Segment(text[1:], segment_style, control)] if len(text) > 1 else []
            return Strip([*segments[:index], bar, *rest, *segments[index + 1:]], strip.cell_length)
    return strip
