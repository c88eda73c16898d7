"""A tool-call card: a live status, the safety class, the name and an arguments summary, with the output expandable.

The title puts what matters first — status, then safety — and the arguments last, cut with an ellipsis at whatever
width the card has, so at 80 columns a running side effect still says `⟳ running [side_effecting]`. The two recovery
outcomes look different: NOT_STARTED (safe to retry) in the accent colour, OUTCOME_UNKNOWN (verify first) in a heavy
error-coloured border, each with its word.

Every card shows a safety class, whatever its outcome (SPEC §11 rev 4). A call that never got its `tool/call`
(NOT_STARTED, denied, aborted before dispatch, cut off) has none recorded: a built-in tool's class is known by its name
(`BUILTIN_SAFETY`, without importing the tool registry, which the TUI loads after its first frame); any other tool's is
the class its earlier calls in the session recorded (the transcript looks them up), else the card says `safety
unknown` in words rather than a bare `?`.

Name, arguments and output come from the model and the tools: they are made terminal-safe (`safe_text`) and given to
widgets as `Text` or with markup off, never parsed as markup.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Collapsible, Static
from textual.widgets._collapsible import CollapsibleTitle

from .terminal_text import safe_text, summarize_arguments

STATUS_LABELS = {
    "queued": "… queued",
    "awaiting approval": "⏸ awaiting approval",
    "running": "⟳ running",
    "done": "✔ done",
    "error": "✘ error",
    "denied": "✘ denied",
    "aborted": "⊘ aborted",
    "not started": "⊘ NOT_STARTED",
    "outcome unknown": "⚠ OUTCOME_UNKNOWN",
    "truncated": "✂ TRUNCATED, not run",
}

STATUS_STYLES = {
    "not started": "bold $accent",
    "outcome unknown": "bold $error",
    "error": "bold $error",
    "denied": "bold $error",
    "done": "$success",
}
SAFETY_CLASSES = ("read_only", "idempotent", "side_effecting")
# the built-in tools' classes (app/tools/registry.py; tests/test_card_safety.py keeps the two equal): a card drawn from
# history before the registry is imported still shows them
BUILTIN_SAFETY = {"list_dir": "read_only", "read_file": "read_only", "search_text": "read_only",
                  "find_files": "read_only", "write_file": "idempotent", "edit_file": "side_effecting",
                  "run_command": "side_effecting"}
UNKNOWN_SAFETY = "safety unknown"


def safety_label(safety: str | None, name: str) -> str:
    """The safety class a card shows: the recorded one, else a built-in tool's, else `safety unknown`."""
    if safety and safety != "?":
        return safety
    return BUILTIN_SAFETY.get(name, UNKNOWN_SAFETY)


SUMMARY_LIMIT = 400  # the title's Text crops the summary to the card's width with an ellipsis

ERROR_STATUS = {
    "TOOL_NOT_STARTED": "not started",
    "TOOL_OUTCOME_UNKNOWN": "outcome unknown",
    "ABORTED_BEFORE_DISPATCH": "aborted",
    "DENIED": "denied",
    "TRUNCATED": "truncated",
}


def status_for(error_code: str | None) -> str:
    if error_code is None:
        return "done"
    return ERROR_STATUS.get(error_code, "error")


class OutputFold(Static):
    """A card's folded output line, drawn as Textual's `Collapsible` draws its collapsed title (` ▶ output (N lines)`
    on the surface colour) but as one widget instead of four: a history card costs two widgets until its output is
    first opened, and a long session opens with a screenful of cards (P8). A click opens the output."""

    ALLOW_SELECT = False
    DEFAULT_CSS = """
    OutputFold { width: 1fr; height: auto; padding: 0 0 0 1; background: $surface; pointer: pointer;
                 color: $block-cursor-blurred-foreground; text-style: $block-cursor-blurred-text-style; }
    OutputFold:hover { background: $block-hover-background; color: $foreground; }
    """

    async def on_click(self, event: events.Click) -> None:
        event.stop()
        card = self.parent
        if isinstance(card, ToolCard):
            await card.action_toggle_output()


