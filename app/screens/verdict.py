"""The verdict dialog: the operator's answer about an OUTCOME_UNKNOWN call (happened / did not happen / unknown).

Nothing is preselected: an answer about the world is recorded only once one was highlighted (↑/↓ or its key), and
Enter records the highlighted one (from the list or from the note); Esc cancels."""

from __future__ import annotations

from typing import Awaitable, Callable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option

from cairn.widgets.terminal_text import safe_text

VERDICTS = (("happened", "It happened"), ("did_not_happen", "It did not happen"), ("unknown", "Leave it unknown"))


class VerdictDialog(ModalScreen[tuple[str, str] | None]):
    """Returns (verdict, note), or None when dismissed without a choice. With `save`, the verdict is made durable
    before the dialog closes (SPEC §2 rev 3: an operator's decision is never held only in memory)."""

    DEFAULT_CSS = """
    VerdictDialog { align: center middle; }
    VerdictDialog > Vertical { width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    VerdictDialog OptionList { width: 100%; height: auto; margin: 1 0; }
    VerdictDialog Horizontal { height: auto; align: center middle; margin-top: 1; }
    VerdictDialog Button { margin: 0 1; }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("h", "pick(0)", "Happened", show=False),
        Binding("n", "pick(1)", "Did not happen", show=False),
        Binding("u", "pick(2)", "Unknown", show=False),
    ]

    def __init__(self, call_id: str, tool: str,
                 save: Callable[[str, str, str], Awaitable[None]] | None = None) -> None:
        super().__init__()
        self.call_id = call_id
        self.tool = tool
        self.save = save
        self._saving = False

    def compose(self) -> ComposeResult:
        with Vertical():
            # escaped: a call id comes from the model, and `[/x]` in it would be taken for markup
            tool, call_id = escape(safe_text(self.tool)), escape(safe_text(self.call_id))
            yield Label(f"Did [b]{tool}[/b] ({call_id}) take effect?")
            yield OptionList(*(Option(Text(f"{label}  [{key}]"), id=value) for (value, label), key in zip(VERDICTS, "hnu")),
                             id="verdict")
            yield Input(placeholder="optional note for the model (what you checked)", id="note")
            yield Label("", id="hint")
            with Horizontal():
                yield Button(r"Record \[enter]", id="record", variant="primary")
                yield Button(r"Cancel \[esc]", id="cancel")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = None
        options.focus()

    def action_pick(self, index: int) -> None:
        if not self.query_one("#note", Input).has_focus:
            self.query_one(OptionList).highlighted = index

    @on(OptionList.OptionSelected)
    def selected(self) -> None:
        self.record()

    @on(Button.Pressed, "#record")
    @on(Input.Submitted)
    def record(self) -> None:
        index = self.query_one(OptionList).highlighted
        if index is None:
            self.query_one("#hint", Label).update("Choose an answer first (↑/↓), then Enter.")
            self.query_one(OptionList).focus()
            return
        verdict = VERDICTS[index][0]
        note = self.query_one("#note", Input).value.strip()
        if self.save is None:
            self.dismiss((verdict, note))
        elif not self._saving:
            self._saving = True
            self.query_one("#hint", Label).update("Saving…")
            self.run_worker(self._save(verdict, note), exclusive=True)

    async def _save(self, verdict: str, note: str) -> None:
        from cairn.persistence.errors import CheckpointFailed

        assert self.save is not None
        try:
            await self.save(self.call_id, verdict, note)
        except CheckpointFailed as e:
            self.app.notify(f"Verdict recorded but not durable yet ({e.cause}); Cairn tries to write it "
                            "again at the next checkpoint.",
                            severity="warning")
        self.dismiss((verdict, note))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if not self._saving:
            self.dismiss(None)
