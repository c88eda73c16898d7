"""How many tokens a text is, estimated by character class, so compaction sizes its requests right in every script.

Characters-per-token differs by an order of magnitude between scripts: English prose is about 4 characters a token,
base64 about 1.4, Chinese about one token a character (Gemma), and a tokenizer that falls back to bytes spends a
token per UTF-8 byte. One ratio for all of them made a Chinese session's summary requests 3× the window (issue 44).
So the estimate counts what tokenizers split on:

- ASCII: one token per word piece (a capital with its lower-case letters, an upper-case run, a digit, a
  punctuation mark, a run of two or more spaces or newlines), plus one for every 4 letters of a word longer than 6.
  Prose comes out near 3.6 characters a token, code near 2.8. A run of 24 or more letters and digits of both cases
  (base64, keys, hashes) is 3 tokens every 4 characters: tokenizers find few merges in it.
- Any other character by its UTF-8 length: 2 bytes (accented Latin, Greek, Cyrillic, Hebrew, Arabic) half a token,
  3 bytes (CJK, kana, Hangul, Indic, Thai) one token, 4 bytes (emoji, rare CJK) two tokens.

It is still an estimate: a server's refusal for length stays the backstop (compaction retries with half the piece).
Texts are cached by value: a long session's old messages are estimated once, not on every request.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Iterable

PER_MESSAGE = 4  # role and framing tokens a chat template adds to every message
ASCII_PIECE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]|[^\sA-Za-z0-9]|\s{2,}")
NON_ASCII = re.compile(r"[^\x00-\x7f]")
NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
TWO_BYTES = re.compile(r"[\u0080-\u07ff]")
FOUR_BYTES = re.compile(r"[\U00010000-\U0010ffff]")
LETTERS_PER_EXTRA_TOKEN = 4
# base64, keys, hashes: long runs mixing upper case, lower case and digits, where tokenizers find few merges
BLOB = re.compile(r"[A-Za-z0-9+/=_-]{24,}")
BLOB_TOKENS_PER_CHAR = 0.75
LONG_PIECE = 6


@lru_cache(maxsize=8192)
def text_tokens(text: str) -> int:
    """The estimated token count of one text (see the module's docstring)."""
    if not text:
        return 0
    tokens = 0.0
    ascii_text = text
    if not text.isascii():
        others = "".join(NON_ASCII.findall(text))
        two, four = len(TWO_BYTES.findall(others)), len(FOUR_BYTES.findall(others))
        tokens += two * 0.5 + (len(others) - two - four) + four * 2
        ascii_text = NON_ASCII_RUN.sub(" ", text)  # counted above; a space keeps the words apart
    if len(ascii_text) >= 24:
        blobs = [b for b in BLOB.findall(ascii_text) if _mixed(b)]
        if blobs:
            tokens += sum(len(b) for b in blobs) * BLOB_TOKENS_PER_CHAR
            ascii_text = BLOB.sub(lambda m: " " if _mixed(m.group()) else m.group(), ascii_text)
    pieces = ASCII_PIECE.findall(ascii_text)
    tokens += len(pieces)
    tokens += sum(len(p) for p in pieces if len(p) > LONG_PIECE and p[0].isalpha()) // LETTERS_PER_EXTRA_TOKEN
    return int(tokens) + 1


def _mixed(run: str) -> bool:
    return not run.isdigit() and not run.isalpha() and not run.islower() and not run.isupper()


def value_tokens(value: Any) -> int:
    """Tokens of every text inside a message's value (strings, lists of parts, tool calls' arguments)."""
    if isinstance(value, str):
        return text_tokens(value)
    if isinstance(value, dict):
        return sum(value_tokens(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(value_tokens(v) for v in value)
    return 0 if value is None else 1


def messages_tokens(messages: Iterable[dict[str, Any]]) -> int:
    """The estimated size of a conversation: each message's texts plus its framing."""
    return sum(PER_MESSAGE + value_tokens(m) for m in messages)


def tools_tokens(tools: Iterable[Any]) -> int:
    """The estimated size of the tools' names, descriptions and JSON schemas a request carries."""
    return sum(
        PER_MESSAGE + text_tokens(getattr(tool, "name", "")) + text_tokens(getattr(tool, "description", ""))
        + text_tokens(json.dumps(getattr(tool, "parameters", {}), sort_keys=True))
        for tool in tools
    )