class ToolCard(Vertical, can_focus=True):
    """Focusable (Tab / Shift+Tab move through the cards): Enter or Space expands and collapses its output. The output
    is a `Collapsible` built the first time it is opened; until then one `OutputFold` line stands for it."""

    BINDINGS = [Binding("enter,space", "toggle_output", "Output", show=False)]

    DEFAULT_CSS = """
    ToolCard { height: auto; border: round $primary 40%; padding: 0 1; margin: 0 0 1 2; }
    ToolCard .title { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    ToolCard.-done { border: round $success 50%; }
    ToolCard.-error, ToolCard.-denied, ToolCard.-aborted { border: round $error 60%; }
    ToolCard.-not-started { border: round $accent; }
    ToolCard.-outcome-unknown { border: heavy $error; }
    ToolCard.-truncated { border: round $warning; }
    ToolCard Collapsible { padding: 0; border: none; }
    ToolCard:focus { background: $boost; border-left: thick $accent; }
    """

    status: reactive[str] = reactive("running")

    def __init__(self, call_id: str, name: str, arguments: object, safety: str) -> None:
        super().__init__(id=None)
        self.call_id = call_id
        self.tool_name = name
        self.arguments = arguments
        self.safety = safety
        self._title = Static(classes="title")
        self._output_text = ""  # terminal-safe
        self._output_title = "output"
        self._fold = OutputFold(markup=False)
        self._collapsible: Collapsible | None = None  # built when the output is first opened
        self._output: Static | None = None  # inside it

    def compose(self) -> ComposeResult:
        yield self._title
        yield self._fold

    def on_mount(self) -> None:
        self._fold.display = False  # (as before: a card read from history shows no output line)
        self._refresh_title()

    @property
    def has_output(self) -> bool:
        """An output line is shown (folded or open)."""
        return bool(self._fold.display or (self._collapsible is not None and self._collapsible.display))

    @property
    def expanded(self) -> bool:
        return self._collapsible is not None and not self._collapsible.collapsed

    async def action_toggle_output(self) -> None:
        if not self.has_output:
            return
        if self._collapsible is None:
            self._output = Static(self._output_text, markup=False)
            self._collapsible = Collapsible(self._output, title=self._output_title, collapsed=False)
            self._fold.display = False
            await self.mount(self._collapsible, after=self._fold)
            for title in self._collapsible.query(CollapsibleTitle):
                title.can_focus = False  # the card itself is the one Tab stop
        else:
            self._collapsible.collapsed = not self._collapsible.collapsed

    def watch_status(self, old: str, new: str) -> None:
        # a card built from history goes queued → running → done before it is mounted: restyling it each time (as
        # Textual does for a class change, attached or not) cost ~1 ms a card at open (P8); mounting styles it once
        attached = self.is_attached
        self.remove_class(f"-{old.replace(' ', '-')}", update=attached)
        self.add_class(f"-{new.replace(' ', '-')}", update=attached)
        if self.is_mounted:
            self._refresh_title()

    def _refresh_title(self) -> None:
        title = Content.assemble(
            (STATUS_LABELS.get(self.status, self.status), STATUS_STYLES.get(self.status, "bold")),
            (f"  [{safe_text(self.shown_safety)}]  ", "dim"),
            (safe_text(self.tool_name), "bold"),
            f"({safe_text(summarize_arguments(self.arguments, SUMMARY_LIMIT))})",
        )
        self._title.update(title)

    @property
    def shown_safety(self) -> str:
        return safety_label(self.safety, self.tool_name)

    @property
    def safety_known(self) -> bool:
        return self.shown_safety != UNKNOWN_SAFETY

    def set_safety(self, safety: str) -> None:
        self.safety = safety
        self._refresh_title()

    def set_result(self, content: str, error_code: str | None) -> None:
        self.status = status_for(error_code)
        self._output_text = safe_text(content)
        lines = content.count("\n") + 1
        self._output_title = f"output ({lines} line{'s' if lines != 1 else ''})"
        self._fold.update(Content.assemble("▶", " ", self._output_title))
        if self._collapsible is None or self._output is None:
            self._fold.display = bool(content)
        else:
            self._output.update(self._output_text)
            self._collapsible.title = self._output_title
            self._collapsible.display = bool(content)
