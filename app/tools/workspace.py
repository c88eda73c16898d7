"""Workspace confinement and argument checks shared by the built-in tools.

SPEC §8: a path that resolves outside the workspace is refused with BAD_ARGUMENTS. Checking a resolved path and then
using it by name leaves a race (a directory swapped for a symlink in between sends the write elsewhere), so the file
tools never use a checked path by name. `locate` walks the path one component at a time from an open descriptor of the
workspace root, opening each directory with `O_NOFOLLOW | O_DIRECTORY` relative to the previous one: a directory we hold
open cannot become a symlink, so nothing reached through it can be outside the workspace.

Symlinks inside the workspace are followed, resolved the same safe way: their target is read (`readlinkat`) and walked
component by component from where the link sits (or from the root, for an absolute target under the workspace), so a
link that points inside works as users expect and one that points outside — directly, through `..`, or through another
link — is refused with BAD_ARGUMENTS. A final component is resolved but not opened; callers open it relative to the
returned directory descriptor with `O_NOFOLLOW`, so a link swapped in at the last moment fails instead of being
followed.

What this does not cover: a directory already inside the workspace being *renamed* out of it while a tool holds it open,
and `run_command`, which runs an arbitrary shell anyway. It keeps the model's file tools where the user expects them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .base import BadArguments, ToolFailure

MAX_SYMLINKS = 40  # the kernel's own limit for one path resolution
MAX_RETRIES = 40  # how often one walk restarts a component that changed under it before giving up
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# how every file tool's schema describes a path argument
PATH_NOTE = "relative to the workspace root (absolute paths are allowed only inside the workspace)"

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD.

    File names are bytes; Python decodes the ones that are not UTF-8 with `surrogateescape`, which leaves lone
    surrogates that cannot be encoded again (the session log, the terminal and the provider would all fail on them)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def workspace_root(workspace: Path) -> Path:
    """The workspace as a real path (ToolContext promises it resolved, but a symlinked tmp dir is cheap to be sure of)."""
    return Path(os.path.realpath(workspace))


def _outside(path: str, root: Path) -> BadArguments:
    return BadArguments(f"path {printable(path)!r} is outside the workspace ({root}); only paths inside it are allowed")


def _below(path: str, bases: tuple[str, ...]) -> list[str] | None:
    """The components of absolute `path` below one of `bases` (lexically, `..` left for the walk), or None."""
    for base in bases:
        if path == base:
            return []
        if path.startswith(base.rstrip("/") + "/"):
            return path[len(base.rstrip("/")) + 1:].split("/")
    return None


@dataclass
class Located:
    """Where a path lives: an open descriptor of its real parent directory and its last component's name there.

    `name` is None when the path is the workspace root itself. `st` is the last component's lstat (None if it does not
    exist) — advisory only: open it relative to `dir_fd` with O_NOFOLLOW and fstat that descriptor before trusting it.
    """

    dir_fd: int
    name: str | None
    parts: tuple[str, ...]  # the real path, relative to the workspace root
    st: os.stat_result | None

    @property
    def shown(self) -> str:
        """How the path is shown back to the model: relative to the workspace, POSIX-style, "." for the root."""
        return printable("/".join(self.parts)) if self.parts else "."

    @property
    def is_dir(self) -> bool:
        return self.name is None or (self.st is not None and stat.S_ISDIR(self.st.st_mode))


class MissingPath(ToolFailure):
    """A directory on the way to the path does not exist. `parts` is the path as it would be (real prefix, then the
    rest taken lexically); `shown` is its display form."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        self.parts = parts
        self.shown = printable("/".join(parts)) if parts else "."
        super().__init__(f"no such file or directory: {self.shown}")


def _components(workspace: Path, root: Path, path: Any) -> list[str]:
    if not isinstance(path, str) or not path.strip():
        raise BadArguments("path must be a non-empty string")
    if "\x00" in path:
        raise BadArguments("path must not contain NUL characters")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise BadArguments("path contains characters that cannot be part of a file name") from None
    if not os.path.isabs(path):
        return path.split("/")
    below = _below(path, (str(root), os.path.abspath(workspace)))
    if below is None:
        raise _outside(path, root)
    return below


