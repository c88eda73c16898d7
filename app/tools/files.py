"""File tools: list_dir, read_file and search_text (read-only); write_file and edit_file are in `file_writes`.

SPEC §8, and why each part is built as it is:
- Every path goes through `workspace.locate`, which walks it from the workspace root without following a symlink by
  name, and every file is then opened relative to the directory descriptor it returns with `O_NOFOLLOW`. So nothing
  outside the workspace is read or written, even when a directory is swapped for a symlink mid-call.
- Only regular files are read or written (`regular_files`): a FIFO, socket or device is refused from its lstat, and
  what is opened is opened `O_NONBLOCK` and fstat'd before a byte is read, so no tool ever waits on a pipe.
- File names are shown with U+FFFD where they are not UTF-8 (`printable`), never passed on as lone surrogates.
- search_text uses the `regex` package with one time budget for the whole search (SEARCH_TIME_BUDGET), releasing the GIL
  while it matches, so a catastrophic pattern ends as TOOL_ERROR in seconds and never stalls the event loop.
- The bodies are plain blocking code run in a worker thread, so a large read or search never stalls the event loop (and
  with it the UI and the write-behind flusher); every wait in them is bounded.
"""

from __future__ import annotations

import codecs
import fnmatch
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import regex

from .base import OUTPUT_LIMIT, Tool, ToolContext, ToolFailure, truncate_output
from .regular_files import BINARY_SNIFF_BYTES, FILE_FLAGS, in_thread, kind_of, looks_binary, open_regular
from .workspace import (
    DIR_FLAGS,
    PATH_NOTE,
    Located,
    MissingPath,
    locate,
    optional_bool,
    optional_int,
    optional_str,
    printable,
    require_str,
)

MAX_DIR_ENTRIES = 1000
MAX_MATCHES = 200
MAX_MATCH_LINE_CHARS = 300
MAX_SEARCH_FILE_BYTES = 10 * 1024 * 1024  # larger files are skipped by search_text (and counted in its summary)
SEARCH_TIME_BUDGET = 5.0  # seconds of the whole search_text call, regex matching included
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox"})


# --- list_dir ---------------------------------------------------------------------------------------------------------


def _describe(entry: os.DirEntry[str]) -> tuple[bool, str]:
    """(is a directory, the line shown for it). Symlinks are described by what they point at, and marked."""
    name = printable(entry.name)
    link = " (symlink)" if entry.is_symlink() else ""
    try:
        st = entry.stat()
    except OSError:  # a broken symlink, or an entry removed while listing
        return False, f"{name}  (unreadable{', broken symlink' if link else ''})"
    if stat.S_ISDIR(st.st_mode):
        return True, f"{name}/{link}"
    if stat.S_ISREG(st.st_mode):
        return False, f"{name}  {st.st_size} bytes{link}"
    return False, f"{name}  ({kind_of(st.st_mode)}){link}"


def _list_dir(args: dict[str, Any], workspace: Path) -> str:
    path = optional_str(args, "path", ".")
    try:
        with locate(workspace, path) as found:
            shown = found.shown
            if found.name is not None and found.st is None:
                raise ToolFailure(f"no such directory: {shown}")
            if not found.is_dir:
                raise ToolFailure(f"{shown} is a file, not a directory (use read_file to read it)")
            try:
                fd = os.open(found.name or ".", DIR_FLAGS, dir_fd=found.dir_fd)
            except NotADirectoryError:
                raise ToolFailure(f"{shown} stopped being a directory while it was opened; try again") from None
    except MissingPath as missing:
        raise ToolFailure(f"no such directory: {missing.shown}") from None
    try:
        dirs: list[str] = []
        files: list[str] = []
        with os.scandir(fd) as it:
            for entry in it:
                is_dir, line = _describe(entry)
                (dirs if is_dir else files).append(line)
    finally:
        os.close(fd)
    entries = sorted(dirs) + sorted(files, key=lambda line: line.split("  ", 1)[0])
    if not entries:
        return f"{shown}: (empty directory)"
    lines = entries[:MAX_DIR_ENTRIES]
    if len(entries) > MAX_DIR_ENTRIES:
        lines.append(f"[{len(entries) - MAX_DIR_ENTRIES} more entries not shown]")
    return truncate_output("\n".join(lines))


async def list_dir(args: dict[str, Any], ctx: ToolContext) -> str:
    return await in_thread(_list_dir, args, ctx.workspace, abandon_on_cancel=True)


