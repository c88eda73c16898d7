"""File tools: list_dir, read_file, search_text (read-only), write_file (idempotent) and edit_file (side-effecting).

SPEC §8, and why each part is built as it is:
- Every path goes through `workspace.locate`, which walks it from the workspace root without following a symlink by
  name, and every file is then opened relative to the directory descriptor it returns with `O_NOFOLLOW`. So nothing
  outside the workspace is read or written, even when a directory is swapped for a symlink mid-call.
- Only regular files are read or written. A FIFO, socket or device is refused at once from its lstat, and what is
  opened is opened `O_NONBLOCK` and fstat'd before a byte is read, so no tool ever waits on a pipe (a thread stuck on
  one could not be cancelled and would keep the process from exiting).
- File names are shown with U+FFFD where they are not UTF-8 (`printable`), never passed on as lone surrogates.
- search_text uses the `regex` package with one time budget for the whole search (SEARCH_TIME_BUDGET), releasing the GIL
  while it matches, so a catastrophic pattern ends as TOOL_ERROR in seconds and never stalls the event loop.
- The bodies are plain blocking code run in a worker thread, so a large read or search never stalls the event loop (and
  with it the UI and the write-behind flusher); every wait in them is bounded.
- Writes are atomic (temp file in the same directory, fsync, rename, all relative to the directory descriptor): a crash
  leaves either the old file or the new one, never half of each — the property that lets repair retry write_file.
"""

from __future__ import annotations

import codecs
import hashlib
import contextlib
import errno
import fnmatch
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import anyio.to_thread

if TYPE_CHECKING:
    import regex

from .base import OUTPUT_LIMIT, BadArguments, Tool, ToolContext, ToolFailure, truncate_output
from .workspace import (
    DIR_FLAGS,
    Located,
    MissingPath,
    locate,
    optional_bool,
    optional_int,
    optional_str,
    printable,
    require_str,
)

BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a file as binary (the heuristic git and grep use)
MAX_DIR_ENTRIES = 1000
MAX_MATCHES = 200
MAX_MATCH_LINE_CHARS = 300
MAX_SEARCH_FILE_BYTES = 10 * 1024 * 1024  # larger files are skipped by search_text (and counted in its summary)
SEARCH_TIME_BUDGET = 5.0  # seconds of the whole search_text call, regex matching included
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox"})
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


