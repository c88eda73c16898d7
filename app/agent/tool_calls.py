"""The model's tool calls as the log keeps them: arguments parsed (or cut when too large), ids made unique (SPEC §2,
§5 rev 3). Both happen once, when the answer is recorded; what the model wrote runs, what the log stores is the same
or, for oversized arguments, a short stand-in that says what was cut."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable

from ..providers.base import MAX_JSON_NESTING, NestedTooDeeply, parse_json

MAX_ARGUMENT_BYTES = 1_000_000  # SPEC §5 rev 3: larger arguments are not run, and stored cut
CUT_ARGUMENTS = "cairn_cut"  # the one key of arguments stored cut: {"cairn_cut": {"bytes", "sha256", "head"}}


def parse_arguments(raw: str) -> Any:
    """The parsed JSON object, or the raw string when the model sent something that is not valid JSON. Arguments
    over MAX_ARGUMENT_BYTES become `{"cairn_cut": {…}}` (their size, sha256 and first characters): the call is refused
    as BAD_ARGUMENTS, and the log does not carry megabytes twice per step."""
    if len(raw) * 4 > MAX_ARGUMENT_BYTES:  # (cheap bound first: a character is at most 4 bytes)
        data = raw.encode("utf-8", "surrogatepass")
        if len(data) > MAX_ARGUMENT_BYTES:
            digest = hashlib.sha256(data).hexdigest()
            return {CUT_ARGUMENTS: {"bytes": len(data), "sha256": digest, "head": raw[:500]}}
    if not raw.strip():
        return {}
    try:
        value = parse_json(raw)  # (nested over MAX_JSON_NESTING, or past Python's parser, is invalid too)
    except ValueError:
        return raw
    if _has_non_finite(value):
        return raw  # NaN/Infinity are not JSON; keep exactly what the model sent
    return value


def bad_arguments(arguments: Any) -> str | None:
    """What the model is told about arguments that cannot run (not a JSON object, or cut), or None when they can."""
    if isinstance(arguments, dict):
        if CUT_ARGUMENTS not in arguments:
            return None
        size = arguments[CUT_ARGUMENTS].get("bytes", 0)
        return (f"The arguments are {size:,} bytes, over the {MAX_ARGUMENT_BYTES:,}-byte limit; the call did not run. "
                "Send smaller arguments (for a large file, write it in parts).")
    what = "not valid JSON" if isinstance(arguments, str) else "not a JSON object"
    if isinstance(arguments, str) and _too_deep(arguments):
        what = f"nested more than {MAX_JSON_NESTING} levels deep"
    return f"The arguments are {what}; send a JSON object."


def _too_deep(raw: str) -> bool:
    """Whether arguments that did not parse failed for their nesting alone (for the message to the model)."""
    try:
        parse_json(raw)
    except NestedTooDeeply:
        return True
    except ValueError:
        return False
    return False


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


class CallIds:
    """Every top-level call id the session has used: a provider that repeats one (some servers and local models do),
    or sends none, gets a deterministic variant, so the log, the model and repair agree on which call is which."""

    def __init__(self, used: Iterable[str]) -> None:
        self._used = set(used)

    def unique(self, call_id: Any, turn: int, step: int, position: int) -> str:
        base = call_id if isinstance(call_id, str) and call_id else f"call_{turn}_{step}_{position}"
        unique, n = base, 1
        while unique in self._used:
            unique = f"{base}-dup" if n == 1 else f"{base}-dup#{n}"
            n += 1
        self._used.add(unique)
        return unique
