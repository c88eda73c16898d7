"""Workspace confinement and argument checks shared by the built-in tools.

Every path a model names is resolved here, once, before a tool touches the file system: SPEC §8 says a path that resolves
outside the workspace is refused with BAD_ARGUMENTS. Resolution follows symlinks (realpath), so a link inside the
workspace that points out is refused too, and so is a not-yet-existing path below such a link.

This is a check, not a sandbox: a link swapped in between the check and the use (TOCTOU) is not defended against, and
`run_command` runs an arbitrary shell anyway. It keeps an honest model's file tools where the user expects them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .base import BadArguments


def workspace_root(workspace: Path) -> Path:
    """The workspace as a real path (ToolContext promises it resolved, but a symlinked tmp dir is cheap to be sure of)."""
    return Path(os.path.realpath(workspace))


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """Resolve `path` (relative to the workspace, or absolute) to a real path inside the workspace, or raise BadArguments.

    The result need not exist; whatever part of it does exist has had its symlinks followed.
    """
    if not isinstance(path, str) or not path.strip():
        raise BadArguments("path must be a non-empty string")
    if "\x00" in path:
        raise BadArguments("path must not contain NUL characters")
    root = workspace_root(workspace)
    resolved = Path(os.path.realpath(root / path))  # an absolute `path` replaces root here, as intended
    if resolved != root and not resolved.is_relative_to(root):
        raise BadArguments(f"path {path!r} is outside the workspace ({root}); only paths inside it are allowed")
    return resolved


def display_path(workspace: Path, resolved: Path) -> str:
    """How a resolved path is shown back to the model: relative to the workspace, POSIX-style, "." for the root."""
    rel = resolved.relative_to(workspace_root(workspace))
    return rel.as_posix() if rel.parts else "."


def _check_args(args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise BadArguments("arguments must be a JSON object")
    return args


def require_str(args: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    """A required string argument. Empty strings are refused unless `allow_empty` (file content may be empty)."""
    value = _check_args(args).get(name)
    if value is None:
        raise BadArguments(f"missing required argument {name!r} (a string)")
    if not isinstance(value, str):
        raise BadArguments(f"argument {name!r} must be a string, not {type(value).__name__}")
    if not allow_empty and value == "":
        raise BadArguments(f"argument {name!r} must not be empty")
    return value


def optional_str(args: dict[str, Any], name: str, default: str) -> str:
    """An optional string argument; null or absent means `default`."""
    if _check_args(args).get(name) is None:
        return default
    return require_str(args, name)


def optional_int(
    args: dict[str, Any], name: str, default: int | None, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """An optional integer argument, range-checked. Integral floats (3.0) are accepted, booleans are not."""
    value = _check_args(args).get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArguments(f"argument {name!r} must be an integer")
    if minimum is not None and value < minimum:
        raise BadArguments(f"argument {name!r} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise BadArguments(f"argument {name!r} must be at most {maximum}, got {value}")
    return value


def optional_number(
    args: dict[str, Any], name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    """An optional number argument (int or float), range-checked; booleans are refused."""
    value = _check_args(args).get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadArguments(f"argument {name!r} must be a number")
    if value != value:  # NaN
        raise BadArguments(f"argument {name!r} must be a number")
    if minimum is not None and value < minimum:
        raise BadArguments(f"argument {name!r} must be at least {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise BadArguments(f"argument {name!r} must be at most {maximum:g}, got {value:g}")
    return float(value)


def optional_bool(args: dict[str, Any], name: str, default: bool) -> bool:
    value = _check_args(args).get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadArguments(f"argument {name!r} must be true or false")
    return value
