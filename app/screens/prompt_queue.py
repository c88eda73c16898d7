"""The prompt queue: prompts typed while a turn runs wait here, not in the loop, so they can be taken back and edited;
they are handed to the loop one at a time, in the order they were typed. The operator's own `!command`s wait here too,
as typed (with their `!`), and become a command turn only when handed to the loop (agent/operator_command.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text

from cairn.widgets.terminal_text import safe_text

if TYPE_CHECKING:
    from ..agent.loop import AgentLoop
    from ..agent.operator_command import TurnInput


def is_command(text: str) -> bool:
    """`!cmd`: the operator's own shell command, not a prompt (a lone `!` is a prompt)."""
    from ..agent.operator_command import parse  # (not before the first frame: it brings the tools in)

    return parse(text) is not None


def turn_input(text: str) -> "TurnInput":
    from ..agent.operator_command import as_turn_input

    return as_turn_input(text)


class PromptQueue:
    """`loop` gives the agent's loop (None until the agent is built); `editing` the index of the queued prompt open
    in the prompt box for editing (None: none is), whose queue is held until the edit ends."""

    def __init__(self, loop: Callable[[], AgentLoop | None], editing: Callable[[], int | None]) -> None:
        self.pending: list[str] = []  # the prompt box edits this very list in place (↑ walks back through it)
        self.in_loop = 0  # prompts handed to the loop whose turn has not reported its result yet
        self.paused = False  # Esc cancelled a turn: the queue waits for the operator (send, edit or drop)
        self.sending = False  # a prompt was handed over and no answer has started yet: the status bar says `sending…`
        self._loop = loop
        self._editing = editing

    @property
    def empty(self) -> bool:
        """No prompt waits and none is in the loop: a prompt sent now goes straight to the loop."""
        return not self.in_loop and not self.pending

    def send(self, text: str) -> None:
        """A prompt the operator sent (the agent is ready): to the loop if it is free, else to the end of the queue."""
        loop = self._loop()
        assert loop is not None
        if self.in_loop or self.pending:
            self.pending.append(text)
            self.paused = False  # a new prompt after Esc: the operator goes on, queued prompts first
            self.send_next()
        else:
            self.in_loop += 1
            loop.submit(turn_input(text))

    def send_next(self) -> None:
        """Hand the head of the queue to a free loop, unless a queued prompt is open for editing: the queue is held
        until Enter, Ctrl+R or Esc ends the edit, so the loop never sends the version being changed."""
        loop = self._loop()
        if not self.pending or self.in_loop or loop is None or self._editing() is not None:
            return
        if self.paused:
            return
        text = self.pending.pop(0)
        self.in_loop += 1
        self.sending = not is_command(text)  # a command sends nothing to the model: it runs at once
        loop.submit(turn_input(text))

    def go_on(self) -> None:
        """The operator sends the paused queue."""
        self.paused = False
        self.send_next()

    def turn_cancelled(self) -> None:
        self.paused = bool(self.pending)  # the prompts typed ahead wait: they were written for the turn cancelled

    def turn_finished(self) -> None:
        """After each turn: hand the next waiting prompt to the loop, keeping their order."""
        self.in_loop = max(0, self.in_loop - 1)
        self.sending = False
        self.send_next()

    def count(self) -> str:
        """` · 2 queued` (or `paused`) for the status bar; "" when nothing waits."""
        return f" · {len(self.pending)} {'paused' if self.paused else 'queued'}" if self.pending else ""

    def view(self) -> str | Text:
        """The lines shown above the prompt: each waiting prompt, and what the operator can do with them."""
        queued = self.pending
        editing = self._editing()
        if editing is None and self.paused and queued:
            return safe_text("\n".join(f"paused: {q}" for q in queued)
                             + "  (Esc paused the queue: Enter in an empty prompt sends it · ↑ edits or drops)")
        if editing is None:
            hint = "  (↑ in an empty prompt takes the last one back to edit or drop)" if queued else ""
            return safe_text("\n".join(f"queued: {q}" for q in queued) + hint)
        lines = Text()  # the one in the box stands out, and the keys that end the edit are spelled out
        for i, q in enumerate(queued):
            lines.append(("✎ editing: " if i == editing else "queued: ") + safe_text(q) + "\n",
                         style="bold" if i == editing else "")
        lines.append(f"prompt {editing + 1} of {len(queued)}: Enter puts it back · Ctrl+R removes it · Esc leaves "
                     "it as it was · ↑↓ other prompts · the queue waits meanwhile", style="italic")
        return lines
