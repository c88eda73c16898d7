"""A piece of an answer made of plain paragraphs and plain bullet lists, drawn without the Markdown stack, exactly as
Rich's Markdown draws it.

Why: Markdown's import (markdown-it compiles ~70 regexes, Pygments, Rich's Markdown) and its parse of every piece are
the dearest part of opening a session whose screen shows only prose and lists (P8 in docs/benchmarks.md). A piece is
plain when it is blocks separated by blank lines, each block either

- a paragraph in which no character or line start could mean anything to CommonMark: its lines joined by spaces, or
- a tight bullet list: every line one item (`- `, `* ` or `+ `, the same marker throughout, then text), each item's
  text plain like a paragraph's except for code spans in single backticks;

and it is drawn as Rich's Markdown draws those blocks (the same Text, spans, styles and bullets), so the two renderers
cannot be told apart (`tests/test_answer_prose.py` compares them cell by cell). Anything else goes to
`answer_markdown`.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Union

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.text import Text

# a character that CommonMark may read as markup (emphasis, code, links, images, HTML, entities, escapes, headings,
# tables, strikethrough, setext underlines), any whitespace but space and newline, or a control character
_MARKUP = re.compile(r"[\\`*_\[\]!<>&#|~=+]|[^\S \n]|[\x00-\x09\x0b-\x1f\x7f]")
# a line that could start a block other than a paragraph: 4+ spaces (code), a list marker or anything starting with a
# digit or a dash (lists, thematic breaks); or that ends with 2+ spaces (a hard break)
_BLOCK_LINE = re.compile(r"^(?: {4}| {0,3}[-0-9])|  $", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n(?: *\n)+")
# a list item: the marker at the line's start, one space, text that starts with neither a digit nor a dash (a nested
# list or a thematic break) and ends with no space
_ITEM = re.compile(r"([-*+]) ([^\s\d-](?:.*\S)?)")
# a code span in single backticks whose content neither starts nor ends with a space (CommonMark would strip one)
_CODE_SPAN = re.compile(r"`([^`\s](?:[^`]*[^`\s])?)`")
_CODE_UNSAFE = re.compile(r"[^\S ]|[\x00-\x1f\x7f]")


def is_plain_prose(text: str) -> bool:
    """True when `text` is only paragraphs of plain words."""
    return _MARKUP.search(text) is None and _BLOCK_LINE.search(text) is None


class Paragraph(NamedTuple):
    lines: list[str]


class BulletList(NamedTuple):
    items: list[list[tuple[str, bool]]]  # each item: (text, is code) parts


Block = Union[Paragraph, BulletList]


def _item_parts(text: str) -> list[tuple[str, bool]] | None:
    parts: list[tuple[str, bool]] = []
    end = 0
    for span in _CODE_SPAN.finditer(text):
        parts += [(text[end:span.start()], False), (span.group(1), True)]
        end = span.end()
    parts.append((text[end:], False))
    for part, code in parts:
        if (_CODE_UNSAFE if code else _MARKUP).search(part):
            return None
    return [(part, code) for part, code in parts if part]


def plain_blocks(text: str) -> list[Block] | None:
    """The blocks of `text` when Markdown would draw it as `PlainMarkdown` does, else None."""
    blocks: list[Block] = []
    for chunk in _BLANK_LINES.split(text):
        lines = [line for line in chunk.split("\n") if line.strip(" ")]
        if not lines:
            continue
        items = [_ITEM.fullmatch(line) for line in lines]
        if not any(items):
            if not is_plain_prose(chunk) or (blocks and isinstance(blocks[-1], BulletList) and lines[0][0] == " "):
                return None  # (indented after a list, it would continue the list's last item)
            blocks.append(Paragraph([line.strip(" ") for line in lines]))
            continue
        if not all(items) or len({m.group(1) for m in items if m}) != 1 or (blocks and isinstance(blocks[-1],
                                                                                              BulletList)):
            return None  # a paragraph's lazy line, two markers, or a list after a blank line (a loose list)
        parts = [_item_parts(m.group(2)) for m in items if m]
        if any(p is None for p in parts):
            return None
        blocks.append(BulletList([p for p in parts if p is not None]))
    return blocks


class PlainMarkdown:
    """Blocks drawn as Rich's Markdown draws them. A paragraph: one `Text(justify="left")` whose lines are appended
    with a space between (Markdown's soft break), styled `markdown.paragraph` over the base style. A list item: the
    same over `markdown.item` (code spans `markdown.code` on top), drawn 3 cells narrower behind ` • ` and then
    `   ` in `markdown.item.bullet`. One blank line before every block but the first, and before a list even then
    (Rich counts the paragraphs inside its items)."""

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        base = console.get_style("none", default="none")
        paragraph = console.get_style("markdown.paragraph", default="none")
        options = options.update(height=None)
        for index, block in enumerate(self.blocks):
            if index or isinstance(block, BulletList):
                yield Segment.line()
            if isinstance(block, Paragraph):
                text = Text(justify="left")
                for number, line in enumerate(block.lines):
                    if number:
                        text.append(" ", base + paragraph)
                    text.append(line, base + paragraph)
                yield from console.render(text, options)
            else:
                yield from self._list(console, options, block, base + console.get_style("markdown.item",
                                                                                        default="none"))

    @staticmethod
    def _list(console: Console, options: ConsoleOptions, block: BulletList, item: object) -> RenderResult:
        words = item + console.get_style("markdown.paragraph", default="none")  # type: ignore[operator]
        code = words + console.get_style("markdown.code", default="none")
        bullet_style = console.get_style("markdown.item.bullet", default="none")
        bullet, padding, new_line = Segment(" • ", bullet_style), Segment("   ", bullet_style), Segment("\n")
        narrower = options.update(width=options.max_width - 3)
        for parts in block.items:
            text = Text(justify="left")
            for part, is_code in parts:
                text.append(part, code if is_code else words)
            for number, line in enumerate(console.render_lines(text, narrower, style=item)):  # type: ignore[arg-type]
                yield padding if number else bullet
                yield from line
                yield new_line
