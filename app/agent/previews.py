"""What an approval (and the resume screen's detail pane) shows of a tool call: the thing itself, readable.

A command is shown verbatim with the directory it will run in (never JSON-escaped: the operator must see what the
shell will see); `write_file` shows the new file highlighted and, when the file exists, a unified diff against what is
there now; `edit_file` shows the edit as a diff with context. The current content is read the way the tools read it
(confined to the workspace, no symlink followed, regular files only), and never more than PREVIEW_BYTES of it.
Everything from the model or the disk goes through `safe_text` first, so no escape sequence reaches the terminal.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.widgets.terminal_text import safe_text

PREVIEW_BYTES = 512 * 1024
CONTEXT_LINES = 3


@dataclass(frozen=True)
class Part:
    """One block of a preview: a caption, then text shown with a lexer (`diff`, `bash`, a file's own, or `text`)."""

    caption: str
    text: str
    lexer: str = "text"
    line_numbers: bool = False


def lexer_for(path: str) -> str:
    """Pygments' guess from the file name; plain text when it has none (a guess must never fail a preview)."""
    try:
        from pygments.lexers import get_lexer_for_filename
        from pygments.util import ClassNotFound
    except ImportError:  # pragma: no cover - rich always brings pygments
        return "text"
    try:
        return get_lexer_for_filename(path).aliases[0]
    except (ClassNotFound, IndexError):
        return "text"


def current_text(workspace: Path, path: str) -> tuple[str | None, str]:
    """(content, note): the file's text as the tools would read it, or None with why (missing is not an error)."""
    from ..tools.base import ToolFailure
    from ..tools.regular_files import BINARY_SNIFF_BYTES, looks_binary, read_regular_file
    from ..tools.workspace import MissingPath, locate

    try:
        with locate(workspace, path) as found:
            if found.is_dir:
                return None, f"{found.shown} is a directory"
            if found.st is None:
                return None, "new file"
            if found.st.st_size > PREVIEW_BYTES:
                return None, f"the current file is {found.st.st_size:,} bytes: too large to diff here"
            data = read_regular_file(found)
    except MissingPath:
        return None, "new file"
    except (ToolFailure, OSError) as e:
        return None, f"the current content cannot be read: {e}"
    if looks_binary(data[:BINARY_SNIFF_BYTES]):
        return None, "the current file is binary"
    return data.decode("utf-8", errors="replace"), ""


def unified(old: str, new: str, path: str, context: int = CONTEXT_LINES) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=context)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def preview_parts(name: str, arguments: Any, workspace: Path) -> list[Part]:
    """The blocks to show for one call; unknown tools and odd arguments fall back to indented JSON."""
    args = arguments if isinstance(arguments, dict) else None
    if name == "run_command" and args is not None and isinstance(args.get("command"), str):
        rest = {k: v for k, v in args.items() if k != "command"}
        extra = "  ·  " + ", ".join(f"{k}={json.dumps(v)}" for k, v in rest.items()) if rest else ""
        return [Part(f"runs in {workspace}{extra}", safe_text(args["command"]), "bash")]
    if name == "write_file" and args is not None and isinstance(args.get("path"), str) \
            and isinstance(args.get("content"), str):
        path, content = args["path"], args["content"]
        old, note = current_text(workspace, path)
        parts = []
        if old is not None:
            diff = unified(old, content, path)
            parts.append(Part(f"changes to {path}", safe_text(diff) or "(the file already has exactly this content)\n",
                              "diff"))
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        caption = f"{path} after the write · {lines} line(s)" + (f" · {note}" if note else "")
        parts.append(Part(caption, safe_text(content), lexer_for(path), line_numbers=True))
        return parts
    if name == "edit_file" and args is not None and all(isinstance(args.get(k), str) for k in ("path", "old", "new")):
        path, old_part, new_part = args["path"], args["old"], args["new"]
        old, note = current_text(workspace, path)
        if old is not None and old.count(old_part) == 1:
            diff = unified(old, old.replace(old_part, new_part, 1), path)
            return [Part(f"edit of {path}", safe_text(diff), "diff")]
        why = note or ("the old text is not in the file (the edit will fail)" if old is not None and old_part not in old
                       else "the old text occurs more than once (the edit will fail)")
        return [Part(f"edit of {path} · {why}", safe_text(unified(old_part, new_part, path)), "diff")]
    return [Part("arguments", safe_text(json.dumps(arguments, indent=2, ensure_ascii=False)), "json")]


def render_parts(parts: list[Part]) -> Any:
    """A Rich renderable for the parts (imported lazily: headless faces never load Rich's syntax machinery)."""
    from rich.console import Group
    from rich.syntax import Syntax
    from rich.text import Text

    blocks: list[Any] = []
    for part in parts:
        blocks.append(Text(safe_text(part.caption), style="bold"))
        blocks.append(Syntax(part.text, part.lexer, line_numbers=part.line_numbers, word_wrap=True,
                             theme="ansi_dark", background_color="default"))
    return Group(*blocks)
