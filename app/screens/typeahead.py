"""No keystroke typed as text decides anything (SPEC §11 rev 4).

A dialog Cairn opens by itself (an approval, a confirmation it raises) while the operator is typing — a key other than
the Enter that sent the prompt within TYPING_WINDOW seconds, or a non-empty prompt — leaves the keys in the prompt, in
order, no character lost, and takes a decision only once the operator moves to it on purpose with Tab (the dialog says
so: "typing… Tab to decide"). Opened on an idle, empty prompt it takes keys at once. Typing is judged by each key's own
time (`events.Key.time`, stamped when the terminal's bytes were read), never by when the key is processed: a key
pressed before the dialog was on screen is typing, whenever it reaches the app.

Once a dialog raised by Cairn has the keys:
- Tab (and Shift+Tab) change nothing it decides: they are swallowed;
- a printable key that is none of the dialog's own is typing again: it goes to the prompt and the dialog waits for Tab;
- a text field of its own (the approval's note) takes letters as text, and they never choose.
A mouse button pressed on a dialog that waits for Tab does what Tab does (the dialog takes the keys) and decides
nothing.

A dialog the operator opened with a key (`v` the verdict, `/rewind`, `e` the evidence question) takes keys at once: it
is built without a typist, or with one and `by_key` (then a stray letter on it is still typing). Dialogs never let a
toast cover their choices: the app's toasts are hidden on a dialog (they stay on the chat beneath it), the chat puts
what it reports meanwhile in the transcript (`ChatScreen._toast`), and a dialog's own notices go to its keys line.

What counts as typing is kept by `KeyRouter`: every key that edits the chat's prompt (a printable key, Backspace,
Delete, Enter, Ctrl+J…) and every key a held dialog sends on to the prompt, by its own time. The Enter that sends a
prompt is not typing, and the keys before it were that prompt's (sent, not typing any more): the prompt records that
Enter's own time (`PromptInput.sent_at`), and only a key after it counts. Keys a dialog takes as its own are not
typing, nor are the chat's command keys (Esc, Esc Esc that opens the rewind dialog, F1, Ctrl+T, PgUp/PgDn, Tab).
`CairnApp.on_event` hands every input event (keys, mouse buttons, pastes) to `KeyRouter.route` before Textual does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, TypeVar

from textual import events, on
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Static, TextArea

if TYPE_CHECKING:
    from cairn.widgets.prompt_input import PromptInput

TYPING_WINDOW = 1.5  # seconds: a key this recent (other than the Enter that sent a prompt) means the operator types
# keys that reach a dialog whatever its state: they decide nothing (Ctrl+Q quits; PgUp/PgDn scroll a preview)
PASS_KEYS = frozenset({"ctrl+q", "pageup", "pagedown"})
HELD_TEXT = "typing… your keys go to the prompt · Tab to decide"
# keys that edit the prompt's text besides the printable ones: typing too (Esc, F1, Ctrl+T, PgUp… are commands)
EDIT_KEYS = frozenset({"backspace", "delete", "enter", "ctrl+j", "alt+enter", "ctrl+w", "ctrl+u", "ctrl+k"})
SAID_FOR = 6.0  # seconds a dialog's own notice stays on its keys line
DIALOG_CSS = Path(__file__).resolve().with_name("typeahead.tcss")  # every dialog's: toasts hidden, the keys line


class Typist(Protocol):
    """Where a dialog raised by Cairn sends the keys that are typing, and whether the operator was typing."""

    def typing_at(self, at: float) -> bool: ...

    def take_key(self, key: str, character: str | None, at: float) -> None: ...

    def take_paste(self, text: str, at: float) -> None: ...


class KeyRouter:
    """The chat's typist: remembers the last key typed at the chat (by its own time) and replays held keys into the
    prompt. One per chat screen; the app hands it every input event first (`route`)."""

    def __init__(self, chat: Screen[Any], prompt: Callable[[], "PromptInput | None"]) -> None:
        self.chat = chat
        self.prompt = prompt
        self.last_typed_at: float | None = None

    def note(self, at: float) -> None:
        if self.last_typed_at is None or at > self.last_typed_at:
            self.last_typed_at = at

    def typing_at(self, at: float) -> bool:
        prompt = self.prompt()
        if prompt is not None and prompt.text:
            return True
        last = self.last_typed_at
        if last is None or (prompt is not None and prompt.sent_at is not None and last <= prompt.sent_at):
            return False  # nothing typed, or only the prompt that was sent (and its Enter)
        return at - last < TYPING_WINDOW

    def take_key(self, key: str, character: str | None, at: float) -> None:
        self.note(at)
        prompt = self.prompt()
        if prompt is not None:
            prompt.take_typed(key, character, at)

    def take_paste(self, text: str, at: float) -> None:
        self.note(at)
        prompt = self.prompt()
        if prompt is not None and text:
            prompt.insert(text)

    def route(self, screen: Screen[Any], event: events.Event) -> bool:
        """True when the event was taken here (a held dialog's key went to the prompt, or was swallowed); False lets
        Textual deliver it as usual."""
        if isinstance(event, events.Key):
            if event.key == "ctrl+q":
                return False
            if screen is self.chat:
                if event.is_printable or event.key in EDIT_KEYS:
                    self.note(event.time)  # (an Enter that sends is told apart later: `PromptInput.sent_at`)
                return False
        if isinstance(screen, Dialog) and screen.typist is self:
            return screen.route(event)
        return False


ResultT = TypeVar("ResultT")


class Dialog(ModalScreen[ResultT]):
    """A dialog that changes something. With a `typist` it was raised by Cairn and holds typed keys as the module
    docstring says; `by_key` (with a typist) for one the operator's own key opened, which takes keys at once but still
    sends a stray letter to the prompt. Subclasses yield `self.guard_line()` where the dialog's keys are listed and
    say which keys are theirs (`DIALOG_KEYS`; a printable key outside them is typing)."""

    DIALOG_KEYS: ClassVar[frozenset[str]] = frozenset()
    KEYS_TEXT: ClassVar[str] = ""  # the dialog's keys, shown on it once it has them

    def __init__(self, *, typist: Typist | None = None, by_key: bool = False, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.css_path = [DIALOG_CSS, *self.css_path]  # the rules all dialogs share, then the subclass's CSS_PATH
        self.typist = typist
        self.by_key = by_key
        # raised by Cairn: every key is typing until the dialog is mounted and found the operator idle
        self.held = typist is not None and not by_key
        self.shown_at: float | None = None if self.held else 0.0
        self.said = ""  # a notice of the dialog's own (shown on its line instead of a toast)
        self._said_at = 0.0
        self._swallow_mouse_up = False

    # -- what the dialog shows ----------------------------------------------------------------------------------------

    def guard_line(self) -> Static:
        return Static(self.guard_text(), id="guard", classes="guard -held" if self.held else "guard", markup=False)

    def dialog_keys(self) -> frozenset[str]:
        """The keys that mean something on this dialog now (a printable key outside them is typing)."""
        return self.DIALOG_KEYS

    def keys_text(self) -> str:
        """The keys line once the dialog has the keys (subclasses may say more, e.g. while a note is typed)."""
        return self.KEYS_TEXT

    @property
    def saying(self) -> bool:
        return bool(self.said) and time.monotonic() - self._said_at < SAID_FOR

    def guard_text(self) -> str:
        if self.held:
            return HELD_TEXT
        return self.said if self.saying else self.keys_text()

    def show_guard(self) -> None:
        text = self.guard_text()
        for guard in self.query("#guard").results(Static):
            guard.set_class(self.held, "-held")
            guard.set_class(self.saying and not self.held, "-said")
            if str(guard.render()) != text:
                guard.update(text)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """A dialog's own notice goes to its keys line (a toast would cover the choices), for a few seconds."""
        self.said = message
        self._said_at = time.monotonic()
        self.show_guard()
        self.set_timer(SAID_FOR + 0.1, self.show_guard)

    @property
    def takes_keys(self) -> bool:
        """Whether a key pressed now would reach the dialog's choices."""
        return not self.held and self.shown_at is not None

    @on(events.Mount)
    def _dialog_mounted(self) -> None:
        """On screen from this frame: decide once whether the operator was typing when it appeared (a key pressed
        before this moment and handled after it is typing too: `_route_key`)."""
        if self.shown_at is None and self.typist is not None:
            self.shown_at = time.monotonic()
            self.held = self.typist.typing_at(self.shown_at)
            if not self.held:
                self.keys_taken()
        self.show_guard()

    def hold(self) -> None:
        if not self.held:
            self.held = True
            self.show_guard()

    def take_keys(self) -> None:
        """The operator moved to the dialog on purpose (Tab, or a click)."""
        if self.shown_at is None:
            self.shown_at = time.monotonic()
        if self.held:
            self.held = False
            self.show_guard()
            self.keys_taken()

    def keys_taken(self) -> None:
        """Hook: the dialog has the keys now (e.g. focus its choices)."""

    # -- routing ----------------------------------------------------------------------------------------------------

    def typing_into_field(self) -> bool:
        return isinstance(self.focused, (Input, TextArea))

    def route(self, event: events.Event) -> bool:
        typist = self.typist
        if typist is None:
            return False
        if isinstance(event, events.Key):
            return self._route_key(typist, event)
        if isinstance(event, events.Paste):
            if self.held or self.shown_at is None or not self.typing_into_field():
                typist.take_paste(event.text, event.time)
                self.hold()
                return True
            return False
        if isinstance(event, events.MouseDown):
            if self.held or self.shown_at is None or event.time < self.shown_at:
                self._swallow_mouse_up = True
                self.take_keys()  # a click on it is moving to it on purpose; it decides nothing
                return True
            return False
        if isinstance(event, events.MouseUp) and self._swallow_mouse_up:
            self._swallow_mouse_up = False
            return True
        return False

    def _route_key(self, typist: Typist, event: events.Key) -> bool:
        key, at = event.key, event.time
        if key in PASS_KEYS:
            return False
        if self.shown_at is None or at < self.shown_at:  # pressed before the dialog was there: typing
            self.hold()
            typist.take_key(key, event.character, at)
            return True
        if self.held:
            if key == "tab":
                self.take_keys()
            else:
                typist.take_key(key, event.character, at)
            return True
        if key in ("tab", "shift+tab"):
            return True  # the dialog has the keys: Tab changes nothing it decides
        if self.typing_into_field():
            return False
        if event.is_printable and key not in self.dialog_keys():  # a letter of none of its choices: typing again
            self.hold()
            typist.take_key(key, event.character, at)
            return True
        return False
