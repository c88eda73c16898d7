"""Text that is safe to print to a terminal (SPEC §8: control characters are neutralised in everything Cairn prints).

Model output, tool output, prompts, file names and session files are outside input: an ESC sequence in any of them could
recolour the screen, move the cursor, set the window title, or write the clipboard (OSC 52) if printed raw. `safe_text`
keeps newlines and tabs, and makes every other control character visible instead of letting the terminal act on it:
ESC → ␛, other C0 controls → their Unicode control picture (U+2400 + code), DEL → ␡, C1 controls (U+0080–U+009F) → �.
Lone surrogates (undecodable bytes smuggled in by Python's surrogateescape) become U+FFFD, so printing never raises
UnicodeEncodeError either. JSON output goes through `safe_json`: encoders escape C0 controls but leave DEL and C1 raw.
`summarize_arguments` is a tool call's arguments as one line of bounded length.

It lives beside the widgets (which may import nothing from `app`) and imports nothing of Textual, so headless commands
use it too without paying for Textual.
"""

from __future__ import annotations

import json
import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␛ for ESC (0x1b), ␀ for NUL, …
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"  # C1 controls and lone surrogates


def safe_text(text: str) -> str:
    """`text` with every control character except `\\n` and `\\t` made visible, and lone surrogates replaced."""
    return _UNSAFE.sub(_visible, text)


_JSON_UNSAFE = re.compile(rb"\x7f|\xc2[\x80-\x9f]")  # DEL and the C1 controls, as UTF-8: JSON encoders leave them raw


def safe_json(data: bytes) -> bytes:
    """Encoded JSON with DEL and the C1 controls (U+0080–U+009F, CSI U+009B among them) escaped as `\\u00XX`:
    encoders escape only C0, and a terminal may act on C1. They can occur only inside strings, so the JSON stays the same
    value."""
    return _JSON_UNSAFE.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), data)


def summarize_arguments(arguments: Any, limit: int = 80) -> str:
    if isinstance(arguments, dict):
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    else:
        text = repr(arguments)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
