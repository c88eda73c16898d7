"""find_files: the workspace's files whose path matches a glob (read-only; SPEC §8).

Why a tool: finding files by name otherwise takes a shell command, and with it the operator's approval. It lists through
`workspace_files.list_files`, the same list `@path` completion uses: `.gitignore` respected (git's own list in a git
work tree), symbolic links listed but never followed (a link loop costs nothing), special files left out, names that are
not UTF-8 shown with U+FFFD, and the whole list bounded by a count and a time budget. The glob is matched against each
file's path relative to the workspace root: `*` and `?` stay inside one directory, `**` crosses any number of them,
`[abc]` and `{py,md}` as in shells; a pattern without `/` matches the file name at any depth. A pattern that could only
name something outside the workspace (absolute, or with a `..` part) is refused (BAD_ARGUMENTS); `path` narrows the
search to a directory inside the workspace (confined like every file tool's path). The body runs in a worker thread
that a cancelled call abandons (it ends within its time budget), so the event loop never waits on it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .base import BadArguments, Tool, ToolContext, ToolFailure, truncate_output
from .regular_files import in_thread
from .workspace import PATH_NOTE, MissingPath, locate, optional_str, printable, require_str, workspace_root
from .workspace_files import list_files

MAX_SHOWN = 500  # paths shown; the rest are counted
MAX_LISTED = 100_000  # files looked at (workspace_files' bound)
TIME_BUDGET = 5.0  # seconds for the listing


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression a workspace-relative path must match whole (see the module docstring)."""
    if "\x00" in pattern:
        raise BadArguments("pattern must not contain NUL characters")
    if pattern.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", pattern):
        raise BadArguments(f"pattern {printable(pattern)!r} is absolute: give it relative to the workspace root "
                           "(use `path` to search a subdirectory)")
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if ".." in pattern.split("/"):
        raise BadArguments(f"pattern {printable(pattern)!r} leaves the workspace ('..'): only files inside it are "
                           "listed")
    if not pattern.strip("/"):
        raise BadArguments("pattern must name files, e.g. '*.py' or 'src/**/test_*.py'")
    if pattern.endswith("/"):
        pattern += "**"  # a directory: everything below it
    if "/" not in pattern:
        pattern = "**/" + pattern
    return re.compile(_translate(pattern) + r"\Z")


def _translate(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        at_start = i == 0 or pattern[i - 1] == "/"
        if pattern.startswith("**/", i) and at_start:
            out.append("(?:[^/]*/)*")  # any number of directories, none included
            i += 3
        elif pattern.startswith("**", i) and at_start and i + 2 == n:
            out.append(".*")  # everything below
            i += 2
        elif c == "*":
            while i + 1 < n and pattern[i + 1] == "*":
                i += 1
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append(("[^/" if negate else "[") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "{" and (end := pattern.find("}", i)) > 0 and "{" not in pattern[i + 1:end]:
            out.append("(?:" + "|".join(_translate(part) for part in pattern[i + 1:end].split(",")) + ")")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _find_files(args: dict[str, Any], workspace: Path) -> str:
    pattern = require_str(args, "pattern")
    path = optional_str(args, "path", ".")
    matcher = glob_regex(pattern)
    root = workspace_root(workspace)
    try:
        with locate(workspace, path) as found:
            if found.name is not None and found.st is None:
                raise ToolFailure(f"no such directory: {found.shown}")
            if not found.is_dir:
                raise ToolFailure(f"not a directory: {found.shown} (find_files searches a directory)")
            parts, shown = found.parts, found.shown
            held = os.fstat(found.dir_fd) if found.name is None else os.stat(found.name, dir_fd=found.dir_fd,
                                                                            follow_symlinks=False)
    except MissingPath as missing:
        raise ToolFailure(f"no such directory: {missing.shown}") from None
    directory = root.joinpath(*parts)
    listing = list_files(directory, max_files=MAX_LISTED, time_budget=TIME_BUDGET)
    now = os.stat(directory, follow_symlinks=False)
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):  # swapped for something else while it was listed
        raise ToolFailure(f"{shown} changed while it was listed; try again")
    prefix = "/".join(printable(p) for p in parts)
    matches = [rel for rel in ((f"{prefix}/{p}" if prefix else p) for p in listing.paths) if matcher.match(rel)]
    lines = matches[:MAX_SHOWN]
    if len(matches) > MAX_SHOWN:
        lines.append(f"… and {len(matches) - MAX_SHOWN:,} more (narrow the pattern or the path)")
    if not matches:
        lines.append(f"no files match {printable(pattern)!r} in {shown}")
    if listing.truncated:
        lines.append(f"[the listing stopped early ({listing.reason}): files past it were not looked at; narrow the "
                     "path]")
    return truncate_output("\n".join(lines))


async def find_files(args: dict[str, Any], ctx: ToolContext) -> str:
    return await in_thread(_find_files, args, ctx.workspace, abandon_on_cancel=True)


FIND_FILES = Tool(
    name="find_files",
    description=(
        "Find files in the workspace whose path matches a glob. The glob is matched against the path relative to the "
        "workspace root: '*' and '?' stay within one directory, '**' matches any number of directories, [abc] and "
        "{py,md} work as in shells. A pattern without '/' matches the file name at any depth ('*.py' finds every "
        "Python file). Respects .gitignore; symbolic links are listed, not followed. Prints one path per line, at most "
        f"{MAX_SHOWN}, sorted."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob, e.g. '*.py', 'src/**/test_*.py', 'docs/*.{md,rst}'."},
            "path": {"type": "string", "description": f"Directory to search in, {PATH_NOTE}. Default '.'."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    safety="read_only",
    body=find_files,
)
