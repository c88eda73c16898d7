"""The smallest Textual app that does what P8 waits for: a line of text on screen and a prompt that echoes keys.
P8 times it like `cairn resume` to report the framework's own floor (Python start-up, Textual's import, first frame)."""

from textual.app import App, ComposeResult
from textual.widgets import Input, Static


class Bare(App[None]):
    BINDINGS = [("ctrl+q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Static("End of answer 1.")
        yield Input()


if __name__ == "__main__":
    Bare().run()
