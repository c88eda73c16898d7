"""The help screen (F1, or `?` in an empty prompt): every key on every screen and every slash command, in one place,
so the footer can stay short."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from cairn.widgets.quiet_footer import QuietFooter

from ..slash_commands import COMMANDS

KEYS = (
    ("chat", "Enter", "send the prompt (while a turn runs it is queued and shown)"),
    ("chat", "Ctrl+J / Alt+Enter", "new line in the prompt"),
    ("chat", "↑ / ↓", "earlier / later prompts: first the queued ones (newest first), then the history"),
    ("queued", "Enter / Ctrl+R / Esc", "after ↑ brought a queued prompt back: put it back in its place / remove it / "
                                       "leave it as it was (the queue waits meanwhile)"),
    ("chat", "/", "slash commands, with completion (Tab completes)"),
    ("chat", "@path + Tab", "attach a workspace file: Tab completes the path (.gitignore respected); its content goes "
                            "with the prompt"),
    ("chat", "!command", "run a shell command yourself, in the workspace; its output is shown and goes to the model "
                         "with your next prompt"),
    ("chat", "Esc", "cancel the running turn (it still ends with real step/end + turn/end)"),
    ("chat", "Esc Esc", "on an empty prompt between turns: rewind (the same as /rewind)"),
    ("chat", "PageUp / PageDown", "scroll the transcript (Home / End from an empty prompt: top / bottom)"),
    ("chat", "Ctrl+T", "open or fold the latest reasoning block"),
    ("chat", "Tab / Shift+Tab", "move between the prompt, tool cards, reasoning blocks, compaction lines and "
                                "the code blocks of answers"),
    ("chat", "Enter / Space", "on a tool card: expand or collapse its output; on a reasoning block or a compaction "
                              "line: open or fold it"),
    ("chat", "Ctrl+G", "copy the last answer to the clipboard (OSC 52: over ssh too; in tmux with set-clipboard "
                       "on); /copy does the same"),
    ("chat", "c / y", "on an answer's code block (Tab to it; Tab / Shift+Tab move between its blocks): copy that "
                      "block whole"),
    ("chat", "Ctrl+O", "sessions (asks first if a turn is running)"),
    ("chat", "Ctrl+P", "command palette: the slash commands, themes (the theme you pick is kept)"),
    ("chat", "F1 / ?", "this help (? in an empty prompt)"),
    ("any dialog", "Tab", "a dialog Cairn opens by itself (an approval, a question it raises) while you are typing — "
                          "text typed in the last 1.5 s (not counting the prompt you sent with Enter), or text in the "
                          "prompt — says \"typing… Tab to decide\": your keys go on into the prompt, none is lost and "
                          "none decides, until Tab (or a click) moves you to the dialog. Opened on an idle, empty "
                          "prompt it takes keys at once; so does a dialog you opened with a key (v, /rewind). Once it "
                          "has the keys, Tab changes nothing, and a letter that is none of its keys goes back to the "
                          "prompt"),
    ("approval", "a", "allow this call once"),
    ("approval", "s", "allow this tool for the rest of the session (/permissions revokes)"),
    ("approval", "p", "run_command only: allow commands starting with the same word (no ; | & $ > in them)"),
    ("approval", "d / Esc", "deny"),
    ("approval", "n", "deny, and type a note the model receives"),
    ("approval", "←→ Enter, PgUp/PgDn", "choose (nothing is highlighted at first); scroll the preview. A click "
                                       "on a dialog that waits for Tab only moves you to it"),
    ("approval", "Enter / Esc", "in the note: deny with the note / back to the choices (its letters are text)"),
    ("resume", "↑ / ↓", "choose a recovered call: its detail pane shows everything about it"),
    ("resume", "v / e / c / i", "record a verdict on an OUTCOME_UNKNOWN call / take Cairn's evidence as the "
                             "verdict (asks y / n) / continue to the chat / inspect the log"),
    ("resume", "PgUp / PgDn", "scroll the detail pane"),
    ("rewind", "↑↓ / f / c / b", "choose the first turn to undo / restore its files / the conversation / both (each "
                                 "path someone else changed too is asked about: y overwrites it, n leaves it)"),
    ("rewind", "Enter / u / Esc", "both / undo the last rewind / cancel; PgUp/PgDn scroll the plan"),
    ("rewind", "f / a", "an interrupted rewind: finish it / abandon it"),
    ("verdict", "h / n / u, ↑↓", "choose: it happened / it did not happen / leave it unknown (nothing is "
                                "preselected); a letter moves you on to the note"),
    ("verdict", "Tab / Enter / Esc", "between the list and the note / record the chosen answer with the note as "
                                    "typed (its letters never change the answer) / cancel"),
    ("yes / no", "y / n, Esc / Enter", "yes / no / the highlighted button (No at first)"),
    ("sessions", "Enter / n / i / x / Esc", "open or resume / new session / inspect read-only / delete (asks first) / back"),
    ("sessions", "h", "only the sessions one host writes, the next host at each press, then all again (PostgreSQL)"),
    ("attach", "r / q, Esc", "`cairn attach ID`, a session another process writes (read-only; its approvals are "
                             "decided there): once its writer ended, resume it here / leave"),
    ("attach", "PgUp / PgDn, Home / End", "scroll; the top / follow the end again"),
    ("anywhere", "Ctrl+Q", "quit in order: cancel the turn, write its closing events, flush, unlock"),
)


def help_table() -> Table:
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, expand=True)
    table.add_column("where", style="dim", no_wrap=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("does", ratio=1)
    for where, key, does in KEYS:
        table.add_row(where, key, does)
    for command in COMMANDS:
        table.add_row("prompt", command.usage, command.help)
    return table


class HelpScreen(ModalScreen[None]):
    CSS_PATH = "help.tcss"

    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Cairn — keys and commands", id="title")
            with VerticalScroll():
                yield Static(help_table())
                yield Static(Text("\nStart a prompt with // to send a text beginning with / to the model.",
                                  style="dim"))
        yield QuietFooter()

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
