"""Tab completion of `@path` mentions in the chat's prompt (issue 42; what a mention attaches: agent/mentions.py).

The word under the cursor starting with `@` (after whitespace or at the start of a line; `@"…` for a quoted path) shows
the workspace files it matches in the completion popup the slash commands use, and Tab replaces the word with the first
one. Matching is a shell's, then a search's: the entries of the directory typed so far whose name starts with the rest
(a directory shown as `dir/`, so Tab on it completes to `@dir/` and the popup goes on with what is inside), then any
file whose path contains the typed text. At most MAX_SHOWN entries are shown.

The files are `workspace_files.list_files` (`.gitignore` respected, bounded), listed in a worker thread so a large
workspace never stalls typing, kept for the screen and listed again when older than STALE seconds (the old list is used
meanwhile). A `/command` keeps its own completion; the popup shows one or the other.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual.widgets import OptionList

from cairn.widgets.prompt_input import MentionEdit, PromptInput
from cairn.widgets.terminal_text import safe_text

from ..tools.workspace_files import list_files

MAX_SHOWN = 7  # what the popup shows without scrolling (its max-height, less its border)
STALE = 10.0  # seconds a listing is used before the next `@` lists the workspace again
_WORD = re.compile(r'(?:^|(?<=\s))@(?:"([^"\n]*)|([^\s"@]*))$')  # an `@word` (or `@"quoted…`) ending at the cursor


def mention_at(line: str, column: int) -> tuple[int, str, bool] | None:
    """(start column of the `@`, the path typed so far, quoted) when the cursor ends an `@word` in `line`."""
    match = _WORD.search(line[:column])
    if match is None or (column < len(line) and not line[column].isspace()):
        return None  # no `@word` here, or the cursor is inside a word (Tab there would cut it in two)
    quoted = match.group(1) is not None
    return match.start(), match.group(1) if quoted else match.group(2), quoted


def matches(paths: list[str], typed: str, limit: int = MAX_SHOWN) -> list[str]:
    """What `typed` completes to among `paths`: entries of its directory by prefix (directories end in `/`), then files
    whose path contains it and that are not inside a directory already offered; at most `limit`."""
    base, _, rest = typed.rpartition("/")
    base = f"{base}/" if base or typed.startswith("/") else ""
    children: set[str] = set()
    for path in paths:
        if path.startswith(base) and path[len(base):].startswith(rest):
            name, slash, _ = path[len(base):].partition("/")
            children.add(base + name + slash)
    found = sorted(children, key=lambda p: (not p.endswith("/"), p.lower()))[:limit]  # directories first
    shown_dirs = tuple(p for p in found if p.endswith("/"))
    if len(found) < limit and typed:
        for path in paths:  # (a file under a directory already offered is reached through it)
            if typed.lower() in path.lower() and path not in found and not path.startswith(shown_dirs):
                found.append(path)
                if len(found) == limit:
                    break
    return found


def as_mention(path: str, quoted: bool) -> str:
    """`@path`, quoted when it has spaces or was typed quoted. A file gets its closing quote and a space, so typing goes
    on; a directory stays open (`@dir/`, `@"my dir/`) so Tab goes on completing inside it."""
    is_dir = path.endswith("/")
    if quoted or any(c.isspace() for c in path):
        return f'@"{path}' if is_dir else f'@"{path}" '
    return f"@{path}" if is_dir else f"@{path} "


class MentionCompletion:
    """The chat screen's `@path` completion: its cached listing and the popup entries."""

    def __init__(self, workspace: Callable[[], Path]) -> None:
        self.workspace = workspace
        self.paths: list[str] = []
        self.listed_at: float | None = None  # when the cached listing was taken (None: never)
        self.listing = False  # a worker lists the workspace now

    def show(self, text: str, popup: OptionList, prompt: PromptInput, again: Callable[[], None]) -> bool:
        """Fill `popup` with the files the `@word` at the prompt's cursor matches and tell `prompt` what Tab does;
        False (and no mention edit) when the cursor is not on an `@word`. `again`: run when a new listing arrives."""
        prompt.mention = None
        row, column = prompt.cursor_location
        if not text or prompt.text != text or prompt.selection.start != prompt.selection.end:
            return False
        found_at = mention_at(prompt.document.get_line(row), column)
        if found_at is None:
            return False
        start, typed, quoted = found_at
        self._refresh(popup, again)
        found = matches(self.paths, typed)
        popup.clear_options()
        popup.add_options([Text(safe_text(path)) for path in found])
        popup.set_class(bool(found), "-visible")
        if found:
            prompt.mention = MentionEdit((row, start), (row, column), as_mention(found[0], quoted))
        prompt.completion = ""
        return True

    def _refresh(self, popup: OptionList, again: Callable[[], None]) -> None:
        if self.listing or (self.listed_at is not None and time.monotonic() - self.listed_at < STALE):
            return
        self.listing = True
        root = self.workspace()

        def work() -> None:
            paths: list[str] = []
            try:
                paths = list_files(root).paths
            finally:  # (a listing that failed leaves the old list, and is tried again at the next `@`)
                with contextlib.suppress(RuntimeError):  # the app closed meanwhile
                    popup.app.call_from_thread(self._listed, paths or self.paths, again)

        popup.run_worker(work, thread=True, group="mention-files", exit_on_error=False)

    def _listed(self, paths: list[str], again: Callable[[], None]) -> None:
        self.paths, self.listed_at, self.listing = paths, time.monotonic(), False
        again()
