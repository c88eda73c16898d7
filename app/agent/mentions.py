"""`@path` mentions: a prompt names workspace files and their text goes with it to the model (issue 42).

A mention is an `@` at the start of the prompt or after whitespace, followed by a path up to the next whitespace, or by a
quoted path, `@"name with spaces"`. An `@` inside a word (`a@b.com`, `x@y`) is never a mention, so e-mail addresses
and decorators-in-a-sentence stay text. Trailing punctuation (`.,;:!?)]}'"`) that is not part of an existing file name is
dropped, so `see @notes.md.` names `notes.md` while a file really called `v1.` is still found.

Each mention that names a regular, non-binary file inside the workspace is attached (`Attachment` in the `user/message`
event): its path relative to the workspace (the real path, symlinks inside the workspace followed), the sha256 and size
of the whole file, and its text decoded as UTF-8 (bad bytes replaced), cut at MAX_FILE_TEXT bytes per file and
MAX_PROMPT_TEXT bytes per prompt (`truncated`). The log keeps the text, so a resumed session sends what was sent even if
the file changed since. A path outside the workspace (confined by the file tools' own walk, `tools.workspace.locate`),
a directory, a missing file, a special file or a binary one (a NUL in its first 8 KiB, the file tools' rule) is not
attached: the prompt text stays as typed and the operator gets one notice line per refused mention. The same file
mentioned twice is attached once.

The model sees the prompt followed by one block per attachment (`user_content`):

    <file path="notes.md" sha256="…" size="1234" truncated="false">
    …text…
    </file>
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from cairn.persistence.events import Attachment

from ..tools.base import BadArguments, ToolFailure
from ..tools.regular_files import BINARY_SNIFF_BYTES, looks_binary, open_regular
from ..tools.workspace import MissingPath, locate, printable

MAX_FILE_TEXT = 100 * 1024  # bytes of one file's text sent with a prompt
MAX_PROMPT_TEXT = 200 * 1024  # bytes of all of a prompt's attached text
TRAILING = ".,;:!?)]}'\""
_MENTION = re.compile(r'(?:^|(?<=\s))@(?:"([^"\n]+)"|([^\s@]\S*))')
_CHUNK = 1 << 16


@dataclass
class Attached:
    attachments: list[Attachment] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # one line per refused mention, for the operator


def mention_spans(prompt: str) -> list[tuple[int, int, str, bool]]:
    """(start, end, path, quoted) of each `@` token in `prompt`, trailing punctuation still on unquoted paths."""
    return [(m.start(), m.end(), m.group(1) or m.group(2), m.group(1) is not None) for m in _MENTION.finditer(prompt)]


def _candidates(token: str) -> list[str]:
    """`token`, then `token` with one, two, … trailing punctuation characters dropped (longest first)."""
    found = [token]
    while token and token[-1] in TRAILING:
        token = token[:-1]
        if token:
            found.append(token)
    return found


def _exists(workspace: Path, path: str) -> bool:
    try:
        with locate(workspace, path) as found:
            return found.st is not None
    except (ToolFailure, OSError):
        return False


def find_mentions(prompt: str, workspace: Path | None = None) -> list[str]:
    """The paths `prompt` mentions, in order: for an unquoted one, the longest form (trailing punctuation kept or
    dropped) that exists in `workspace`, else the form with all trailing punctuation dropped."""
    paths = []
    for _, _, token, quoted in mention_spans(prompt):
        forms = [token] if quoted else _candidates(token)
        chosen = next((p for p in forms if workspace is not None and _exists(workspace, p)), forms[-1])
        if chosen:
            paths.append(chosen)
    return paths


def _refused(path: str, why: str) -> str:
    return f"@mention {printable(path)!r} not attached: {why}"[:300]


def _read(workspace: Path, path: str, budget: int) -> tuple[Attachment | None, str | None, str]:
    """(attachment, refusal, key): the file `path` names, read whole for its hash and kept up to `budget` bytes."""
    try:
        with locate(workspace, path) as found:
            if found.is_dir:
                return None, "it is a directory", path
            if found.st is None:
                return None, "no such file in the workspace", path
            shown, (fd, _) = found.shown, open_regular(found)
    except MissingPath:
        return None, "no such file in the workspace", path
    except BadArguments as e:
        return None, "it is outside the workspace" if "outside the workspace" in str(e) else str(e), path
    except ToolFailure as e:  # a special file, a component that is not a directory, …
        return None, str(e), path
    except OSError as e:
        return None, e.strerror or str(e), path
    digest, size, head = hashlib.sha256(), 0, bytearray()
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            if size < BINARY_SNIFF_BYTES and looks_binary(chunk[:BINARY_SNIFF_BYTES - size]):
                return None, "it is a binary file", shown
            digest.update(chunk)
            size += len(chunk)
            if len(head) <= budget:
                head += chunk[:budget + 1 - len(head)]
    cut = len(head) > budget
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(bytes(head[:budget]), final=not cut)  # a character cut in half is dropped, not garbled
    return Attachment(path=shown, sha256=digest.hexdigest(), size=size, text=text, truncated=cut), None, shown


def attach(workspace: Path, prompt: str) -> Attached:
    """Read the files `prompt` mentions (blocking: run it in a thread, see `attach_mentions`)."""
    result, left = Attached(), MAX_PROMPT_TEXT
    seen: set[str] = set()
    for path in find_mentions(prompt, workspace):
        attachment, refusal, key = _read(workspace, path, min(MAX_FILE_TEXT, left))
        if refusal is not None:
            if (line := _refused(path, refusal)) not in result.notices:
                result.notices.append(line)
        elif attachment is not None and key not in seen:
            seen.add(key)
            left -= min(attachment.size, MAX_FILE_TEXT, left)  # the bytes its text was cut from
            result.attachments.append(attachment)
    return result


async def attach_mentions(workspace: Path, prompt: str) -> Attached:
    """`attach` in a worker thread, shielded: a turn cancelled meanwhile is cancelled after its `turn/start`, never
    before it (the loop closes every turn it began with a `turn/end`)."""
    if "@" not in prompt:
        return Attached()
    with anyio.CancelScope(shield=True):
        attached = await anyio.to_thread.run_sync(attach, workspace, prompt)
    return attached


def _quote(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def user_content(text: str, attachments: list[Attachment]) -> str:
    """What the model is sent for a prompt: its text as typed, then each attached file as a `<file …>` block."""
    blocks = [f'<file path="{_quote(a.path)}" sha256="{a.sha256}" size="{a.size}" '
              f'truncated="{str(a.truncated).lower()}">\n{a.text}\n</file>' for a in attachments]
    return "\n\n".join([text, *blocks]) if blocks else text
