"""The file tools that write: write_file (idempotent) and edit_file (side-effecting), and the atomic write they share.

Writes are atomic (temp file in the same directory, fsync, rename, all relative to the directory descriptor `locate`
returns): a crash leaves either the old file or the new one, never half of each — the property that lets repair retry
write_file. Before its pre-tool barrier a call is fingerprinted (`fingerprint`: the content hash now and the one the
body will leave, and the before-image a rewind restores); the body then refuses to write over a file that changed
since. The bodies run in a worker thread that a cancellation waits for, so a cancelled write has either happened or
not by the time the loop records the outcome.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import BadArguments, Tool, ToolContext, ToolFailure
from .regular_files import BINARY_SNIFF_BYTES, in_thread, looks_binary, read_regular_file, refuse_irregular
from .workspace import PATH_NOTE, Located, MissingPath, locate, printable, require_str


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
    refuse_irregular(found.shown, found.st.st_mode)
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
            refuse_irregular(shown, found.st.st_mode)
            now = read_regular_file(found) if expected is not None or found.st.st_size == len(data) else None
            _unchanged_since(found, expected, now)
            if now == data:
                return f"wrote {len(data)} bytes to {shown} (the file already had exactly this content)"
        else:
            _unchanged_since(found, expected, None)
        atomic_write(found.dir_fd, found.name, data)
    return f"wrote {len(data)} bytes to {shown}"


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    return await in_thread(_write_file, args, ctx.workspace, ctx.fingerprint)


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
    return await in_thread(_edit_file, args, ctx.workspace, ctx.fingerprint)


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
            "path": {"type": "string", "description": f"File to write, {PATH_NOTE}."},
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
            "path": {"type": "string", "description": f"File to edit, {PATH_NOTE}."},
            "old": {"type": "string", "description": "The exact text to replace; must occur exactly once."},
            "new": {"type": "string", "description": "The replacement text (may be empty to delete 'old')."},
        },
        "required": ["path", "old", "new"],
        "additionalProperties": False,
    },
    safety="side_effecting",
    body=edit_file,
)