async def _in_thread(func: Callable[..., str], *args: Any, abandon_on_cancel: bool = False) -> str:
    """Run a blocking body in a worker thread, turning OS errors into a ToolFailure the model can read.

    Writers keep the default (cancellation waits for the thread), so a cancelled write has either happened or not by the
    time the loop records the outcome. Readers may be abandoned: nothing depends on them finishing.
    """
    try:
        return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=abandon_on_cancel)
    except OSError as exc:
        where = f" ({printable(os.fsdecode(exc.filename))})" if isinstance(exc.filename, (str, bytes)) else ""
        raise ToolFailure(f"{exc.strerror or exc}{where}") from exc


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _refuse_irregular(shown: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise ToolFailure(f"{shown} is {_kind(mode)}; only regular files are read or written")


def _open_regular(found: Located) -> tuple[int, os.stat_result]:
    """Open the located regular file for reading: refused from its lstat before opening if it is anything else, and
    checked again on the open descriptor (it may have been swapped in between). Returns (fd, fstat)."""
    assert found.name is not None and found.st is not None
    _refuse_irregular(found.shown, found.st.st_mode)
    try:
        fd = os.open(found.name, FILE_FLAGS, dir_fd=found.dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolFailure(f"{found.shown} was replaced by a symbolic link while it was opened; try again") from None
        raise
    try:
        st = os.fstat(fd)
        _refuse_irregular(found.shown, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular_file(found: Located) -> bytes:
    fd, _ = _open_regular(found)
    with os.fdopen(fd, "rb") as f:
        return f.read()


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
    return False, f"{name}  ({_kind(st.st_mode)}){link}"


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
    return await _in_thread(_list_dir, args, ctx.workspace, abandon_on_cancel=True)


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
            fd, st = _open_regular(found)
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
    return await _in_thread(_read_file, args, ctx.workspace, abandon_on_cancel=True)


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
        fd, _ = _open_regular(found)
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
    return await _in_thread(_search_text, args, ctx.workspace, abandon_on_cancel=True)


# --- write_file / edit_file -------------------------------------------------------------------------------------------


def atomic_write(dir_fd: int, name: str, data: bytes, bits: int | None = None) -> None:
    """Replace `name` in the directory `dir_fd` with `data` all at once: temp file beside it, fsync, rename, fsync the
    directory. Everything is relative to `dir_fd`, so the file lands in that directory whatever happens to the names
    above it.

    An existing file keeps its permission bits; a new one gets the usual 0666 & ~umask; `bits` sets them (a rewind
    puts a file's mode back too). (Hard links to the old file are not updated — the name now points at a new inode.)
    A symlink swapped in for `name` is replaced, not followed.
    """
    mode: int | None = bits
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            mode = None
    tmp = f".{name[:100]}.{secrets.token_hex(6)}.cairn-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse to fsync a directory; the data itself is synced
        os.fsync(dir_fd)


@dataclass(frozen=True)
class Fingerprint:
    """A file tool's intent, fingerprinted before its pre-tool barrier (SPEC §9 rev 3): the path's content hash now
    (None: no file), the hash the body will leave, and the content to keep as the before-image (None: no file, or
    over the size limit, so not restorable)."""

    before_sha256: str | None
    after_sha256: str
    before: bytes | None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(found: Located) -> bytes | None:
    """The located regular file's content (None: it does not exist)."""
    if found.st is None:
        return None
    _refuse_irregular(found.shown, found.st.st_mode)
    return read_regular_file(found)


def fingerprint(name: str, args: Any, workspace: Path, max_before: int) -> Fingerprint | None:
    """The fingerprint of a `write_file` or `edit_file` call, or None when it has none: another tool, arguments the
    body will refuse anyway, an edit that does not apply, a path that cannot be read."""
    if name not in ("write_file", "edit_file") or not isinstance(args, dict):
        return None
    try:
        path = require_str(args, "path")
        if name == "write_file":
            after = printable(require_str(args, "content", allow_empty=True)).encode("utf-8")
        with locate(workspace, path) as found:
            if found.is_dir:
                return None
            before = _current(found)
        if name == "edit_file":
            if before is None:
                return None
            text = before.decode("utf-8")
            old, new = require_str(args, "old"), require_str(args, "new", allow_empty=True)
            at = _occurrences(text, old)
            if len(at) != 1 or old == new:
                return None
            after = printable(text[:at[0]] + new + text[at[0] + len(old):]).encode("utf-8")
    except MissingPath:
        before = None
        if name == "edit_file":
            return None
    except (ToolFailure, OSError, UnicodeDecodeError, ValueError):
        return None
    keep = before if before is not None and len(before) <= max_before else None
    return Fingerprint(_sha(before) if before is not None else None, _sha(after), keep)


def _unchanged_since(found: Located, expected: Fingerprint | None, data: bytes | None) -> None:
    """Refuse (TOOL_ERROR, nothing written) when the file changed between the fingerprint and the write."""
    if expected is not None and (_sha(data) if data is not None else None) != expected.before_sha256:
        raise ToolFailure(
            f"{found.shown} changed after this call was recorded (its content is no longer what Cairn fingerprinted); "
            "nothing was written. Read it again before changing it."
        )


def _write_file(args: dict[str, Any], workspace: Path, expected: Fingerprint | None = None) -> str:
    path = require_str(args, "path")
    content = require_str(args, "content", allow_empty=True)
    data = printable(content).encode("utf-8")  # a lone surrogate from the model's JSON becomes U+FFFD, not a crash
    with locate(workspace, path, make_parents=True) as found:
        shown = found.shown
        if found.is_dir:
            raise ToolFailure(f"{shown} is a directory; give a file path")
        assert found.name is not None
        if found.st is not None:
            _refuse_irregular(shown, found.st.st_mode)
            now = read_regular_file(found) if expected is not None or found.st.st_size == len(data) else None
            _unchanged_since(found, expected, now)
            if now == data:
                return f"wrote {len(data)} bytes to {shown} (the file already had exactly this content)"
        else:
            _unchanged_since(found, expected, None)
        atomic_write(found.dir_fd, found.name, data)
    return f"wrote {len(data)} bytes to {shown}"


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_write_file, args, ctx.workspace, ctx.fingerprint)


def _occurrences(text: str, needle: str) -> list[int]:
    """Start offsets of every occurrence, overlapping ones included (so "aa" in "aaa" counts as ambiguous)."""
    found = []
    at = text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def _edit_file(args: dict[str, Any], workspace: Path, expected: Fingerprint | None = None) -> str:
    path = require_str(args, "path")
    old = require_str(args, "old")
    new = require_str(args, "new", allow_empty=True)
    if old == new:
        raise BadArguments("old and new are identical; nothing to change")
    try:
        with locate(workspace, path) as found:
            shown = found.shown
            if found.is_dir:
                raise ToolFailure(f"{shown} is a directory; edit_file edits a file")
            if found.st is None:
                raise ToolFailure(f"no such file: {shown} (use write_file to create a file)")
            assert found.name is not None
            data = read_regular_file(found)
            _unchanged_since(found, expected, data)
            if looks_binary(data[:BINARY_SNIFF_BYTES]):
                raise ToolFailure(f"{shown} looks like a binary file; edit_file only edits text")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ToolFailure(f"{shown} is not valid UTF-8 text; edit_file only edits UTF-8 text") from None
            found_at = _occurrences(text, old)
            if not found_at:
                hint = " (the file uses CRLF line endings; include the \\r)" if "\r\n" in text and "\r\n" not in old else ""
                raise ToolFailure(
                    f"old text not found in {shown}{hint}; it must match exactly, including whitespace and indentation "
                    "(read_file shows the current content)"
                )
            if len(found_at) > 1:
                raise ToolFailure(
                    f"old text occurs {len(found_at)} times in {shown}; include more surrounding lines so it matches "
                    "exactly once"
                )
            at = found_at[0]
            new_text = text[:at] + new + text[at + len(old):]
            atomic_write(found.dir_fd, found.name, printable(new_text).encode("utf-8"))
    except MissingPath as missing:
        raise ToolFailure(f"no such file: {missing.shown} (use write_file to create a file)") from None
    return f"replaced 1 occurrence in {shown} at line {text.count(chr(10), 0, at) + 1}"


async def edit_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _in_thread(_edit_file, args, ctx.workspace, ctx.fingerprint)


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
        f"text). Prints 'path:line: text' for each matching line, at most {MAX_MATCHES}. Skips binary files, "
        "symlinks met while walking, and directories such as .git, .venv and node_modules. The whole search has a "
        f"{SEARCH_TIME_BUDGET:g} s time budget; a pattern that backtracks for longer fails with an error."
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
