"""File tools: list_dir, read_file, search_text (read-only), write_file (idempotent) and edit_file (side-effecting).

All paths go through `resolve_in_workspace`, so nothing outside the workspace is read or written (SPEC §8). The bodies are
plain blocking code run in a worker thread, so a large read or search never stalls the event loop (and with it the UI and
the write-behind flusher). Writes are atomic (temp file in the same directory, fsync, os.replace): a crash leaves either
the old file or the new one, never half of each — the property that lets repair call write_file safely retryable.
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Callable

import anyio.to_thread

from .base import OUTPUT_LIMIT, BadArguments, Tool, ToolContext, ToolFailure, truncate_output
from .workspace import (
    display_path,
    optional_bool,
    optional_int,
    optional_str,
    require_str,
    resolve_in_workspace,
    workspace_root,
)

BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a file as binary (the heuristic git and grep use)
MAX_DIR_ENTRIES = 1000
MAX_MATCHES = 200
MAX_MATCH_LINE_CHARS = 300
MAX_SEARCH_FILE_BYTES = 10 * 1024 * 1024  # larger files are skipped by search_text (and counted in its summary)
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox"})


async def _in_thread(func: Callable[..., str], *args: Any, abandon_on_cancel: bool = False) -> str:
    """Run a blocking body in a worker thread, turning OS errors into a ToolFailure the model can read.

    Writers keep the default (cancellation waits for the thread), so a cancelled write has either happened or not by the
    time the loop records the outcome. Readers may be abandoned: nothing depends on them finishing.
    """
    try:
        return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=abandon_on_cancel)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ToolFailure(f"{exc.strerror or exc}{where}") from exc


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


# --- list_dir ---------------------------------------------------------------------------------------------------------


def _list_dir(args: dict[str, Any], workspace: Path) -> str:
    path = optional_str(args, "path", ".")
    target = resolve_in_workspace(workspace, path)
    shown = display_path(workspace, target)
    if not target.exists():
        raise ToolFailure(f"no such directory: {shown}")
    if not target.is_dir():
        raise ToolFailure(f"{shown} is a file, not a directory (use read_file to read it)")
    dirs: list[str] = []
    files: list[str] = []
    with os.scandir(target) as it:
        for entry in it:
            link = " (symlink)" if entry.is_symlink() else ""
            try:
                if entry.is_dir():
                    dirs.append(f"{entry.name}/{link}")
                else:
                    files.append(f"{entry.name}  {entry.stat().st_size} bytes{link}")
            except OSError:  # a broken symlink, or an entry removed while listing
                files.append(f"{entry.name}  (unreadable{', broken symlink' if link else ''})")
    entries = sorted(dirs) + sorted(files, key=lambda line: line.split("  ", 1)[0])
    if not entries:
        return f"{shown}: (empty directory)"
    lines = entries[:MAX_DIR_ENTRIES]
    if len(entries) > MAX_DIR_ENTRIES:
        lines.append(f"[{len(entries) - MAX_DIR_ENTRIES} more entries not shown]")
    return truncate_output("\n".join(lines))


async def list_dir(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_list_dir, args, ctx.workspace, abandon_on_cancel=True)


# --- read_file --------------------------------------------------------------------------------------------------------


def _read_file(args: dict[str, Any], workspace: Path) -> str:
    """Stream lines from `offset`, stopping at `limit` lines or OUTPUT_LIMIT characters, so memory stays bounded."""
    path = require_str(args, "path")
    offset = optional_int(args, "offset", 1, minimum=1)
    limit = optional_int(args, "limit", None, minimum=1)
    assert offset is not None
    target = resolve_in_workspace(workspace, path)
    shown = display_path(workspace, target)
    if not target.exists():
        raise ToolFailure(f"no such file: {shown}")
    if target.is_dir():
        raise ToolFailure(f"{shown} is a directory (use list_dir to list it)")
    size = target.stat().st_size
    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces: list[str] = []
    chars = 0
    line = 0  # the number of the line the last piece read belongs to
    at_line_start = True
    stop: str | None = None  # why reading stopped early: "limit" or "size"
    with open(target, "rb") as f:
        if _is_binary(f.read(BINARY_SNIFF_BYTES)):
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
    return await _in_thread(_read_file, args, ctx.workspace, abandon_on_cancel=True)


# --- search_text ------------------------------------------------------------------------------------------------------


def _compile(pattern: str, ignore_case: bool) -> tuple[re.Pattern[str], bool]:
    """A regex if `pattern` is one, else the pattern as literal text. Returns (compiled, fell_back_to_literal)."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        return re.compile(pattern, flags), False
    except re.error:
        return re.compile(re.escape(pattern), flags), True


