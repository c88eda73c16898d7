"""The rewind dialogs (SPEC §9 rev 3): `/rewind` (or Esc Esc on an empty prompt) and an interrupted rewind found when a
session opens.

`RewindScreen` lists the session's prompts (turn number and first line, newest last, the newest highlighted). For the
highlighted turn it shows what rewinding to before it would do, from `plan_rewind` run in a thread (it snapshots and
hashes files): the paths the rewound turns changed and what each goes back to, the paths it leaves alone and why (not
captured then, changed only outside Cairn's turns), the conflicts (a turn changed the path, then someone else did:
asked about one path at a time, and only a yes overwrites it), and the turns that ran commands without snapshots. `u`
undoes the most recent rewind. It returns a `RewindChoice` (turn, scope, force, undo) or None; the chat screen runs the
engine.

`PendingRewindScreen` says what an interrupted rewind restored and what it did not, and returns "finish" or "abandon".

Keys typed as text decide nothing (SPEC §11, `typeahead.Dialog`): the rewind dialog is opened by the operator's key
(`/rewind`, Esc Esc) and takes keys at once; the per-path "Overwrite it?" questions and the interrupted-rewind screen
are raised by Cairn, so keys typed while the operator was typing wait in the prompt until Tab. Each lists its keys.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import getters, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from cairn.widgets.terminal_text import safe_text

from ..agent.rewind import Force, Plan, RewindRefused, Scope, last_rewind, plan_rewind
from ..agent.rewind_plan import prompts
from .confirm import ConfirmDialog
from .typeahead import Dialog, Typist


@dataclass(frozen=True)
class RewindChoice:
    to_turn: int
    scope: Scope
    force: Force = False  # True, or the paths the operator said yes to, one by one
    undo: bool = False  # undo the most recent rewind instead (to_turn and scope unused)


def first_line(text: str, width: int = 200) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def plan_text(plan: Plan, prompt: str = "") -> Text:
    """What a rewind to before `plan.to_turn` would do, as the dialog shows it."""
    n = plan.to_turn
    out = Text()
    out.append(f"Rewind to before turn {n}", style="bold")
    if prompt:
        out.append(f"  “{first_line(prompt, 60)}”", style="italic")
    out.append("\n")
    if plan.files:
        if plan.tree is not None:
            out.append(f"Paths turn {n} and later changed (commands' changes included), back to before them:\n")
        else:
            out.append(f"Files Cairn's tools changed from turn {n} on:\n")
        for f in plan.files:
            path = safe_text(f.path)
            if f.already:
                out.append(f"  {path}", style="dim")
                out.append(" — already as it was\n", style="dim")
            elif not f.restorable:
                out.append(f"  {path}")
                out.append(" — cannot be restored: its earlier content was not kept\n", style="bold red")
            else:
                what = "delete it (it did not exist)" if f.restore_sha256 is None else "restore its earlier content"
                out.append(f"  {path} — {what}")
                if f.changed_outside:
                    why = f.conflict or "changed outside Cairn"
                    out.append(f"  ⚠ {why}: asks first", style="bold yellow")
                out.append("\n")
    elif plan.tree is not None:
        out.append(f"Nothing turn {n} or a later one changed needs to go back.\n", style="dim")
    else:
        out.append(f"No file was changed by Cairn's file tools from turn {n} on.\n", style="dim")
    if plan.not_restored:
        out.append("Not restored (left as they are):\n")
        for path, why in plan.not_restored:
            out.append(f"  {safe_text(path)}", style="yellow")
            out.append(f" — {safe_text(why)}\n", style="dim")
    if plan.command_turns:
        turns = ", ".join(map(str, plan.command_turns))
        word = "turns" if len(plan.command_turns) > 1 else "turn"
        out.append(f"Commands ran in {word} {turns}: what they changed cannot be restored.\n", style="yellow")
    out.append(f"Conversation: the model continues from before turn {n}; the log keeps every turn.", style="dim")
    return out


class RewindScreen(Dialog[RewindChoice | None]):
    """Pick a turn; restore files, the conversation, or both, to before it (or cancel). `typist`: the chat's prompt,
    for the per-path questions Cairn raises."""

    CSS_PATH = "rewind.tcss"

    turn_list = getters.query_one("#turns", OptionList)
    plan_label = getters.query_one("#plan-text", Static)
    plan_box = getters.query_one("#plan", VerticalScroll)

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("f", "choose('files')", "Files", show=False),
        Binding("c", "choose('conversation')", "Conversation", show=False),
        Binding("b", "choose('both')", "Both", show=False),
        Binding("u", "undo", "Undo the last rewind", show=False),
        Binding("pageup", "scroll_plan(-1)", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_plan(1)", "Scroll", show=False, priority=True),
    ]
    KEYS_TEXT = "↑↓ choose the turn · Enter = both · PgUp/PgDn scroll the plan"

    def __init__(self, events: list[Any], workspace: Path | str, blobs: Any, repo: Any = None,
                 typist: Typist | None = None) -> None:
        super().__init__()
        self.confirm_typist = typist
        self.events = list(events)
        self.workspace = Path(workspace)
        self.blobs = blobs
        self.repo = repo  # the workspace's shadow repository (snapshot rewinds), or None
        self.turns = prompts(self.events)
        self.undoable = last_rewind(self.events) is not None
        self.plan: Plan | None = None  # for the highlighted turn, once computed
        self._asking = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Rewind: undo a turn and every turn after it (↑↓ choose the turn)", id="title")
            yield OptionList(*(Option(Text(safe_text(f"{turn:>3}  {first_line(text) or '(empty prompt)'}")),
                                      id=str(turn)) for turn, text in self.turns), id="turns")
            with VerticalScroll(id="plan"):
                yield Static("" if self.turns else "This session has no turns yet: there is nothing to rewind.",
                             id="plan-text", markup=False)
            with Horizontal(id="buttons"):
                yield Button(r"Files \[f]", id="files", variant="primary", compact=True)
                yield Button(r"Conversation \[c]", id="conversation", compact=True)
                yield Button(r"Both \[b]", id="both", compact=True)
                if self.undoable:
                    yield Button(r"Undo the last rewind \[u]", id="undo", compact=True)
                yield Button(r"Cancel \[esc]", id="cancel", compact=True)
            yield self.guard_line()

    def on_mount(self) -> None:
        options = self.turn_list
        options.focus()
        if self.turns:
            options.highlighted = len(self.turns) - 1  # the newest: undoing the last turn is the common case

    @property
    def selected_turn(self) -> int | None:
        index = self.turn_list.highlighted
        return self.turns[index][0] if index is not None and 0 <= index < len(self.turns) else None

    @on(OptionList.OptionHighlighted, "#turns")
    def highlighted(self) -> None:
        turn = self.selected_turn
        if turn is not None:
            self.plan = None
            self.plan_label.update(Text(f"Looking at the files of turn {turn} on…", style="dim"))
            self._compute(turn)

    @work(exclusive=True, group="plan")
    async def _compute(self, turn: int) -> None:
        try:
            plan = await asyncio.to_thread(plan_rewind, self.events, self.workspace, turn, self.blobs, self.repo)
        except RewindRefused as e:
            self.plan_label.update(Text(safe_text(str(e)), style="red"))
            return
        if turn != self.selected_turn:
            return
        self.plan = plan
        prompt = dict(self.turns).get(turn, "")
        self.plan_label.update(plan_text(plan, prompt))

    @on(OptionList.OptionSelected, "#turns")
    def selected(self) -> None:
        self.action_choose("both")

    @on(Button.Pressed, "#files")
    def _files(self) -> None:
        self.action_choose("files")

    @on(Button.Pressed, "#conversation")
    def _conversation(self) -> None:
        self.action_choose("conversation")

    @on(Button.Pressed, "#both")
    def _both(self) -> None:
        self.action_choose("both")

    def action_choose(self, scope: Scope) -> None:
        turn, plan = self.selected_turn, self.plan
        if turn is None or self._asking:
            return
        if plan is None or plan.to_turn != turn:
            self.notify("Still looking at the files of that turn: a moment.", markup=False)
            return
        changed = [f for f in plan.files if f.changed_outside] if scope in ("files", "both") else []
        if not changed:
            self.dismiss(RewindChoice(turn, scope))
            return
        self._asking = True
        self._ask_each(turn, scope, changed)

    @work(exclusive=True, group="ask")
    async def _ask_each(self, turn: int, scope: Scope, changed: list[Any]) -> None:
        """One question a conflicting path: only the paths the operator says yes to are overwritten."""
        yes: set[str] = set()
        try:
            for n, item in enumerate(changed, 1):
                why = item.conflict or "changed outside Cairn since Cairn last wrote it"
                question = (f"({n} of {len(changed)}) {item.path}: {why}. Restoring it to before turn {turn} "
                            "overwrites what is there now. Overwrite it?")
                if await self.app.push_screen_wait(ConfirmDialog(safe_text(question), yes="Overwrite",
                                                                 no="Leave it", typist=self.confirm_typist)):
                    yes.add(item.path)
        finally:
            self._asking = False
        self.dismiss(RewindChoice(turn, scope, force=frozenset(yes)))

    @on(Button.Pressed, "#undo")
    def action_undo(self) -> None:
        if self.undoable and not self._asking:
            self.dismiss(RewindChoice(0, "both", undo=True))

    def action_scroll_plan(self, direction: int) -> None:
        plan = self.plan_box
        (plan.scroll_page_down if direction > 0 else plan.scroll_page_up)(animate=False)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


def pending_text(plan: Any, done: set[str]) -> Text:
    """What an interrupted rewind (its `rewind/plan` and the paths recorded restored) did and did not do."""
    out = Text()
    out.append(f"A rewind to before turn {plan.to_turn} was interrupted (Cairn stopped before it ended).\n\n",
               style="bold")
    restored = [f.path for f in plan.files if f.path in done]
    left = [f.path for f in plan.files if f.path not in done]
    out.append("Restored: " + (", ".join(map(safe_text, restored)) or "none") + "\n")
    out.append("Not restored yet: " + (", ".join(map(safe_text, left)) or "none") + "\n")
    if plan.conversation:
        out.append(f"Conversation: not yet rewound to before turn {plan.to_turn}.\n")
    out.append("\nFinish restores what is left (a file changed since the plan is left alone and named); abandon keeps "
               "the workspace and conversation as they are now.", style="dim")
    return out


class PendingRewindScreen(Dialog[str | None]):
    """An interrupted rewind: finish it or abandon it, before the next turn. Raised by Cairn: given the chat's
    `typist`, keys typed while the operator was typing wait in the prompt until Tab."""

    CSS_PATH = "rewind.tcss"

    finish_button = getters.query_one("#finish", Button)

    BINDINGS = [
        Binding("f", "settle('finish')", "Finish", show=False),
        Binding("a", "settle('abandon')", "Abandon", show=False),
    ]
    DIALOG_KEYS = frozenset({"f", "a", "enter"})
    KEYS_TEXT = "f finish the rewind · a abandon it · Enter the highlighted button"

    def __init__(self, plan: Any, done: set[str], typist: Typist | None = None) -> None:
        super().__init__(typist=typist)
        self.plan = plan
        self.done = done

    def compose(self) -> ComposeResult:
        with Vertical():
            with VerticalScroll():
                yield Static(pending_text(self.plan, self.done), id="pending", markup=False)
            with Horizontal():
                yield Button(r"Finish the rewind \[f]", id="finish", variant="primary", compact=True)
                yield Button(r"Abandon it \[a]", id="abandon", compact=True)
            yield self.guard_line()

    def on_mount(self) -> None:
        self.finish_button.focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.action_settle(event.button.id or "")

    def action_settle(self, how: str) -> None:
        if how in ("finish", "abandon"):
            self.dismiss(how)
