"""The one line that names a prompt's `@path` attachments under it (issue 42), shared by the TUI transcript and
`cairn show`/`export`: it lives beside the widgets (which may import nothing from `app`) and imports nothing of
Textual, so headless commands use it without paying for Textual. The caller makes it terminal-safe (`safe_text`)."""

from __future__ import annotations

from cairn.persistence.events import Attachment

def file_size(size: int) -> str:
    """`812 B`, `1.2 KB`, `3.4 MB` (binary units, one decimal above a kilobyte)."""
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KB", "MB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GB"


def attachments_line(attachments: list[Attachment]) -> str:
    """`attached: notes.md (1.2 KB), src/a.py (300.0 KB, cut)`; empty when nothing was attached."""
    if not attachments:
        return ""
    shown = [f"{a.path} ({file_size(a.size)}{', cut' if a.truncated else ''})" for a in attachments]
    return "attached: " + ", ".join(shown)
