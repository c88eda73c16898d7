"""Approval modal for side-effecting and idempotent tools: allow once / for this session (the whole tool, or for
`run_command` only commands starting with the same word) / deny / deny with a note the model receives.

Type-ahead never decides it. Someone typing their next prompt when the modal pops up would otherwise answer it with
whatever letter came next (it happened: an `s` granted every later command). So keys within OPEN_GRACE of the modal
opening, and every key of a typing burst that began then (keys under TYPING_GAP apart, however long it goes on), and any
key that is not one of the modal's own, go back to the prompt in order (the app routes them, see `CairnApp.on_event`);
only a deliberate key after the typing stopped decides. A mouse click on a choice is held to the same rule: one pressed
within OPEN_GRACE of the opening or during a typing burst is dropped (the modal says so) and decides nothing. The preview (`app/agent/previews.py`) scrolls on its own while the
choices stay on screen whatever its length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from rich.text import Text
from textual.markup import escape
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, Label, Static

from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text

from ..agent.approval import ApprovalAnswer, ApprovalRequest, first_word
from ..agent.previews import preview_parts, render_parts

OPEN_GRACE = 0.4  # seconds after the modal opens during which no key decides it
TYPING_GAP = 0.3  # keys closer together than this are one typing burst

# the keys the modal answers once armed; anything else is typing and goes to the prompt
MODAL_KEYS = frozenset({"a", "s", "p", "d", "n", "escape", "enter", "up", "down", "left", "right", "pageup", "pagedown",
                        "home", "end", "tab", "shift+tab", "ctrl+home", "ctrl+end"})


@dataclass(frozen=True)
class Choice:
    id: str
    key: str
    label: str  # as wide as the line allows
    short: str  # when the long labels do not fit on one line


class Choices(Widget, can_focus=True):
    """The modal's choices on one line at the bottom (so the preview keeps the height): ←→ (or Tab) move the
    highlight, Enter takes it, a letter takes its choice. Nothing is highlighted at first, so Enter decides only what
    was chosen. A click counts only when the modal would take a key at the moment the button went down and at the
    moment it came up (a press begun in the grace period or mid-typing is no decision)."""

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
        self._pressed_at: float | None = None

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

    def get_content_height(self, container, viewport, width: int) -> int:  # type: ignore[override]
        return max(1, -(-sum(len(l) + self.GAP for l in self.labels(width)) // max(1, width)))

    def action_move(self, step: int) -> None:
        count = len(self.choices)
        self.highlighted = (0 if step > 0 else count - 1) if self.highlighted is None else (
            (self.highlighted + step) % count)

    def action_select(self) -> None:
        if self.highlighted is not None:
            self.post_message(self.Selected(self, self.choices[self.highlighted]))

    def watch_highlighted(self) -> None:
        self.refresh()

    def _on_mouse_down(self, event: events.MouseDown) -> None:
        self._pressed_at = event.time

    def _on_click(self, event: events.Click) -> None:
        pressed_at, self._pressed_at = self._pressed_at, None
        event.stop()
        modal = self.screen
        if isinstance(modal, ApprovalModal) and not modal.takes_click(pressed_at, event.time):
            return
        x = event.x - (self.content_region.x - self.region.x)
        for index, (start, end) in enumerate(self.spans()):
            if start <= x < end and event.y == 0:
                self.highlighted = index
                self.post_message(self.Selected(self, self.choices[index]))
                return


class ApprovalModal(ModalScreen[ApprovalAnswer]):
    """Returns an ApprovalAnswer (allowed_once, allowed_session, allowed_prefix with its command prefix, denied with an
    optional note, or cancelled when the turn is cancelled under it)."""

    DEFAULT_CSS = """
    ApprovalModal { align: center middle; }
    ApprovalModal > #dialog { width: 92%; max-width: 120; height: auto; max-height: 92%; border: thick $warning;
                              background: $surface; padding: 0 1; }
    ApprovalModal #title { text-style: bold; }
    ApprovalModal #preview { height: auto; max-height: 1fr; border: round $panel-lighten-2; }
    ApprovalModal #choices { margin-top: 1; }
    ApprovalModal #note { display: none; }
    ApprovalModal #note.-visible { display: block; }
    ApprovalModal #guard { color: $text-muted; height: 1; }
    """

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

    def __init__(self, request: ApprovalRequest, workspace: Path | str = ".") -> None:
        super().__init__()
        self.request = request
        self.workspace = Path(workspace)
        self.prefix = first_word(request.arguments.get("command")) if request.name == "run_command" else ""
        self.opened_at = time.monotonic()
        self._last_diverted: float | None = None
        self._click_refused_at: float | None = None

    def compose(self) -> ComposeResult:
        r = self.request
        name = escape(safe_text(r.name))
        with Vertical(id="dialog"):
            # the name and arguments come from the model: made terminal-safe, and the name escaped inside the markup
            yield Label(f"Allow [b]{name}[/b]? ({r.safety.replace('_', '-')})", id="title")
            with VerticalScroll(id="preview"):
                yield Static(render_parts(preview_parts(r.name, r.arguments, self.workspace)), id="arguments")
            yield Choices(*self._options(), id="choices")
            yield Input(placeholder="why not? (the model is told; Enter sends, Esc goes back)", id="note")
            yield Static("", id="guard", markup=False)
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
        self.query_one("#choices", Choices).focus()  # nothing highlighted: Enter decides only what was chosen
        self._show_guard()
        self.set_interval(0.1, self._show_guard)
        self._fit_preview()

    def on_resize(self) -> None:
        self._fit_preview()

    def _fit_preview(self) -> None:
        """The preview gets what the title, the choices' line, the note, the hint and the footer leave: however long
        it is, the choices stay on screen (it scrolls instead)."""
        choices = self.query_one("#choices", Choices)
        lines = choices.get_content_height(None, None, choices.content_region.width) if choices.size.width else 1
        note = 3 if self.query_one("#note", Input).has_class("-visible") else 0
        fixed = 2 + 1 + 2 + 1 + lines + note + 1  # borders, title, preview border, margin, choices, hint
        limit = int(self.size.height * 0.92) if self.size.height else 20
        self.query_one("#preview").styles.max_height = max(3, limit - fixed)

    # -- the type-ahead guard ---------------------------------------------------------------------------------------

    def diverts(self, key: str, at: float) -> bool:
        """Whether the key pressed at `at` (monotonic seconds) belongs to typing and must go to the prompt."""
        if self.query_one("#note", Input).has_focus:
            return False  # typing the note is typing for the modal
        in_burst = self._last_diverted is not None and at - self._last_diverted < TYPING_GAP
        if at - self.opened_at < OPEN_GRACE or in_burst or key not in MODAL_KEYS:
            self._last_diverted = at
            return True
        return False

    def armed_at(self, at: float) -> bool:
        """Whether a deliberate choice could be made at `at`: past the grace period and not inside a typing burst."""
        return at - self.opened_at >= OPEN_GRACE and (
            self._last_diverted is None or at - self._last_diverted >= TYPING_GAP)

    @property
    def armed(self) -> bool:
        return self.armed_at(time.monotonic())

    def takes_click(self, pressed_at: float | None, released_at: float) -> bool:
        """A click decides only if both its press and its release came while the modal was armed."""
        if self.armed_at(released_at) and (pressed_at is None or self.armed_at(pressed_at)):
            return True
        self._click_refused_at = released_at
        self._show_guard()
        return False

    def _show_guard(self) -> None:
        refused = self._click_refused_at is not None and time.monotonic() - self._click_refused_at < 2.0
        if refused and self.armed:
            text = "That click came too soon to count: click again (or press a key) to choose"
        elif self.armed:
            text = "Choose with a key, or ←→ and Enter · PgUp/PgDn scroll the preview"
        else:
            text = "Your typing goes to the prompt; choose once you stop typing"
        guard = self.query_one("#guard", Static)
        if str(guard.render()) != text:
            guard.update(text)

    # -- deciding ---------------------------------------------------------------------------------------------------

    @on(Choices.Selected, "#choices")
    def chosen(self, event: Choices.Selected) -> None:
        if event.choice.id == "note":
            self.action_note()
        else:
            self.action_decide(event.choice.id)

    def action_decide(self, choice: str) -> None:
        if self.query_one("#note", Input).has_focus:
            return
        if choice == "allowed_prefix":
            if self.prefix:
                self.dismiss(ApprovalAnswer("allowed_prefix", command_prefix=self.prefix))
            return
        self.dismiss(ApprovalAnswer(choice))  # type: ignore[arg-type]

    def action_note(self) -> None:
        note = self.query_one("#note", Input)
        note.add_class("-visible")
        self._fit_preview()
        note.focus()

    @on(Input.Submitted, "#note")
    def deny_with_note(self, event: Input.Submitted) -> None:
        self.dismiss(ApprovalAnswer("denied", note=event.value.strip()))

    def on_key(self, event: object) -> None:
        """Esc in the note field goes back to the choices rather than denying without the note."""
        key = getattr(event, "key", "")
        note = self.query_one("#note", Input)
        if key == "escape" and note.has_focus:
            getattr(event, "stop")()
            getattr(event, "prevent_default")()
            note.remove_class("-visible")
            self._fit_preview()
            self.query_one("#choices", Choices).focus()

    def action_scroll_preview(self, direction: int) -> None:
        preview = self.query_one("#preview", VerticalScroll)
        (preview.scroll_page_down if direction > 0 else preview.scroll_page_up)(animate=False)
