"""Copying to the operator's clipboard: the last answer (Ctrl+G, `/copy`) or a focused code block (`c` / `y`).

Through OSC 52 (Textual's `App.copy_to_clipboard` writes `ESC ] 52 ; c ; <base64> BEL` to the terminal): it needs no
clipboard tool on the machine Cairn runs on, so it works over ssh, and inside tmux when tmux passes it on. A terminal
that does not allow it ignores it silently, and nothing can ask it whether it did, so every copy says what was copied
and how, and the hint that can help is given when it applies: inside tmux whose `set-clipboard` is not `on` (tmux then
keeps the copy from the terminal — asked of tmux itself, at each copy), and elsewhere with the session's first copy
(allow clipboard access in the terminal). What goes to the clipboard has its control characters removed (a pasted
escape sequence would act in the shell it is pasted into); tabs and line ends stay.
"""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from typing import Any, Sequence

from cairn.persistence.events import AnyEvent, AssistantMessage

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TMUX_FIX = "tmux set -g set-clipboard on"
TERMINAL_HINT = ("Nothing to paste? The terminal ignored OSC 52: allow clipboard access in its settings (over ssh, "
                 "the terminal you sit at).")
_hinted: weakref.WeakSet[Any] = weakref.WeakSet()  # apps that have shown the terminal hint once


def last_answer(events: Sequence[AnyEvent]) -> str | None:
    """The text of the model's latest answer (its last message with text), None before there is one."""
    for event in reversed(events):
        if isinstance(event, AssistantMessage) and event.text.strip():
            return event.text
    return None


def clipboard_text(text: str) -> str:
    """`text` as it may go to a clipboard: line ends as `\\n`, control characters (ESC, C1…) removed."""
    return CONTROL.sub("", text.replace("\r\n", "\n"))


async def tmux_clipboard() -> str | None:
    """tmux's `set-clipboard` when Cairn runs inside tmux (`?` when tmux cannot be asked), else None."""
    if not os.environ.get("TMUX"):
        return None
    try:
        process = await asyncio.create_subprocess_exec(
            "tmux", "show-options", "-gv", "set-clipboard", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await asyncio.wait_for(process.communicate(), timeout=2)
    except (OSError, asyncio.TimeoutError):
        return "?"
    return out.decode(errors="replace").strip() or "?"


def notice(what: str, size: int, tmux: str | None, first: bool) -> tuple[str, bool]:
    """What the toast says after a copy, and whether it is a warning."""
    said = f"Copied {what} ({size:,} characters) to the clipboard through the terminal (OSC 52)."
    if tmux is not None and tmux != "on":
        state = "cannot be read" if tmux == "?" else f"is {tmux}"
        return (f"{said} tmux passes it on only with set-clipboard on (here it {state}): run `{TMUX_FIX}` "
                "and add that line to ~/.tmux.conf."), True
    if tmux is None and first:
        return f"{said} {TERMINAL_HINT}", False
    return said, False


async def copy_text(app: Any, text: str, what: str) -> None:
    """Put `text` on the clipboard through OSC 52 and say so (with the hint that applies)."""
    text = clipboard_text(text)
    app.copy_to_clipboard(text)
    first = app not in _hinted
    _hinted.add(app)
    said, warning = notice(what, len(text), await tmux_clipboard(), first)
    app.notify(said, severity="warning" if warning else "information", timeout=10 if warning or first else 4,
               markup=False)


async def copy_last_answer(app: Any, events: Sequence[AnyEvent]) -> None:
    """Ctrl+G and `/copy`: the latest answer, or a line saying there is none yet."""
    answer = last_answer(events)
    if answer is None:
        app.notify("No answer to copy yet.", severity="warning", markup=False)
        return
    await copy_text(app, answer, "the last answer")
