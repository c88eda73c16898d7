"""The plain-prose path draws exactly what Rich's Markdown draws (cell by cell, style by style), and only takes text
in which nothing could be Markdown."""

from __future__ import annotations

import random

import pytest
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.theme import Theme

from cairn.widgets.answer_markdown import AnswerMarkdown
from cairn.widgets.answer_pieces import Piece, Sealer
from cairn.widgets.answer_prose import PlainProse, is_plain_prose

WORDS = ["the", "module", "does", "what", "its", "name", "says,", "and", "more", "words", "follow:", "(see", "below)",
         "naïve", "café", "日本語の", "文章", "emoji 🎉", "x-ray", "well-known", "3.14", "$HOME", "50%", "a/b",
         "'quoted'", '"double"', "ok?", "end.", "supercalifragilisticexpialidocious-and-then-some-more-letters"]


def lines_of(console: Console, renderable: object, width: int) -> list[list[tuple[str, Style | None]]]:
    options = console.options.update(width=width, height=None, highlight=False)
    lines = console.render_lines(renderable, options, style=Style(color="white", bgcolor="black"), pad=False)
    # trailing blank lines of a piece are trimmed by the widget either way; compare the drawn cells
    drawn = [[(s.text, s.style) for s in Segment.simplify(line) if s.text] for line in lines]
    while drawn and not "".join(t for t, _ in drawn[-1]).strip():
        drawn.pop()
    while drawn and not "".join(t for t, _ in drawn[0]).strip():
        drawn.pop(0)
    return drawn


def prose(rng: random.Random) -> str:
    paragraphs = []
    for _ in range(rng.randint(1, 4)):
        lines = []
        for _ in range(rng.randint(1, 4)):
            first = rng.choice([w for w in WORDS if w[0].isalpha()])  # a digit or a dash could start a list
            words = " ".join([first] + [rng.choice(WORDS) for _ in range(rng.randint(0, 30))])
            lines.append(" " * rng.randint(0, 3) + words + " " * rng.randint(0, 1))
        paragraphs.append("\n".join(lines))
    return ("\n" * rng.randint(0, 2)) + "".join(p + "\n" * rng.randint(2, 4) for p in paragraphs)


@pytest.mark.parametrize("paragraph_style", ["", "italic red on blue"])
def test_plain_prose_draws_what_markdown_draws(paragraph_style: str) -> None:
    theme = Theme({"markdown.paragraph": paragraph_style}) if paragraph_style else None
    console = Console(width=120, theme=theme, color_system="truecolor", force_terminal=True)
    rng = random.Random(29)
    checked = 0
    for _ in range(120):
        text = prose(rng)
        assert is_plain_prose(text), repr(text)
        for width in (8, 23, 40, 79, 118):
            assert lines_of(console, PlainProse(text), width) == lines_of(console, AnswerMarkdown(Piece(text)), width), \
                (text, width)
            checked += 1
    assert checked == 600


def test_pieces_of_a_streamed_prose_answer_take_the_plain_path() -> None:
    answer = "".join(f"Paragraph {p} of the answer: the module does what its name says.\n\n" for p in range(40))
    sealer = Sealer()
    pieces = sealer.feed(answer) + sealer.finish()
    assert len(pieces) > 1
    assert all(is_plain_prose(p.text) for p in pieces)


@pytest.mark.parametrize("text", [
    "some *emphasis* here", "some _emphasis_ here", "a `code` span", "a [link](http://x)", "an ![image](x.png)",
    "<b>html</b>", "an &amp; entity", "# heading", "> quote", "- item", "+ item", "* item", "1. first", "2) second",
    "    indented code", "title\n===", "title\n---", "a | table | row", "~~strike~~", "hard  \nbreak", "back\\slash",
    "tab\there", "carriage\rreturn", "nbsp\u00a0here", "bell\x07", "***", "___", "```\nfence\n```",
])
def test_anything_markdown_could_read_takes_the_markdown_path(text: str) -> None:
    assert not is_plain_prose(text)
