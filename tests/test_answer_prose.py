"""The plain path (paragraphs and tight bullet lists) draws exactly what Rich's Markdown draws (cell by cell, style by
style), and only takes text in which nothing else could be Markdown."""

from __future__ import annotations

import random

import pytest
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.theme import Theme

from cairn.widgets.answer_markdown import AnswerMarkdown
from cairn.widgets.answer_pieces import Piece, Sealer
from cairn.widgets.answer_prose import PlainMarkdown, is_plain_prose, plain_blocks

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
        blocks = plain_blocks(text)
        assert blocks is not None, repr(text)
        for width in (8, 23, 40, 79, 118):
            assert lines_of(console, PlainMarkdown(blocks), width) == lines_of(console, AnswerMarkdown(Piece(text)),
                                                                               width), (text, width)
            checked += 1
    assert checked == 600


def test_pieces_of_a_streamed_prose_answer_take_the_plain_path() -> None:
    answer = "".join(f"Paragraph {p} of the answer: the module does what its name says.\n\n" for p in range(40))
    sealer = Sealer()
    pieces = sealer.feed(answer) + sealer.finish()
    assert len(pieces) > 1
    assert all(is_plain_prose(p.text) and plain_blocks(p.text) is not None for p in pieces)


def plain_list(rng: random.Random) -> str:
    marker = rng.choice("-*+")
    items = []
    for _ in range(rng.randint(1, 12)):
        words = [rng.choice([w for w in WORDS if w[0].isalpha()])]
        for _ in range(rng.randint(0, 14)):
            words.append(f"`{rng.choice(CODE)}`" if rng.random() < 0.2 else rng.choice(WORDS))
        items.append(f"{marker} " + " ".join(words))
    return "\n".join(items)


CODE = ["code7", "x = 1", "a*b", "<tag>", "&amp;", "snake_case", "[link](x)", "back\\slash", "日本", "a  b", "#1"]
LIST_THEME = {"markdown.paragraph": "italic", "markdown.item": "on blue", "markdown.item.bullet": "bold red",
              "markdown.code": "reverse green"}


@pytest.mark.parametrize("themed", [False, True])
def test_paragraphs_and_bullet_lists_draw_what_markdown_draws(themed: bool) -> None:
    console = Console(width=120, theme=Theme(LIST_THEME) if themed else None, color_system="truecolor",
                      force_terminal=True)
    rng = random.Random(2029)
    checked = 0
    for _ in range(120):
        blocks, last_list = [], False
        for _ in range(rng.randint(1, 4)):
            is_list = not last_list and rng.random() < 0.6  # two lists with only blank lines between are one loose list
            blocks.append(plain_list(rng) if is_list else prose(rng).strip("\n").lstrip(" "))
            last_list = is_list
        text = "".join(b + "\n" * rng.randint(2, 3) for b in blocks)
        parsed = plain_blocks(text)
        assert parsed is not None, repr(text)
        for width in (9, 23, 40, 79, 118):
            assert lines_of(console, PlainMarkdown(parsed), width) == lines_of(console, AnswerMarkdown(Piece(text)),
                                                                               width), (text, width)
            checked += 1
    assert checked == 600


def test_whatever_near_miss_markdown_the_plain_path_takes_it_draws_as_markdown_does() -> None:
    """Random lines built from list markers, backticks, digits, spaces and markup: any text the plain path accepts
    must draw exactly as Markdown draws it (the rest goes to Markdown, which is always right)."""
    console = Console(width=120, theme=Theme(LIST_THEME), color_system="truecolor", force_terminal=True)
    rng = random.Random(7)
    starts = ["- ", "* ", "+ ", "-", "  - ", "1. ", "- 1. ", "- - ", "- `", "  ", "    ", "", "", "", "> ", "# "]
    pieces = ["word", "`code`", "`", "``x``", " ", "  ", "- ", "*", "_", "1.", "x`y` z", "` a `", "`a `", "日本", "\t"]
    accepted = 0
    for _ in range(3000):
        lines = []
        for _ in range(rng.randint(1, 6)):
            line = rng.choice(starts) + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
            lines.append(line if rng.random() < 0.8 else "")
        text = "\n".join(lines)
        parsed = plain_blocks(text)
        if parsed is None:
            continue
        accepted += 1
        for width in (12, 50):
            assert lines_of(console, PlainMarkdown(parsed), width) == lines_of(console, AnswerMarkdown(Piece(text)),
                                                                               width), (text, width)
    assert accepted > 150  # the fuzz reaches the plain path often enough to mean something (182 of 3000 here)


@pytest.mark.parametrize("text", [
    "some *emphasis* here", "some _emphasis_ here", "a `code` span", "a [link](http://x)", "an ![image](x.png)",
    "<b>html</b>", "an &amp; entity", "# heading", "> quote", "- item", "+ item", "* item", "1. first", "2) second",
    "    indented code", "title\n===", "title\n---", "a | table | row", "~~strike~~", "hard  \nbreak", "back\\slash",
    "tab\there", "carriage\rreturn", "nbsp\u00a0here", "bell\x07", "***", "___", "```\nfence\n```",
])
def test_anything_markdown_could_read_takes_the_markdown_path(text: str) -> None:
    assert not is_plain_prose(text)
    if text not in ("- item", "+ item", "* item"):  # (a tight bullet list: plain)
        assert plain_blocks(text) is None


@pytest.mark.parametrize("text", [
    "- a\n\n- loose", "- a\n* two markers", "- a\ncontinued", "- 1. nested", "- - nested", "- * nested",
    "- ``double``", "- `a ` b", "- ` a`", "text\n- item", "- a\n\n  indented continuation", "1. ordered", "- a `code",
    "- **bold**", "- trailing ", "  - indented", "- tab\there", "- `tab\there`", "-no space", "- # heading",
    "- > quote", "- a\n\n* b",
])
def test_lists_that_are_not_one_tight_plain_list_take_the_markdown_path(text: str) -> None:
    assert plain_blocks(text) is None
