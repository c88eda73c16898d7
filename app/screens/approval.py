"""Approval modal for side-effecting and idempotent tools: allow once / for this session (the whole tool, or for
`run_command` only commands starting with the same word) / deny / deny with a note the model receives.

No keystroke typed as text decides it (SPEC §11 rev 4, `screens/typeahead.py`): Cairn opens it by itself, so if the
operator was typing when it appeared (a key other than the Enter that sent the prompt within 1.5 s, by the key's own
time, or a non-empty prompt) every key goes on to the prompt, in order, until the operator moves to the dialog with Tab
(the dialog says "typing… Tab to decide"); opened on an idle, empty prompt it takes keys at once. Once it has the keys,
Tab changes nothing, and a letter that is none of its choices is typing again (back to the prompt until the next Tab).
A click on a choice while it waits for Tab only moves to it. Letters typed into the note are the note's. The preview
(`app/agent/previews.py`) scrolls on its own while the choices stay on screen whatever its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import events, getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from rich.text import Text
from textual.markup import escape
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label, Static

from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text

from ..agent.approval import ApprovalAnswer, ApprovalRequest, first_word
from ..agent.previews import preview_parts, render_parts
from .typeahead import Dialog, Typist

# the keys the modal answers once it has the keys; any other printable key is typing and goes to the prompt
MODAL_KEYS = frozenset({"a", "s", "p", "d", "n", "escape", "enter", "up", "down", "left", "right", "pageup", "pagedown",
                        "home", "end", "ctrl+home", "ctrl+end"})
CHOOSE_TEXT = "Choose with a key, or ←→ and Enter · PgUp/PgDn scroll the preview"
NOTE_TEXT = "Type the note · Enter denies with it · Esc goes back to the choices"


@dataclass(frozen=True)
class Choice:
    id: str
    key: str
    label: str  # as wide as the line allows
    short: str  # when the long labels do not fit on one line


class Choices(Widget, can_focus=True):
    """The modal's choices on one line at the bottom (so the preview keeps the height): ←→ move the highlight, Enter
    takes it, a letter takes its choice. Nothing is highlighted at first, so Enter decides only what was chosen. A click
    reaches it only once the modal has the keys (`typeahead.Dialog.route` takes it before, and it decides nothing)."""

    DEFAULT_CSS = """
    Choices { height: auto; width: 1fr; }
    Choices:focus { background-tint: $foreground 4%; }
    """

    BINDINGS = [
        Binding("left,up", "move(-1)", "Previous", show=False),
        Binding("right,down", "move(1)", "Next", show=False),
        Binding("enter", "select", "Choose", show=False),
    ]

    highlighted: reactive[int | None] = reactive(None)
    GAP = 3

    class Selected(Message):
        def __init__(self, choices: "Choices", choice: Choice) -> None:
            super().__init__()
            self.choices = choices
            self.choice = choice

        @property
        def control(self) -> "Choices":
            return self.choices

    def __init__(self, *choices: Choice, id: str | None = None) -> None:
        super().__init__(id=id)
        self.choices = list(choices)

    @property
    def option_count(self) -> int:
        return len(self.choices)

    def get_option_at_index(self, index: int) -> Choice:
        return self.choices[index]

    def labels(self, width: int | None = None) -> list[str]:
        """The long labels when they all fit on one line of `width`, else the short ones."""
        width = width if width is not None else (self.content_region.width or 1_000)
        long = [f"{c.key} {c.label}" for c in self.choices]
        if sum(map(len, long)) + self.GAP * (len(long) - 1) <= width:
            return long
        return [f"{c.key} {c.short}" for c in self.choices]

    def spans(self) -> list[tuple[int, int]]:
        """Each choice's columns (start, end) on the line, relative to the widget's content."""
        spans, x = [], 0
        for label in self.labels():
            spans.append((x, x + len(label)))
            x += len(label) + self.GAP
        return spans

    def offset_of(self, choice_id: str) -> tuple[int, int]:
        """Screen coordinates inside the choice's label (where a click on it lands)."""
        index = next(i for i, c in enumerate(self.choices) if c.id == choice_id)
        region = self.content_region
        return region.x + self.spans()[index][0] + 1, region.y

    def render(self) -> Text:
        line = Text(no_wrap=False, overflow="fold")
        for i, label in enumerate(self.labels()):
            if i:
                line.append(" " * self.GAP)
            key, _, rest = label.partition(" ")
            style = "reverse" if i == self.highlighted else ""
            line.append(key, style=f"bold {style}".strip())
            line.append(" " + rest, style=style)
        return line

    def lines(self, width: int) -> int:
        """How many lines the choices take at `width` (the modal sizes its preview with it)."""
        return max(1, -(-sum(len(l) + self.GAP for l in self.labels(width)) // max(1, width)))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.lines(width)

    def action_move(self, step: int) -> None:
        count = len(self.choices)
        self.highlighted = (0 if step > 0 else count - 1) if self.highlighted is None else (
            (self.highlighted + step) % count)

    def action_select(self) -> None:
        if self.highlighted is not None:
            self.post_message(self.Selected(self, self.choices[self.highlighted]))

    def watch_highlighted(self) -> None:
        self.refresh()

    async def _on_click(self, event: events.Click) -> None:
        event.stop()
        x = event.x - (self.content_region.x - self.region.x)
        for index, (start, end) in enumerate(self.spans()):
            if start <= x < end and event.y == 0:
                self.highlighted = index
                self.post_message(self.Selected(self, self.choices[index]))
                return


class ApprovalModal(Dialog[ApprovalAnswer]):
    """Returns an ApprovalAnswer (allowed_once, allowed_session, allowed_prefix with its command prefix, denied with an
    optional note, or cancelled when the turn is cancelled under it). `typist` is the chat's prompt (the keys typed
    while it waits for Tab go there); without one it takes keys at once."""

    CSS_PATH = "approval.tcss"

    choice_line = getters.query_one("#choices", Choices)
    note = getters.query_one("#note", Input)
    preview = getters.query_one("#preview", VerticalScroll)

    BINDINGS = [
        Binding("a", "decide('allowed_once')", "Allow once"),
        Binding("s", "decide('allowed_session')", "Allow for session"),
        Binding("p", "decide('allowed_prefix')", "Allow prefix", show=False),
        Binding("d", "decide('denied')", "Deny"),
        Binding("n", "note", "Deny with a note"),
        Binding("escape", "decide('denied')", "Deny"),
        Binding("pageup", "scroll_preview(-1)", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_preview(1)", "Scroll", show=False, priority=True),
    ]

    def __init__(self, request: ApprovalRequest, workspace: Path | str = ".", typist: Typist | None = None) -> None:
        super().__init__(typist=typist)
        self.request = request
        self.workspace = Path(workspace)
        self.prefix = first_word(request.arguments.get("command")) if request.name == "run_command" else ""

    def compose(self) -> ComposeResult:
        r = self.request
        name = escape(safe_text(r.name))
        with Vertical(id="dialog"):
            # the name and arguments come from the model: made terminal-safe, and the name escaped inside the markup
            yield Label(f"Allow [b]{name}[/b]? ({r.safety.replace('_', '-')})", id="title")
            with VerticalScroll(id="preview"):
                yield Static(render_parts(preview_parts(r.name, r.arguments, self.workspace)), id="arguments")
            yield Choices(*self._options(), id="choices")
            yield Input(placeholder="why not? (the model is told; Enter sends, Esc goes back)", id="note",
                        select_on_focus=False)
            yield self.guard_line()
        yield QuietFooter()

    def _options(self) -> list[Choice]:
        name = safe_text(self.request.name)
        options = [Choice("allowed_once", "a", "Allow once", "once"),
                   Choice("allowed_session", "s", f"Allow {name} for this session", "session")]
        if self.prefix:
            prefix = safe_text(self.prefix)
            options.append(Choice("allowed_prefix", "p", f"Allow `{prefix} …` for this session", f"`{prefix} …`"))
        options += [Choice("denied", "d", "Deny", "deny"), Choice("note", "n", "Deny with a note…", "deny + note")]
        return options

    def on_mount(self) -> None:
        self.choice_line.focus()  # nothing highlighted: Enter decides only what was chosen
        self._fit_preview()

    def on_resize(self) -> None:
        self._fit_preview()

    def _fit_preview(self) -> None:
        """The preview gets what the title, the choices' line, the note, the hint and the footer leave: however long
        it is, the choices stay on screen (it scrolls instead)."""
        choices = self.choice_line
        lines = choices.lines(choices.content_region.width) if choices.size.width else 1
        note = 3 if self.note.has_class("-visible") else 0
        fixed = 2 + 1 + 2 + 1 + lines + note + 1  # borders, title, preview border, margin, choices, hint
        limit = int(self.size.height * 0.92) if self.size.height else 20
        self.preview.styles.max_height = max(3, limit - fixed)

    # -- the type-ahead guard (`typeahead.Dialog`) ------------------------------------------------------------------

    def dialog_keys(self) -> frozenset[str]:
        return MODAL_KEYS if self.prefix else MODAL_KEYS - {"p"}

    def keys_text(self) -> str:
        return NOTE_TEXT if self.note.has_focus else CHOOSE_TEXT

    def keys_taken(self) -> None:
        if not self.note.has_focus:
            self.choice_line.focus()

    @property
    def armed(self) -> bool:
        """Whether a key pressed now decides (the dialog has the keys)."""
        return self.takes_keys

    # -- deciding ---------------------------------------------------------------------------------------------------

    @on(Choices.Selected, "#choices")
    def chosen(self, event: Choices.Selected) -> None:
        if event.choice.id == "note":
            self.action_note()
        else:
            self.action_decide(event.choice.id)

    def action_decide(self, choice: str) -> None:
        if self.note.has_focus or not self.takes_keys:
            return
        if choice == "allowed_prefix":
            if self.prefix:
                self.dismiss(ApprovalAnswer("allowed_prefix", command_prefix=self.prefix))
            return
        self.dismiss(ApprovalAnswer(choice))  # type: ignore[arg-type]

    def action_note(self) -> None:
        if not self.takes_keys:
            return
        note = self.note
        note.add_class("-visible")
        self._fit_preview()
        note.focus()
        self.call_after_refresh(self.show_guard)

    @on(Input.Submitted, "#note")
    def deny_with_note(self, event: Input.Submitted) -> None:
        self.dismiss(ApprovalAnswer("denied", note=event.value.strip()))

    def on_key(self, event: events.Key) -> None:
        """Esc in the note field goes back to the choices rather than denying without the note."""
        note = self.note
        if event.key == "escape" and note.has_focus:
            event.stop()
            event.prevent_default()
            note.remove_class("-visible")
            self._fit_preview()
            self.choice_line.focus()
            self.call_after_refresh(self.show_guard)

    def action_scroll_preview(self, direction: int) -> None:
        preview = self.preview
        (preview.scroll_page_down if direction > 0 else preview.scroll_page_up)(animate=False)