def _readlink(name: str, dir_fd: int) -> str | None:
    """The target of symlink `name`, or None if it is not (or no longer) a symlink."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


@contextmanager
def locate(workspace: Path, path: str, *, make_parents: bool = False) -> Iterator[Located]:
    """Resolve `path` (relative to the workspace, or absolute inside it) without ever following a symlink by name.

    Yields a `Located` whose `dir_fd` stays open for the `with` block. Raises BadArguments for a path outside the
    workspace, MissingPath when a directory on the way is missing (unless `make_parents`, which creates it), and
    ToolFailure when a component on the way is not a directory or the path keeps changing while it is walked.
    """
    root = workspace_root(workspace)
    pending = deque(_components(workspace, root, path))
    root_fd = os.open(root, DIR_FLAGS)
    stack: list[tuple[str, int]] = []  # the directories opened below the root, in order

    def here() -> int:
        return stack[-1][1] if stack else root_fd

    def reset_to_root() -> None:
        while stack:
            os.close(stack.pop()[1])

    links = retries = 0
    try:
        while True:
            while pending and pending[0] in ("", "."):
                pending.popleft()
            if not pending:
                if not stack:
                    yield Located(root_fd, None, (), None)
                    return
                # The path ends in a directory we hold: hand back its parent and its name, like any other last part.
                name, fd = stack.pop()
                os.close(fd)
                pending.append(name)
                continue
            name = pending.popleft()
            if name == "..":
                if not stack:
                    raise _outside(path, root)
                os.close(stack.pop()[1])
                continue
            while pending and pending[0] in ("", "."):
                pending.popleft()
            last = not pending
            target: str | None = None
            if last:
                try:
                    st: os.stat_result | None = os.stat(name, dir_fd=here(), follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is None or not stat.S_ISLNK(st.st_mode):
                    yield Located(here(), name, tuple(n for n, _ in stack) + (name,), st)
                    return
                target = _readlink(name, here())
            else:
                try:
                    fd = os.open(name, DIR_FLAGS, dir_fd=here())
                except FileNotFoundError:
                    if not make_parents:
                        raise MissingPath(_lexical(tuple(n for n, _ in stack) + (name,), pending, path, root)) from None
                    try:
                        os.mkdir(name, dir_fd=here())
                        with contextlib.suppress(OSError):  # the new name survives a power cut (SPEC §12)
                            os.fsync(here())
                    except FileExistsError:
                        pass
                    retries += 1
                    if retries > MAX_RETRIES:
                        raise ToolFailure(f"path {printable(path)!r} kept changing while it was opened; try again")
                    pending.appendleft(name)
                    continue
                except NotADirectoryError:  # a symlink (O_NOFOLLOW), a file, a FIFO…
                    target = _readlink(name, here())
                    if target is None:
                        shown = printable("/".join([n for n, _ in stack] + [name]))
                        raise ToolFailure(f"{shown} is not a directory") from None
                else:
                    stack.append((name, fd))
                    continue
            if target is None:  # it stopped being a symlink between two calls: look again
                retries += 1
                if retries > MAX_RETRIES:
                    raise ToolFailure(f"path {printable(path)!r} kept changing while it was opened; try again")
                pending.appendleft(name)
                continue
            links += 1
            if links > MAX_SYMLINKS:
                raise ToolFailure(f"path {printable(path)!r}: too many levels of symbolic links")
            if os.path.isabs(target):
                below = _below(target, (str(root),))
                if below is None:
                    raise _outside(path, root)
                reset_to_root()
                pending.extendleft(reversed(below))
            else:
                pending.extendleft(reversed(target.split("/")))
    finally:
        reset_to_root()
        os.close(root_fd)


def _lexical(prefix: tuple[str, ...], rest: deque[str], path: str, root: Path) -> tuple[str, ...]:
    """`prefix` followed by `rest` with `.` and `..` applied as text (what a missing path would be once created)."""
    parts = list(prefix)
    for name in rest:
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise _outside(path, root)
            parts.pop()
        else:
            parts.append(name)
    return tuple(parts)


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """Resolve `path` to a real path inside the workspace, or raise BadArguments (the same walk as `locate`).

    The result need not exist; whatever part of it does exist has had its symlinks followed. Only for showing and
    comparing paths: file tools use `locate` and its descriptor, never this name.
    """
    root = workspace_root(workspace)
    try:
        with locate(workspace, path) as found:
            return root.joinpath(*found.parts)
    except MissingPath as missing:
        return root.joinpath(*missing.parts)


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
