"""The value checks the config file's tables share: its profiles (`file.py`) and its MCP servers (`mcp_servers.py`).

Each check takes a TOML value and returns it (or a copy) when it is of the right kind, or raises ValueError with the
rest of a sentence that begins with the key ("must be …"); the reader adds the file, the line and the key. One set of
checks, so a header, a variable name or a misspelt key is judged the same way wherever it is written.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Iterable

# headers whose value is a credential: never read from the config file (it gets shared and committed)
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"})
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def text_without_nul(value: Any) -> str:
    """`non_empty_text` that also refuses a NUL character (a command line or a path cannot hold one)."""
    if isinstance(value, str) and "\0" in value:
        raise ValueError("must be a non-empty string")
    return non_empty_text(value)


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def env_name(example: str) -> Callable[[Any], str]:
    """The check of a setting that names an environment variable; `example` is shown in its message."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
            raise ValueError(f"must be the name of an environment variable, e.g. \"{example}\"")
        return value

    return check


def header_table(example: str, refusal: str) -> Callable[[Any], dict[str, str]]:
    """The check of a table of HTTP headers; `example` is shown in its message, and `refusal` says what to do instead
    of giving a credential header (they are refused: see SECRET_HEADERS)."""

    def check(value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ValueError(f"must be a table of header names to string values, e.g. {{ {example} }}")
        for name in value:
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(f"has a header name that is not valid: {name[:40]!r}")
            if name.lower() in SECRET_HEADERS:
                raise ValueError(f"must not carry {name}: {refusal}")
        return dict(value)

    return check


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """The end of an "unknown setting" message: the closest known key, else the list of them."""
    names = list(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; known settings: {', '.join(names)}"
