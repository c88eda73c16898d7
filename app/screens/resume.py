"""The resume screen: shown before the next turn when a reopened session had interrupted tool calls (only then: a
repaired turn with no call in flight is one notice in the chat).

It lists every recovered call (tool, arguments as wide as the screen allows, safety, NOT_STARTED / OUTCOME_UNKNOWN),
and a detail pane for the highlighted one: its full arguments as the approval showed them (a command verbatim, a file
highlighted, an edit as a diff), what the model will be told, and for `run_command` whether its process is still
running. It shows the evidence Cairn gathered when it repaired the log (`recovery/evidence`: the finding in a column,
its detail in the pane), lets the operator take that evidence as the verdict with one key (`e`) or record a verdict on
OUTCOME_UNKNOWN calls, and shows the interrupted prompt and the last
text (as Markdown). A turn the operator cancelled is worded as such, not as a crash. Each verdict is appended as
`recovery/verdict` and made durable (`save_verdict`) before its dialog closes: a `kill -9` a moment later keeps it.

Opened by Cairn itself (a session reopened with calls to review: `raised`), it is a dialog Cairn raised (SPEC §11,
`typeahead.Dialog`): keys typed while the operator was typing go to the prompt until Tab, and a letter that is none of
its keys sends the keys back there; from `/verdict` it takes keys at once. The verdict dialog (`v`) and the evidence
question (`e`) are opened by the operator's key and take keys at once; a stray letter on the evidence question is
typing, not an answer.

"Still running" means: a process with the recorded pid exists, is not a zombie, and its start time (from
/proc/<pid>/stat and the boot time) is within PID_START_SLACK of the `tool/progress` time, so a recycled pid is not
mistaken for the command. Without /proc, only `os.kill(pid, 0)` is asked, and the pane says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.markup import escape
from textual.widgets import Button, DataTable, Label, Markdown, Static

from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolCallRequest,
    ToolProgress,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from cairn.persistence.evidence import evidence_by_call
from cairn.persistence.repair import recovered_calls
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text

from ..agent.previews import preview_parts, render_parts
from ..render import summarize_arguments
from ..tools.registry import builtin_safety
from .confirm import ConfirmDialog
from .typeahead import Dialog, Typist
from .verdict import VerdictDialog


@dataclass
class RecoveredCall:
    call_id: str
    tool: str
    arguments: object
    safety: str
    status: str  # NOT_STARTED | OUTCOME_UNKNOWN
    told: str  # what the model will be told
    verdict: str = ""
    note: str = ""
    pid: int | None = None  # run_command: the process its tool/progress recorded
    started: int | None = None  # ms
    evidence: str = ""  # what Cairn found when it repaired the log: happened | did_not_happen | unknown ("" none)
    evidence_detail: str = ""


TYPING_GAP = 0.5  # seconds: an `e` this close to another key is typing (meant for the prompt), not a decision
PID_START_SLACK = 2.0  # seconds between the recorded start and the process's own start time


def process_state(pid: int, started_ms: int | None, proc: Path = Path("/proc")) -> str:
    """`running`, `not running`, or `unknown` with why: see the module docstring for what counts as running."""
    stat = proc / str(pid) / "stat"
    if proc.is_dir():
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            boot = next(int(line.split()[1]) for line in (proc / "stat").read_text().splitlines()
                        if line.startswith("btime "))
        except (OSError, IndexError, ValueError, StopIteration):
            return "not running"
        if fields[0] in ("Z", "X"):
            return "not running"
        began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        if started_ms is not None and abs(began - started_ms / 1000) > PID_START_SLACK:
            return "not running"  # the pid was reused by another process
        return "running"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "not running"
    except PermissionError:
        pass
    return "unknown (a process with that pid exists; its start time cannot be checked here)"


def ended_by_cancel(events: list[AnyEvent]) -> bool:
    """Whether the last turn ended because the operator cancelled it (not a crash repair wrote for it)."""
    end = next((e for e in reversed(events) if isinstance(e, (TurnEnd, TurnStart))), None)
    return isinstance(end, TurnEnd) and end.reason == "cancelled"


def recovered_from(events: list[AnyEvent]) -> tuple[list[RecoveredCall], str, str]:
    """The recovered calls of the last interrupted turn, its prompt and its last assistant text."""
    results = recovered_calls(events)
    start = max((i for i, e in enumerate(events) if isinstance(e, TurnStart)), default=0)
    turn = events[start:]
    requests: dict[str, ToolCallRequest] = {}
    calls: dict[str, ToolCall] = {}
    progress: dict[str, ToolProgress] = {}
    prompt, text, chunks = "", "", ""
    for e in turn:
        if isinstance(e, UserMessage):
            prompt = e.text
        elif isinstance(e, AssistantMessage):
            text, chunks = e.text or text, ""
            requests.update((c.call_id, c) for c in e.tool_calls)
        elif isinstance(e, AssistantChunk):
            chunks += e.delta
        elif isinstance(e, ToolCall):
            calls[e.call_id] = e
        elif isinstance(e, ToolProgress):
            progress[e.call_id] = e
    rows = []
    evidence = evidence_by_call(events)
    for r in results:
        request, call = requests.get(r.call_id), calls.get(r.call_id)
        found = evidence.get(r.call_id)
        rows.append(RecoveredCall(
            call_id=r.call_id,
            tool=call.name if call else (request.name if request else "?"),
            arguments=call.arguments if call else (request.arguments if request else {}),
            safety=call.safety if call else (builtin_safety(request.name if request else "") or "—"),
            status="OUTCOME_UNKNOWN" if r.error_code == TOOL_OUTCOME_UNKNOWN else "NOT_STARTED",
            told=r.content.split(": ", 1)[-1],
            pid=progress[r.call_id].pid if r.call_id in progress else None,
            started=progress[r.call_id].started if r.call_id in progress else None,
            evidence=found.finding if found else "",
            evidence_detail=found.detail if found else "",
        ))
    return rows, prompt, chunks or text


class ResumeScreen(Dialog[list[RecoveredCall]]):
    CSS_PATH = "resume.tcss"  # it says how the table, the context and the detail pane share the height

    told = getters.query_one("#told", Static)
    detail_pane = getters.query_one("#detail", VerticalScroll)

    BINDINGS = [
        Binding("v", "verdict", "Record verdict"),
        Binding("e", "accept_evidence", "Accept evidence"),
        Binding("c", "continue", "Continue to the chat"),
        Binding("i", "inspect", "Inspect log"),
        Binding("pageup", "scroll_detail(-1)", "Scroll detail", show=False, priority=True),
        Binding("pagedown", "scroll_detail(1)", "Scroll detail", show=False, priority=True),
    ]
    DIALOG_KEYS = frozenset({"v", "e", "c", "i", "enter", "escape", "up", "down", "home", "end"})
    KEYS_TEXT = "↑↓ a call · v record a verdict · e take Cairn's evidence · c continue to the chat · i inspect the log"

    def __init__(self, session_id: str, calls: list[RecoveredCall], prompt: str, last_text: str,
                 workspace: Path | str = ".", elsewhere: bool = False, cancelled: bool = False,
                 save_verdict: Callable[[str, str, str], Awaitable[None]] | None = None,
                 typist: Typist | None = None, raised: bool = False) -> None:
        super().__init__(typist=typist, by_key=not raised)
        self.session_id = session_id
        self.save_verdict = save_verdict  # makes a verdict durable before its dialog closes
        self.calls = calls
        self.prompt = prompt
        self.last_text = last_text
        self.workspace = Path(workspace)
        self.elsewhere = elsewhere  # the session's workspace is not the current directory: said above the prompt
        self.cancelled = cancelled
        self._saving = False
        self._key_times: list[float] = []  # recent printable keys: `e` in a burst of typing decides nothing

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer keys that are true: v and e only while some call is OUTCOME_UNKNOWN (a NOT_STARTED call takes no
        verdict); `c` and the detail's keys always."""
        if action in ("verdict", "accept_evidence"):
            return any(c.status == "OUTCOME_UNKNOWN" for c in self.calls)
        return True

    def on_key(self, event: Any) -> None:
        if event.character and event.character.isprintable():
            now = time.monotonic()
            self._key_times = [t for t in self._key_times if now - t < TYPING_GAP] + [now]

    def compose(self) -> ComposeResult:
        n, sid = len(self.calls), escape(safe_text(self.session_id))
        how = "You cancelled the last turn of session" if self.cancelled else "Session"
        what = "while" if self.cancelled else "was interrupted (crash or kill) —"
        title = (f"{how} {sid} {what} {n} tool call(s) were in flight" if self.cancelled
                 else f"{how} {sid} {what} {n} tool call(s) recovered")
        with Vertical():
            yield Label(title, id="title")
            with VerticalScroll(id="context"):
                if self.elsewhere:
                    yield Static(Text(safe_text(f"Runs in {self.workspace} (this session's workspace, not the current "
                                                "directory)")), id="workspace", markup=False)
                yield Static(Text(safe_text(f"Interrupted prompt: {self.prompt or '—'}")), markup=False)
                yield Static("Last text:", markup=False)
                yield Markdown(safe_text(self.last_text or "—"))
            yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="detail"):
                yield Static("", id="told")
            yield self.guard_line()
            yield Button(r"Continue to the chat \[c]", id="continue", variant="primary", compact=True)
        yield QuietFooter()

    def on_mount(self) -> None:
        self._fill_table()
        self.query_one(DataTable).focus()
        self._show_told(0)

    def _fill_table(self) -> None:
        """(Re)build the table with column widths that fit the screen: called again when a verdict changes a width."""
        table = self.query_one(DataTable)
        row = table.cursor_row if table.row_count else 0
        table.clear(columns=True)
        widths = self.column_widths()
        self._narrow = "safety" not in widths  # the detail pane then says the safety
        names = {"arguments": "args" if widths["arguments"] < 9 else "arguments"}
        for name, width in widths.items():
            table.add_column(names.get(name, name), width=width)
        for call in self.calls:
            table.add_row(*self._cells(call, widths), key=call.call_id)
        if self.calls:
            table.move_cursor(row=min(row, len(self.calls) - 1), animate=False)

    # The full order, when every column fits beside arguments 24 wide; else safety goes (the detail pane says it) and
    # arguments shrink first, so that at 80 columns tool, status, evidence, verdict and call id stay on screen.
    COLUMNS = ("tool", "arguments", "safety", "status", "evidence", "verdict", "call id")
    NARROW_COLUMNS = ("tool", "arguments", "status", "evidence", "verdict", "call id")
    VERDICT_WORDS = ("happened", "did_not_happen", "unknown")

    def column_widths(self) -> dict[str, int]:
        """Each column's width (without its padding of one each side), in the order shown. Arguments get what the
        others leave (at least 4); the verdict column is as wide as the verdicts recorded (whole words from 120
        columns); when even that does not fit, evidence and verdict are cut (to 8) before call id or status."""
        inner = int(self.app.size.width * 0.98) - 4 - 1  # the frame's border and padding, and a column of slack
        unknown = any(c.status == "OUTCOME_UNKNOWN" for c in self.calls)
        widest = {h: max([len(h), *(len(c) for c in cells)]) for h, cells in (
            ("tool", [c.tool for c in self.calls]), ("safety", [c.safety for c in self.calls]),
            ("status", [c.status for c in self.calls]), ("evidence", [c.evidence or "—" for c in self.calls]),
            ("verdict", [*(("— (press v)", *self.VERDICT_WORDS) if unknown else ()), *(c.verdict for c in self.calls)]),
            ("call id", [c.call_id for c in self.calls]))}
        if not unknown:  # every call NOT_STARTED: no evidence, no verdict to take
            del widest["evidence"], widest["verdict"]
        full = [h for h in self.COLUMNS if h == "arguments" or h in widest]
        padding = 2 * len(full)
        if inner - sum(widest.values()) - padding >= 24:
            widths = {h: widest.get(h, 0) for h in full}
            widths["arguments"] = inner - sum(widest.values()) - padding
            return widths
        if not unknown:
            widths = {h: widest.get(h, 0) for h in self.NARROW_COLUMNS if h == "arguments" or h in widest}
            widths["arguments"] = max(4, inner - sum(widths.values()) - 2 * len(widths))
            return widths
        widest["verdict"] = max([len("verdict"), len("— (v)") if unknown else 0, *(len(c.verdict) for c in self.calls)])
        padding = 2 * len(self.NARROW_COLUMNS)
        for cut in ("evidence", "verdict"):
            over = sum(widest[h] for h in self.NARROW_COLUMNS if h != "arguments") + padding + 4 - inner
            if over > 0:
                widest[cut] = max(8, widest[cut] - over)
        widths = {h: widest.get(h, 0) for h in self.NARROW_COLUMNS}
        widths["arguments"] = max(4, inner - sum(widths.values()) - padding)
        return widths

    def _cells(self, call: RecoveredCall, widths: dict[str, int]) -> tuple[Text, ...]:
        """As terminal-safe `Text`, never markup: a plain string cell would be parsed as markup, and arguments from the
        model (`ls [/tmp]`) would be mangled or crash the screen; an ESC in them would reach the terminal."""
        hint = "— (v)" if "safety" not in widths else "— (press v)"
        verdict = call.verdict or (hint if call.status == "OUTCOME_UNKNOWN" else "")
        evidence = call.evidence or ("—" if call.status == "OUTCOME_UNKNOWN" else "")
        cells = {"tool": call.tool, "arguments": summarize_arguments(call.arguments, widths["arguments"]),
                 "safety": call.safety, "status": call.status, "evidence": evidence, "verdict": verdict,
                 "call id": call.call_id}
        return tuple(Text(safe_text(cells[name]), no_wrap=True, overflow="ellipsis") for name in widths)

    def detail(self, call: RecoveredCall) -> Text:
        """The detail pane's words (besides the preview): what the model will be told and the process's state."""
        lines = []
        if call.evidence:  # first: it is what the operator decides on
            lines.append(f"Cairn checked: {call.evidence} — {call.evidence_detail}"
                         + (" (press e to take this as your verdict)" if not call.verdict else ""))
        if getattr(self, "_narrow", False):
            lines.append(f"Safety: {call.safety}")
        lines.append(f"The model will be told: {call.told}")
        if call.tool == "run_command":
            if call.pid is None:
                lines.append("Process: none recorded (the command had not started a process).")
            else:
                lines.append(f"Process: pid {call.pid} — {process_state(call.pid, call.started)}")
        if call.verdict:
            lines.append(f"Your verdict: {call.verdict}" + (f" ({call.note})" if call.note else ""))
        return Text(safe_text("\n".join(lines)))

    def _show_told(self, row: int) -> None:
        if 0 <= row < len(self.calls):
            from rich.console import Group

            call = self.calls[row]
            preview = render_parts(preview_parts(call.tool, call.arguments, self.workspace))
            self.shown_detail = Group(self.detail(call), Text(""), preview)
            self.told.update(self.shown_detail)

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_told(event.cursor_row)

    def action_scroll_detail(self, direction: int) -> None:
        detail = self.detail_pane
        (detail.scroll_page_down if direction > 0 else detail.scroll_page_up)(animate=False)

    def action_verdict(self) -> None:
        table = self.query_one(DataTable)
        if not self.calls:
            return
        call = self.calls[table.cursor_row]
        if call.status != "OUTCOME_UNKNOWN":
            self.notify("Only OUTCOME_UNKNOWN calls take a verdict: a NOT_STARTED call never ran.")
            return

        def record(result: tuple[str, str] | None) -> None:
            if result is None:
                return
            call.verdict, call.note = result
            self._fill_table()
            self._show_told(table.cursor_row)

        self.app.push_screen(VerdictDialog(call.call_id, call.tool, self.save_verdict), record)

    def action_accept_evidence(self) -> None:
        """Take Cairn's evidence as the verdict on the highlighted call, durable (`save_verdict`) before it shows."""
        table = self.query_one(DataTable)
        if not self.calls or self._saving:
            return
        now = time.monotonic()
        if sum(1 for t in self._key_times if now - t < TYPING_GAP) > 1:  # `e` amid other keys: typing, not a choice
            self.notify("That looked like typing: press e on its own to take Cairn's evidence as the verdict.")
            return
        call = self.calls[table.cursor_row]
        if call.status != "OUTCOME_UNKNOWN":
            self.notify("Only OUTCOME_UNKNOWN calls take a verdict: a NOT_STARTED call never ran.")
            return
        if not call.evidence:
            self.notify("Cairn found no evidence about this call: record a verdict with v.")
            return
        row = table.cursor_row

        def answered(yes: bool | None) -> None:
            if yes and not self._saving:
                self._saving = True
                self.run_worker(self._accept(call, row), exclusive=True, group="evidence")

        # a decision the model will be told: asked once more, and a `y` typed on the heels of the `e` does not count
        question = (f"Take Cairn's evidence as your verdict on {call.call_id} ({call.tool}): "
                    f"{call.evidence} — {call.evidence_detail}?")
        self.app.push_screen(EvidenceConfirm(safe_text(question), yes="Take it as my verdict", no="Not now",
                                             typist=self.typist, by_key=True), answered)

    async def _accept(self, call: RecoveredCall, row: int) -> None:
        from cairn.persistence.errors import CheckpointFailed

        verdict, note = call.evidence, f"accepted Cairn's evidence: {call.evidence_detail}"
        try:
            if self.save_verdict is not None:
                await self.save_verdict(call.call_id, verdict, note)
        except CheckpointFailed as e:
            self.notify(f"Verdict recorded but not durable yet ({e.cause}); Cairn tries to write it "
                        "again at the next checkpoint.", severity="warning")
        finally:
            self._saving = False
        call.verdict, call.note = verdict, note
        self._fill_table()
        self._show_told(row)

    def action_inspect(self) -> None:
        from .inspector import open_inspector

        open_inspector(self.app, self.app.store, self.session_id)  # type: ignore[attr-defined]

    @on(Button.Pressed, "#continue")
    def action_continue(self) -> None:
        self.dismiss(self.calls)


class EvidenceConfirm(ConfirmDialog):
    """The yes/no for taking evidence as the verdict: keys that arrive within TYPING_GAP of it opening are typing that
    began with an `e`, not an answer."""

    def on_mount(self) -> None:
        super().on_mount()
        self._opened = time.monotonic()

    def _settled(self) -> bool:
        return time.monotonic() - getattr(self, "_opened", 0.0) >= TYPING_GAP

    def dismiss(self, result: Any = None) -> Any:  # both ways of answering (the y key, the button) end here
        if result is True and not self._settled():
            return None
        return super().dismiss(result)
