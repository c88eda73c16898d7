"""A piece of an answer that is plain prose, drawn without the Markdown stack, exactly as Rich's Markdown draws it.

Why: Markdown's import (markdown-it compiles ~70 regexes, Pygments, Rich's Markdown) and its parse of every piece are
the dearest part of opening a session whose screen shows only prose (P8 in docs/benchmarks.md). A piece in which no
character or line start could mean anything to CommonMark is a list of paragraphs: its lines joined by spaces, a blank
line between paragraphs, each drawn as Rich's Markdown draws a paragraph (the same Text, spans and style), so the two
renderers cannot be told apart (`tests/test_answer_prose.py` compares them cell by cell). Anything else goes to
`answer_markdown`.
"""

from __future__ import annotations

import re

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.text import Text

# a character that CommonMark may read as markup (emphasis, code, links, images, HTML, entities, escapes, headings,
# tables, strikethrough, setext underlines), any whitespace but space and newline, or a control character
_MARKUP = re.compile(r"[\\`*_\[\]!<>&#|~=+]|[^\S \n]|[\x00-\x09\x0b-\x1f\x7f]")
# a line that could start a block other than a paragraph: 4+ spaces (code), a list marker or anything starting with a
# digit or a dash (lists, thematic breaks); or that ends with 2+ spaces (a hard break)
_BLOCK_LINE = re.compile(r"^(?: {4}| {0,3}[-0-9])|  $", re.MULTILINE)


def is_plain_prose(text: str) -> bool:
    """True when `text` is only paragraphs of plain words: Markdown would draw it as `PlainProse` does."""
    return _MARKUP.search(text) is None and _BLOCK_LINE.search(text) is None


class PlainProse:
    """Paragraphs drawn as Rich's Markdown draws them: one `Text(justify="left")` per paragraph whose lines are
    appended one by one with a space between (Markdown's soft break), styled `markdown.paragraph` over the base
    style, and one blank line between paragraphs."""

    def __init__(self, text: str) -> None:
        self.paragraphs = [[line.strip(" ") for line in block.split("\n") if line.strip(" ")]
                           for block in re.split(r"\n(?: *\n)+", text)]
        self.paragraphs = [lines for lines in self.paragraphs if lines]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        style = console.get_style("none", default="none") + console.get_style("markdown.paragraph", default="none")
        options = options.update(height=None)
        for index, lines in enumerate(self.paragraphs):
            text = Text(justify="left")
            for number, line in enumerate(lines):
                if number:
                    text.append(" ", style)
                text.append(line, style)
            if index:
                yield Segment.line()
            yield from console.render(text, options)