# --- read_file --------------------------------------------------------------------------------------------------------


def _read_file(args: dict[str, Any], workspace: Path) -> str:
    """Stream lines from `offset`, stopping at `limit` lines or OUTPUT_LIMIT characters, so memory stays bounded."""
    path = require_str(args, "path")
    offset = optional_int(args, "offset", 1, minimum=1)
    limit = optional_int(args, "limit", None, minimum=1)
    assert offset is not None
    try:
        with locate(workspace, path) as found:
            shown = found.shown
            if found.is_dir:
                raise ToolFailure(f"{shown} is a directory (use list_dir to list it)")
            if found.st is None:
                raise ToolFailure(f"no such file: {shown}")
            fd, st = open_regular(found)
    except MissingPath as missing:
        raise ToolFailure(f"no such file: {missing.shown}") from None
    size = st.st_size
    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces: list[str] = []
    chars = 0
    line = 0  # the number of the line the last piece read belongs to
    at_line_start = True
    stop: str | None = None  # why reading stopped early: "limit" or "size"
    with os.fdopen(fd, "rb") as f:
        if looks_binary(f.read(BINARY_SNIFF_BYTES)):
            raise ToolFailure(f"{shown} looks like a binary file ({size} bytes); it is not shown")
        f.seek(0)
        while True:
            raw = f.readline(OUTPUT_LIMIT + 1)  # bounded even for a file that is one enormous line
            if not raw:
                try:
                    decoder.decode(b"", final=True)
                except UnicodeDecodeError:
                    raise ToolFailure(f"{shown} is not valid UTF-8 text ({size} bytes); it is not shown") from None
                break
            if at_line_start:
                line += 1
            at_line_start = raw.endswith(b"\n")
            if limit is not None and line >= offset + limit:
                stop = "limit"
                break
            try:
                text = decoder.decode(raw)
            except UnicodeDecodeError:
                raise ToolFailure(f"{shown} is not valid UTF-8 text ({size} bytes); it is not shown") from None
            if line >= offset:
                pieces.append(text)
                chars += len(text)
                if chars > OUTPUT_LIMIT:
                    stop = "size"
                    break
    content = "".join(pieces)
    if stop == "size":
        if line == offset:  # one line longer than the limit: pointing at the same offset again would not help
            notice = f"[output truncated: line {line} alone is longer than {OUTPUT_LIMIT} characters; {shown} is {size} bytes]"
        else:
            notice = f"[output truncated at line {line}: {shown} is {size} bytes; call read_file with offset={line} to read on]"
        return content[:OUTPUT_LIMIT] + "\n" + notice
    if stop == "limit":
        return content + f"\n[more lines follow; call read_file with offset={line} to read on]"
    if not content:
        if size == 0:
            return f"({shown} is empty)"
        if offset > 1:
            return f"(no lines at offset {offset}: {shown} has {line} lines)"
    return content


async def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await in_thread(_read_file, args, ctx.workspace, abandon_on_cancel=True)


# --- search_text ------------------------------------------------------------------------------------------------------


class _OverBudget(Exception):
    pass


def _compile(pattern: str, ignore_case: bool) -> tuple[regex.Pattern[str], bool]:
    """A regex if `pattern` is one, else the pattern as literal text. Returns (compiled, fell_back_to_literal)."""
    import regex  # (here, not at the top: only a search needs it, and every start-up would pay ~10 ms for it)

    flags = regex.IGNORECASE if ignore_case else 0
    try:
        return regex.compile(pattern, flags), False
    except regex.error:
        return regex.compile(regex.escape(pattern), flags), True


def _search_targets(found: Located, glob: str | None):
    """Yield (shown path, fd) for each regular file to search, in a stable order.

    The walk (`os.fwalk`, descriptor-relative) skips tool/vendor directories and never follows a symlink, to a directory
    or a file, just as ripgrep does by default; a linked file inside the workspace is searched where it really lives.
    Non-regular files are skipped from their lstat, before any open. Each fd is closed by the caller.
    """
    if not found.is_dir:
        fd, _ = open_regular(found)
        yield found.shown, fd
        return
    top = found.name or "."
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(top, dir_fd=found.dir_fd):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        below = os.path.relpath(dirpath, top)
        prefix = found.parts + (() if below == "." else tuple(below.split(os.sep)))
        for name in sorted(filenames):
            if glob and not fnmatch.fnmatch(name, glob):
                continue
            try:
                if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    continue
                fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
            except OSError:  # gone, or swapped for a symlink since the lstat
                continue
            yield printable("/".join(prefix + (name,))), fd


