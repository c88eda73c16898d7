"""Making an event storable before it is appended (SPEC rev 2 §2 "Writer = reader", §5 secrets).

Text from outside (model output, tool output, prompts, file names) may hold lone surrogates, which UTF-8 cannot encode:
they become U+FFFD, never a crash and never a lost prompt. Configured secret values (an API key, credentials in a base
URL) become `***` wherever they appear, so a tool that prints the key or a server that echoes it stores nothing secret.
Both rewrite the event in place, so the log, the in-memory session and every listener see the same text.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import msgspec

_SURROGATE = re.compile("[\ud800-\udfff]")
REDACTED = "***"
MIN_SECRET_CHARS = 4  # shorter values would blank out ordinary words


def clean_text(text: str, secrets: Iterable[str] = ()) -> str:
    text = _SURROGATE.sub("\ufffd", text)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _clean(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return clean_text(value, secrets)
    if isinstance(value, list):
        return [_clean(v, secrets) for v in value]
    if isinstance(value, dict):
        return {_clean(k, secrets) if isinstance(k, str) else k: _clean(v, secrets) for k, v in value.items()}
    if isinstance(value, msgspec.Struct):
        clean_struct(value, secrets)
    return value


def clean_struct(struct: msgspec.Struct, secrets: tuple[str, ...] = ()) -> None:
    """Rewrite every text inside `struct` (nested structs, lists and dicts included) in place."""
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        cleaned = _clean(value, secrets)
        if cleaned is not value:
            setattr(struct, name, cleaned)