def _search_files(start: Path, root: Path, glob: str | None):
    """Yield the files to search below `start`, in a stable order, skipping tool/vendor directories and anything whose
    real path leaves the workspace (a symlinked file pointing out)."""
    if start.is_file():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start):  # does not follow symlinked directories
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if glob and not fnmatch.fnmatch(name, glob):
                continue
            path = Path(dirpath) / name
            real = Path(os.path.realpath(path))
            if real.is_relative_to(root) and real.is_file():
                yield path


def _search_text(args: dict[str, Any], workspace: Path) -> str:
    pattern = require_str(args, "pattern")
    path = optional_str(args, "path", ".")
    glob = optional_str(args, "glob", "") or None
    ignore_case = optional_bool(args, "ignore_case", False)
    regex, literal = _compile(pattern, ignore_case)
    root = workspace_root(workspace)
    start = resolve_in_workspace(workspace, path)
    if not start.exists():
        raise ToolFailure(f"no such file or directory: {display_path(workspace, start)}")
    matches: list[str] = []
    more = 0
    skipped = 0
    for file in _search_files(start, root, glob):
        try:
            if file.stat().st_size > MAX_SEARCH_FILE_BYTES:
                skipped += 1
                continue
            data = file.read_bytes()
        except OSError:
            skipped += 1
            continue
        if _is_binary(data[:BINARY_SNIFF_BYTES]):
            continue
        rel = file.relative_to(root).as_posix() if file.is_relative_to(root) else display_path(workspace, file)
        for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if regex.search(text):
                if len(matches) >= MAX_MATCHES:
                    more += 1
                    continue
                if len(text) > MAX_MATCH_LINE_CHARS:
                    text = text[:MAX_MATCH_LINE_CHARS] + "…"
                matches.append(f"{rel}:{number}: {text}")
    notes = []
    if literal:
        notes.append("[pattern is not a valid regular expression; it was searched as literal text]")
    if more:
        notes.append(f"[{more} more matches not shown; narrow the pattern, path or glob]")
    if skipped:
        notes.append(f"[{skipped} files skipped: larger than {MAX_SEARCH_FILE_BYTES // (1024 * 1024)} MiB or unreadable]")
    if not matches:
        notes.insert(0, f"no matches for {pattern!r} in {display_path(workspace, start)}")
    return truncate_output("\n".join(matches + notes))


async def search_text(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_search_text, args, ctx.workspace, abandon_on_cancel=True)


# --- write_file / edit_file -------------------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse to open or fsync a directory; the data is synced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(target: Path, data: bytes) -> None:
    """Replace `target` with `data` all at once: temp file beside it, fsync, os.replace, fsync the directory.

    An existing file keeps its permission bits; a new one gets the usual 0666 & ~umask. (Hard links to the old file
    are not updated — the name now points at a new inode.)
    """
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    tmp = target.parent / f".{target.name[:100]}.{secrets.token_hex(6)}.cairn-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def _write_file(args: dict[str, Any], workspace: Path) -> str:
    path = require_str(args, "path")
    content = require_str(args, "content", allow_empty=True)
    target = resolve_in_workspace(workspace, path)
    shown = display_path(workspace, target)
    if target.is_dir():
        raise ToolFailure(f"{shown} is a directory; give a file path")
    data = content.encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)  # inside the workspace: target is, so its parents are
    if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return f"wrote {len(data)} bytes to {shown} (the file already had exactly this content)"
    atomic_write(target, data)
    return f"wrote {len(data)} bytes to {shown}"


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_write_file, args, ctx.workspace)