def _search_text(args: dict[str, Any], workspace: Path) -> str:
    pattern = require_str(args, "pattern")
    path = optional_str(args, "path", ".")
    glob = optional_str(args, "glob", "") or None
    ignore_case = optional_bool(args, "ignore_case", False)
    compiled, literal = _compile(pattern, ignore_case)
    budget = SEARCH_TIME_BUDGET
    deadline = time.monotonic() + budget
    matches: list[str] = []
    more = 0
    skipped = 0
    try:
        with locate(workspace, path) as found:
            shown = found.shown
            if found.name is not None and found.st is None:
                raise ToolFailure(f"no such file or directory: {shown}")
            for rel, fd in _search_targets(found, glob):
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SEARCH_FILE_BYTES:
                        skipped += stat.S_ISREG(st.st_mode)
                        continue
                    try:
                        data = f.read()
                    except OSError:
                        skipped += 1
                        continue
                if looks_binary(data[:BINARY_SNIFF_BYTES]):
                    continue
                for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise _OverBudget
                    if compiled.search(text, timeout=remaining, concurrent=True):
                        if len(matches) >= MAX_MATCHES:
                            more += 1
                            continue
                        if len(text) > MAX_MATCH_LINE_CHARS:
                            text = text[:MAX_MATCH_LINE_CHARS] + "…"
                        matches.append(f"{rel}:{number}: {text}")
    except MissingPath as missing:
        raise ToolFailure(f"no such file or directory: {missing.shown}") from None
    except (_OverBudget, TimeoutError):
        raise ToolFailure(
            f"search_text stopped: it ran out of its {budget:g} s time budget after {len(matches) + more} matching "
            "lines. The pattern may backtrack catastrophically (nested repetition such as (a|a)+ or (a+)+); simplify "
            "it, or narrow the path or glob"
        ) from None
    notes = []
    if literal:
        notes.append("[pattern is not a valid regular expression; it was searched as literal text]")
    if more:
        notes.append(f"[{more} more matches not shown; narrow the pattern, path or glob]")
    if skipped:
        notes.append(f"[{skipped} files skipped: larger than {MAX_SEARCH_FILE_BYTES // (1024 * 1024)} MiB or unreadable]")
    if not matches:
        notes.insert(0, f"no matches for {pattern!r} in {shown}")
    return truncate_output("\n".join(matches + notes))


async def search_text(args: dict[str, Any], ctx: ToolContext) -> str:
    return await in_thread(_search_text, args, ctx.workspace, abandon_on_cancel=True)


# --- tool definitions -------------------------------------------------------------------------------------------------

LIST_DIR = Tool(
    name="list_dir",
    description=(
        "List a directory in the workspace. Directories come first and end with '/'; files show their size in bytes."
    ),
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string", "description": f"Directory to list, {PATH_NOTE}. Default '.'."}},
        "additionalProperties": False,
    },
    safety="read_only",
    body=list_dir,
)

READ_FILE = Tool(
    name="read_file",
    description=(
        "Read a UTF-8 text file from the workspace, exactly as stored. Long files are cut off with a notice saying which "
        "offset to continue from; use offset/limit to read a range of lines. Binary files are refused."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": f"File to read, {PATH_NOTE}."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based). Default 1."},
            "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    safety="read_only",
    body=read_file,
)

SEARCH_TEXT = Tool(
    name="search_text",
    description=(
        "Search text files in the workspace for a Python regular expression (an invalid regex is searched as literal "
        f"text). Prints 'path:line: text' for each matching line, at most {MAX_MATCHES}. Skips binary files, "
        "symlinks met while walking, and directories such as .git, .venv and node_modules. The whole search has a "
        f"{SEARCH_TIME_BUDGET:g} s time budget; a pattern that backtracks for longer fails with an error."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Python syntax) matched against each line."},
            "path": {"type": "string", "description": f"Directory or file to search, {PATH_NOTE}. Default '.'."},
            "glob": {"type": "string", "description": "Only search files whose name matches this glob, e.g. '*.py'."},
            "ignore_case": {"type": "boolean", "description": "Match case-insensitively. Default false."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    safety="read_only",
    body=search_text,
)