def _occurrences(text: str, needle: str) -> list[int]:
    """Start offsets of every occurrence, overlapping ones included (so "aa" in "aaa" counts as ambiguous)."""
    found = []
    at = text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def _edit_file(args: dict[str, Any], workspace: Path) -> str:
    path = require_str(args, "path")
    old = require_str(args, "old")
    new = require_str(args, "new", allow_empty=True)
    if old == new:
        raise BadArguments("old and new are identical; nothing to change")
    target = resolve_in_workspace(workspace, path)
    shown = display_path(workspace, target)
    if not target.is_file():
        raise ToolFailure(f"no such file: {shown} (use write_file to create a file)")
    data = target.read_bytes()
    if _is_binary(data[:BINARY_SNIFF_BYTES]):
        raise ToolFailure(f"{shown} looks like a binary file; edit_file only edits text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolFailure(f"{shown} is not valid UTF-8 text; edit_file only edits UTF-8 text") from None
    found = _occurrences(text, old)
    if not found:
        hint = " (the file uses CRLF line endings; include the \\r)" if "\r\n" in text and "\r\n" not in old else ""
        raise ToolFailure(
            f"old text not found in {shown}{hint}; it must match exactly, including whitespace and indentation "
            "(read_file shows the current content)"
        )
    if len(found) > 1:
        raise ToolFailure(
            f"old text occurs {len(found)} times in {shown}; include more surrounding lines so it matches exactly once"
        )
    at = found[0]
    atomic_write(target, (text[:at] + new + text[at + len(old):]).encode("utf-8"))
    return f"replaced 1 occurrence in {shown} at line {text.count(chr(10), 0, at) + 1}"


async def edit_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_edit_file, args, ctx.workspace)


# --- tool definitions -------------------------------------------------------------------------------------------------

_PATH_NOTE = "relative to the workspace root (absolute paths are allowed only inside the workspace)"

LIST_DIR = Tool(
    name="list_dir",
    description=(
        "List a directory in the workspace. Directories come first and end with '/'; files show their size in bytes."
    ),
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string", "description": f"Directory to list, {_PATH_NOTE}. Default '.'."}},
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
            "path": {"type": "string", "description": f"File to read, {_PATH_NOTE}."},
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
        f"text). Prints 'path:line: text' for each matching line, at most {MAX_MATCHES}. Skips binary files and "
        "directories such as .git, .venv and node_modules."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Python syntax) matched against each line."},
            "path": {"type": "string", "description": f"Directory or file to search, {_PATH_NOTE}. Default '.'."},
            "glob": {"type": "string", "description": "Only search files whose name matches this glob, e.g. '*.py'."},
            "ignore_case": {"type": "boolean", "description": "Match case-insensitively. Default false."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    safety="read_only",
    body=search_text,
)

WRITE_FILE = Tool(
    name="write_file",
    description=(
        "Create or overwrite a file in the workspace with the given content (UTF-8), creating parent directories as "
        "needed. The write is atomic and writing the same content again changes nothing. To change part of an "
        "existing file, prefer edit_file."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": f"File to write, {_PATH_NOTE}."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    safety="idempotent",
    body=write_file,
)

EDIT_FILE = Tool(
    name="edit_file",
    description=(
        "Replace one exact piece of text in an existing file. 'old' must occur exactly once in the file, matching "
        "whitespace and indentation exactly; include enough surrounding lines to make it unique. Fails without "
        "changing anything if 'old' is missing or ambiguous."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": f"File to edit, {_PATH_NOTE}."},
            "old": {"type": "string", "description": "The exact text to replace; must occur exactly once."},
            "new": {"type": "string", "description": "The replacement text (may be empty to delete 'old')."},
        },
        "required": ["path", "old", "new"],
        "additionalProperties": False,
    },
    safety="side_effecting",
    body=edit_file,
)

FILE_TOOLS = (LIST_DIR, READ_FILE, SEARCH_TEXT, WRITE_FILE, EDIT_FILE)
