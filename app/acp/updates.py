"""How a Cairn session looks to an ACP client: session events as `session/update` payloads.

Two views of the same log, both derived from events only (the log is the source of truth):

- `LiveView.updates(event)` follows the loop while a turn runs: `agent_thought_chunk` for each reasoning chunk,
  `agent_message_chunk` for each assistant chunk; `tool_call` (status `pending`) for each call the model asks for, as
  soon as its `assistant/message` is recorded; `tool_call_update` `in_progress` when its `tool/call` is recorded
  (approved, about to run); `tool_call_update` `completed` or `failed` when its `tool/result` is recorded. A denied call
  never gets `in_progress`: it goes straight from `pending` to `failed` with DENIED.
- `replay(events)` redraws the whole history for `session/load`: every prompt as `user_message_chunk` (attached files
  folded back to their names), every step's reasoning as one `agent_thought_chunk` and its text as one
  `agent_message_chunk`, and every tool call once, as a `tool_call` carrying its final status and result — the same
  content, `rawOutput` and `_meta` as the live `tool_call_update` that finished it, diffs included (below). How a
  turn ended is said as it happened: a turn crash repair closed gets a short agent message before its recovered calls
  ("Cairn stopped here (crash or kill) …"); a turn the user cancelled (`session/cancel`, a dismissed permission
  request, a disconnect — answered live with the stop reason `cancelled`) ends with "The turn was cancelled."; a turn
  that ended in an error, with that error (live, the prompt's JSON-RPC error). Each of these markers carries
  `_meta.cairn.turn_end` (`interrupted`, `cancelled`, `error`); a cancelled turn's marker also carries the live
  `stop_reason`.

What a person needs to decide about a call is in the call itself, not only in its title: `run_command` carries the full
command as a text block; `write_file`/`edit_file` carry `diff` content (`path`, `oldText` — null for a new file —,
`newText`: the whole file before and after) read from the workspace when the call is announced, in the permission
request and again on completion; file tools carry `locations`. Titles are short and readable ("Run `make test`",
"Edit `src/a.py`").

A replay cannot read the file as it was, so it rebuilds the same whole-file diff from what the log holds: the call's
before-image (SPEC §9: stored by `before_sha256`, fetched through `before_image`) is `oldText` — none for a file that
did not exist —, and `newText` is what the call's arguments make of it, checked against the call's `after_sha256`.
When that cannot be done (a log without fingerprints, a before-image not kept — too large, holding a secret —, or a
rebuilt text that does not match the fingerprint), the call carries no diff and a text block says why: never a diff
of something else (a fragment, today's file).

Every result carries its outcome twice: as text starting with its status word (`OUTCOME_UNKNOWN: …`, the same word
live and after a crash), and machine-readable in `rawOutput` and `_meta.cairn` (`status`, `error_code`, `safety`,
`recovered` — true only for a result crash repair wrote (`repaired_results`), never for a call a cancel cut short —,
and `verdict` once an operator gave one). A recovered call Cairn could check after the crash (SPEC §9 rev 3: a file
tool's path against its fingerprints, a command's process) also carries that evidence: `_meta.cairn.evidence` and
`rawOutput.evidence` (`{"finding", "detail"}`), and a text block after the result ("Cairn checked after the crash: …").

Text sent to the editor is data, not terminal output, so control characters go out as JSON escapes, unchanged. Lone
surrogates are the exception (`wire`): the package's encoder would send them as `\\ud800` escapes, which strict JSON
parsers (Rust's serde_json, in Zed) refuse, losing the whole message; they go out as U+FFFD, as the log stores them.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar, Union

from acp import (
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    FileEditToolCallContent,
    TerminalToolCallContent,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolKind,
    UserMessageChunk,
)

from cairn.persistence.events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    OperatorCommand,
    OperatorResult,
    ReasoningChunk,
    RecoveryEvidence,
    RecoveryVerdict,
    StepEnd,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)

from ..agent.operator_text import operator_text
from ..render import first_line, result_status, summarize_arguments
from ..tools.base import ToolFailure
from ..tools.registry import builtin_safety
from ..tools.workspace import MissingPath, locate, printable, workspace_root

Update = Union[UserMessageChunk, AgentMessageChunk, AgentThoughtChunk, ToolCallStart, ToolCallProgress]
Content = Union[ContentToolCallContent, FileEditToolCallContent, TerminalToolCallContent]  # (what a card may hold)

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")

MAX_DIFF_BYTES = 512 * 1024  # a larger file gets no diff preview (the call still shows its arguments)
TITLE_LIMIT = 120
STOPPED_HERE = "Cairn stopped here (crash or kill)"
CANCELLED_HERE = "The turn was cancelled."
RECOVERED = (TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN)
NO_DIFF = "No diff shown: "


def wire(value: T) -> T:
    """`value` (a string, or JSON-like data holding strings) with lone surrogates replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {wire(k): wire(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, (list, tuple)):
        return [wire(v) for v in value]  # type: ignore[return-value]
    return value


TOOL_KINDS: dict[str, ToolKind] = {
    "list_dir": "read",
    "read_file": "read",
    "search_text": "search",
    "write_file": "edit",
    "edit_file": "edit",
    "run_command": "execute",
}
FILE_TOOLS = ("list_dir", "read_file", "search_text", "write_file", "edit_file")


def _arg(arguments: Any, name: str) -> str | None:
    value = arguments.get(name) if isinstance(arguments, dict) else None
    return value if isinstance(value, str) else None


def _quoted(text: str) -> str:
    """`text` as inline code on one line, cut to fit a title (the full text is in the call's content)."""
    line = " ".join(text.split())
    if len(line) > TITLE_LIMIT:
        line = line[: TITLE_LIMIT - 1] + "…"
    return f"`{line}`"


def tool_title(name: str, arguments: Any) -> str:
    """A title a person reads at a glance: "Run `make test`", "Edit `src/a.py`"."""
    command, path, pattern = _arg(arguments, "command"), _arg(arguments, "path"), _arg(arguments, "pattern")
    if name == "run_command" and command is not None:
        title = f"Run {_quoted(command)}"
    elif name in ("write_file", "edit_file", "read_file", "list_dir") and path is not None:
        verb = {"write_file": "Write", "edit_file": "Edit", "read_file": "Read", "list_dir": "List"}[name]
        title = f"{verb} {_quoted(path)}"
    elif name == "search_text" and pattern is not None:
        title = f"Search {_quoted(pattern)}" + (f" in {_quoted(path)}" if path else "")
    else:
        title = f"{name}({summarize_arguments(arguments)})"
    return wire(title)


def tool_kind(name: str) -> ToolKind:
    return TOOL_KINDS.get(name, "other")


def absolute(path: str, workspace: Path) -> str:
    return os.path.normpath(os.path.join(workspace, path))


def tool_locations(name: str, arguments: Any, workspace: Path) -> list[ToolCallLocation] | None:
    """The file a file tool touches, so an editor can show or follow it."""
    path = _arg(arguments, "path")
    if name not in FILE_TOOLS or path is None:
        return None
    return [ToolCallLocation(path=wire(absolute(path, workspace)))]


def command_block(command: str) -> ContentToolCallContent:
    """The whole command, verbatim, as a fenced block (a fence longer than any run of backticks inside it)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", command)), default=0))
    return tool_content(text_block(wire(f"{fence}sh\n{command}\n{fence}")))


class NoPreview(Exception):
    """The file cannot be shown as text (binary, too large, not a regular file, outside the workspace)."""


def current_text(workspace: Path, path: str) -> tuple[str, str | None]:
    """(absolute path, the file's current text or None when it does not exist), read the way the tools read: walked
    from the workspace root without following links out of it, regular files only, bounded in size."""
    try:
        with locate(workspace, path) as found:
            real = os.path.join(workspace_root(workspace), *found.parts)
            if found.name is None or (found.st is not None and not stat.S_ISREG(found.st.st_mode)):
                raise NoPreview(f"{path} is not a regular file")
            if found.st is None:
                return real, None
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(found.name, flags, dir_fd=found.dir_fd)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_DIFF_BYTES:
                    raise NoPreview(f"{path} is too large or not a regular file")
                data = f.read(MAX_DIFF_BYTES + 1)
    except MissingPath as missing:
        return os.path.join(workspace_root(workspace), *missing.parts), None
    except (ToolFailure, OSError) as e:
        raise NoPreview(str(e)) from None
    if len(data) > MAX_DIFF_BYTES or b"\x00" in data[:8192]:
        raise NoPreview(f"{path} is binary or too large")
    try:
        return real, data.decode("utf-8")
    except UnicodeDecodeError:
        raise NoPreview(f"{path} is not UTF-8 text") from None


def file_diff(name: str, arguments: Any, workspace: Path) -> FileEditToolCallContent | None:
    """What `write_file`/`edit_file` would do to the file as it is now; None when that cannot be shown."""
    path = _arg(arguments, "path")
    if name not in ("write_file", "edit_file") or path is None:
        return None
    try:
        real, old = current_text(workspace, path)
    except NoPreview:
        return None
    if name == "write_file":
        new = _arg(arguments, "content")
        if new is None:
            return None
        return tool_diff_content(wire(real), wire(printable(new)), wire(old))
    before, after = _arg(arguments, "old"), _arg(arguments, "new")
    if old is None or not before or after is None or old.count(before) != 1:
        return None  # the edit will fail (and say why); there is nothing honest to preview
    return tool_diff_content(wire(real), wire(printable(old.replace(before, after, 1))), wire(old))


def diff_path(workspace: Path, path: str) -> str:
    """The absolute path a diff names, as `current_text` gives it live: the workspace's real root and the path's real
    directories (a link on the way resolved), lexically when it cannot be walked now."""
    root = workspace_root(workspace)
    try:
        with locate(workspace, path) as found:
            return os.path.join(root, *found.parts)
    except MissingPath as missing:
        return os.path.join(root, *missing.parts)
    except (ToolFailure, OSError):
        return os.path.normpath(os.path.join(root, path))


def replayed_diff(call: ToolCall | None, workspace: Path, before_image: Callable[[str], bytes | None] | None,
                  ) -> tuple[FileEditToolCallContent | None, str | None]:
    """The whole-file diff a successful `write_file`/`edit_file` showed live, rebuilt from the log (see the module
    docstring): (the diff, None), or (None, why it cannot be shown), or (None, None) for other calls."""
    if call is None or call.name not in ("write_file", "edit_file"):
        return None, None
    arguments = call.arguments
    path = _arg(arguments, "path")
    if path is None:
        return None, None
    if call.after_sha256 is None:
        return None, (f"{NO_DIFF}this call was recorded without the fingerprints that would say what {path} held "
                      "before it.")
    if call.before_sha256 is None:
        old: str | None = None
    else:
        data = before_image(call.before_sha256) if before_image is not None else None
        if data is None:
            return None, (f"{NO_DIFF}Cairn did not keep {path} as it was before this call (too large, holding a "
                          "secret, or its store is not available), so its earlier content is not known.")
        if len(data) > MAX_DIFF_BYTES or b"\x00" in data[:8192]:
            return None, None  # live, a file this large or binary had no diff either
        try:
            old = data.decode("utf-8")
        except UnicodeDecodeError:
            return None, None  # (nor one that is not UTF-8 text)
    if call.name == "write_file":
        new = _arg(arguments, "content")
    else:
        before, after = _arg(arguments, "old"), _arg(arguments, "new")
        new = old.replace(before, after, 1) if old is not None and before and after is not None else None
    new = printable(new) if new is not None else None
    if new is None or hashlib.sha256(new.encode("utf-8")).hexdigest() != call.after_sha256:
        return None, f"{NO_DIFF}the change to {path} cannot be rebuilt from the log as it was made."
    return tool_diff_content(wire(diff_path(workspace, path)), wire(new), wire(old)), None


def call_content(name: str, arguments: Any, diff: FileEditToolCallContent | None) -> list[Content] | None:
    """The content a person needs to judge the call: the full command, or the diff."""
    content: list[Content] = []
    command = _arg(arguments, "command")
    if name == "run_command" and command is not None:
        content.append(command_block(command))
    if diff is not None:
        content.append(diff)
    return content or None


def status_word(result: ToolResult) -> str:
    return result_status(result)


def result_text(result: ToolResult) -> str:
    """The result as the model saw it; an error starts with its status word — repair's own `TOOL_…:` prefix is
    replaced by it, so a recovered call reads the same live and after a crash."""
    if not result.is_error:
        return result.content
    body = result.content
    if result.error_code and body.startswith(result.error_code + ":"):
        body = body[len(result.error_code) + 1:].lstrip()
    return f"{status_word(result)}: {body}"


def evidence_json(evidence: RecoveryEvidence) -> dict[str, str]:
    return {"finding": evidence.finding, "detail": evidence.detail}


def evidence_text(evidence: RecoveryEvidence) -> str:
    return f"Cairn checked after the crash: {evidence.finding} — {evidence.detail}"


def outcome_meta(result: ToolResult, safety: str | None, verdict: RecoveryVerdict | None = None,
                 evidence: RecoveryEvidence | None = None, recovered: bool = False) -> dict[str, Any]:
    """`_meta.cairn` of a finished call: what a client can act on without parsing text. `recovered`: crash repair
    wrote this result (never a result the loop wrote live, a cancelled call's OUTCOME_UNKNOWN included)."""
    cairn: dict[str, Any] = {"status": status_word(result), "error_code": result.error_code, "safety": safety,
                             "recovered": recovered}
    if evidence is not None:
        cairn["evidence"] = evidence_json(evidence)
    if verdict is not None:
        cairn["verdict"] = {"verdict": verdict.verdict, "note": verdict.note}
    return {"cairn": wire(cairn)}


def raw_output(result: ToolResult, evidence: RecoveryEvidence | None = None) -> dict[str, Any]:
    """The same status word as the content and `_meta` (`OUTCOME_UNKNOWN: …`, never repair's `TOOL_…:` prefix), and
    the evidence Cairn gathered about a recovered call, as in `_meta`."""
    out: dict[str, Any] = {"status": status_word(result), "error_code": result.error_code, "text": result_text(result)}
    if evidence is not None:
        out["evidence"] = evidence_json(evidence)
    return wire(out)


def final_status(result: ToolResult) -> ToolCallStatus:
    return "failed" if result.is_error else "completed"


@dataclass
class CallInfo:
    name: str
    arguments: Any
    safety: str | None
    diff: FileEditToolCallContent | None = None


def verdict_text(verdict: RecoveryVerdict) -> str:
    return f"Operator's verdict: {verdict.verdict}" + (f" ({verdict.note})" if verdict.note else "")


def finished_content(info: CallInfo, text: str, extra: Sequence[str] = ()) -> list[Content]:
    content: list[Content] = list(call_content(info.name, info.arguments, info.diff) or [])
    content.append(tool_content(text_block(wire(text))))
    content.extend(tool_content(text_block(wire(t))) for t in extra)
    return content


class LiveView:
    """Follows one session's events during turns. Remembers what each call is (for titles, safety and the diff
    computed when it was announced, so completion shows the same before/after the operator approved)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.calls: dict[str, CallInfo] = {}

    def announce(self, call_id: str, name: str, arguments: Any, status: ToolCallStatus) -> ToolCallStart:
        info = CallInfo(name, arguments, builtin_safety(name), file_diff(name, arguments, self.workspace))
        self.calls[call_id] = info
        return ToolCallStart(
            session_update="tool_call", tool_call_id=wire(call_id), title=tool_title(name, arguments),
            kind=tool_kind(name), status=status, content=call_content(name, arguments, info.diff),
            locations=tool_locations(name, arguments, self.workspace), raw_input=wire(arguments),
        )

    def updates(self, event: AnyEvent) -> list[Update]:
        """What the client should see now that `event` was appended during a turn."""
        if isinstance(event, AssistantChunk):
            return [update_agent_message_text(wire(event.delta))]
        if isinstance(event, ReasoningChunk):
            return [update_agent_thought_text(wire(event.delta))]
        if isinstance(event, AssistantMessage):
            return [self.announce(c.call_id, c.name, c.arguments, "pending") for c in event.tool_calls]
        if isinstance(event, ToolCall):
            if event.parent_call_id is not None or event.call_id not in self.calls:
                # a nested call (a tool calling another) was never announced by the model: it starts here
                start = self.announce(event.call_id, event.name, event.arguments, "in_progress")
                self.calls[event.call_id].safety = event.safety
                return [start]
            self.calls[event.call_id].safety = event.safety
            return [ToolCallProgress(session_update="tool_call_update", tool_call_id=wire(event.call_id),
                                     status="in_progress")]
        if isinstance(event, ToolResult):
            info = self.calls.get(event.call_id) or CallInfo("tool", {}, None)
            if event.is_error:
                info = CallInfo(info.name, info.arguments, info.safety)  # a diff of what did not happen misleads
            return [ToolCallProgress(
                session_update="tool_call_update", tool_call_id=wire(event.call_id), status=final_status(event),
                content=finished_content(info, result_text(event)), raw_output=raw_output(event),
                field_meta=outcome_meta(event, info.safety),
            )]
        return []

    def verdict_update(self, verdict: RecoveryVerdict, result: ToolResult | None,
                       safety: str | None = None, evidence: RecoveryEvidence | None = None,
                       recovered: bool = False) -> ToolCallProgress:
        """The call's card after an operator's verdict over ACP (`/verdict`): its status stays the finished one (a
        client that gets no status would show the call as running again) and `_meta` keeps its safety and whether
        repair wrote the result (`recovered`, as the replay says)."""
        info = self.calls.get(verdict.call_id) or CallInfo("tool", {}, safety)
        text = result_text(result) if result is not None else ""
        safety = info.safety or safety
        return ToolCallProgress(
            session_update="tool_call_update", tool_call_id=wire(verdict.call_id),
            status=final_status(result) if result is not None else None,
            content=finished_content(CallInfo(info.name, info.arguments, safety), text,
                                     [*([evidence_text(evidence)] if evidence is not None else []),
                                      verdict_text(verdict)]),
            field_meta=outcome_meta(result, safety, verdict, evidence, recovered) if result is not None else None,
        )


# Files a client attaches to a prompt are inlined between these markers (agent.prompt_text), so a replay can fold them
# back to the name the user picked. The second pattern is how prompts were inlined before rev 2.
ATTACHED = re.compile(r"\n?<attached-file uri=\"([^\"\n]*)\">\n.*?\n</attached-file>\n?", re.S)
ATTACHED_V1 = re.compile(r"\n\n([a-z][a-z0-9+.-]*://\S*):\n```\n.*?\n```\n", re.S)
_BINARY = re.compile("[\x00-\x08\x0e-\x1f\ufffd]")


def attachment_name(uri: str) -> str:
    return "@" + (uri.rstrip("/").rsplit("/", 1)[-1] or uri)


def looks_binary(text: str) -> bool:
    sample = text[:4096]
    return bool(sample) and len(_BINARY.findall(sample)) > max(2, len(sample) // 100)


def shown_prompt(text: str) -> str:
    """A prompt as its author wrote it: attached files folded to `@name`, never a dump of their bytes."""
    text = ATTACHED.sub(lambda m: " " + attachment_name(m.group(1)), text)
    text = ATTACHED_V1.sub(lambda m: " " + attachment_name(m.group(1)), text)
    return "[binary content not shown]" if looks_binary(text) else text.strip()


def session_title(events: list[AnyEvent]) -> str | None:
    prompt = next((e.text for e in events if isinstance(e, UserMessage)), None)
    return wire(first_line(shown_prompt(prompt), 80)) or None if prompt else None


REPAIR_WORDS = "Cairn stopped (crash or kill)"  # how repair's results begin, after their code (persistence/repair.py)


def repaired_results(events: list[AnyEvent]) -> set[int]:
    """The results crash repair wrote (as `id()`s of the events in `events`). Repair closes a turn with the results of
    its open step's unanswered calls, `step/end` and `turn/end` `interrupted`, contiguous at the turn's end, each
    NOT_STARTED or OUTCOME_UNKNOWN in repair's own words. The loop writes OUTCOME_UNKNOWN itself too — a call a cancel
    cut short, an MCP call past its time limit — and those results are what happened live, not recoveries."""
    found: set[int] = set()
    for i, e in enumerate(events):
        if not (isinstance(e, TurnEnd) and e.reason == "interrupted"):
            continue
        j = i - 1
        if j >= 0 and isinstance(events[j], StepEnd):
            j -= 1
        while j >= 0 and isinstance(r := events[j], ToolResult):
            if r.error_code in RECOVERED and r.content.startswith(f"{r.error_code}: {REPAIR_WORDS}"):
                found.add(id(r))
            j -= 1
    return found


def turn_end_marker(text: str, **cairn: Any) -> AgentMessageChunk:
    """An agent message saying how a turn ended, machine-readable in `_meta.cairn` (see the module docstring)."""
    update = update_agent_message_text(wire(text))
    update.field_meta = {"cairn": wire(cairn)}
    return update


def replay(events: list[AnyEvent], workspace: Path,
           safety_of: Callable[[str], str | None] = builtin_safety,
           before_image: Callable[[str], bytes | None] | None = None) -> list[Update]:
    """The history of a session as updates, for `session/load` (see the module docstring). `safety_of` names a
    tool's class for calls that never got a `tool/call` (NOT_STARTED): the session's registry knows its MCP tools.
    `before_image` gives a before-image by its sha256 (the session's blob store), for the diffs of file changes."""
    out: list[Update] = []
    calls: dict[str, CallInfo] = {}
    recorded: dict[str, ToolCall] = {}  # call id -> its tool/call (fingerprints, for the diff)
    results: dict[str, ToolResult] = {}
    chunks: list[str] = []  # assistant text of a step whose assistant/message was never written (crash mid-stream)
    thoughts: list[str] = []  # the same for its reasoning
    stopped_said = False  # "Cairn stopped here" already said for this turn
    repaired = repaired_results(events)
    # evidence is written after the repaired turn's end: known up front, shown with the call it is about
    evidence = {e.call_id: e for e in events if isinstance(e, RecoveryEvidence)}

    def flush_chunks() -> None:
        if thoughts:
            out.append(update_agent_thought_text(wire("".join(thoughts))))
            thoughts.clear()
        if chunks:
            out.append(update_agent_message_text(wire("".join(chunks))))
            chunks.clear()

    for e in events:
        if isinstance(e, TurnStart):
            stopped_said = False
        elif isinstance(e, UserMessage):
            out.append(update_user_message_text(wire(shown_prompt(e.text))))
        elif isinstance(e, AssistantChunk):
            chunks.append(e.delta)
        elif isinstance(e, ReasoningChunk):
            thoughts.append(e.delta)
        elif isinstance(e, AssistantMessage):
            chunks.clear()  # the message holds the whole text (and reasoning), interrupted or not
            thoughts.clear()
            if e.reasoning:
                out.append(update_agent_thought_text(wire(e.reasoning)))
            if e.text:
                out.append(update_agent_message_text(wire(e.text)))
            for c in e.tool_calls:
                calls[c.call_id] = CallInfo(c.name, c.arguments, safety_of(c.name))
        elif isinstance(e, ToolCall):
            calls[e.call_id] = CallInfo(e.name, e.arguments, e.safety)
            recorded[e.call_id] = e
        elif isinstance(e, ToolResult):
            info = calls.get(e.call_id) or CallInfo("tool", {}, None)
            recovered = id(e) in repaired
            if recovered and not stopped_said:
                flush_chunks()
                out.append(turn_end_marker(f"{STOPPED_HERE}; recovered calls below.", turn_end="interrupted",
                                           recovered=True))
                stopped_said = True
            results[e.call_id] = e
            extra: list[str] = []
            if not e.is_error:  # as live: a failed call shows no diff of what did not happen
                diff, why = replayed_diff(recorded.get(e.call_id), workspace, before_image)
                info = CallInfo(info.name, info.arguments, info.safety, diff)
                extra += [why] if why else []
            found = evidence.get(e.call_id) if recovered else None
            extra += [evidence_text(found)] if found is not None else []
            calls[e.call_id] = info
            out.append(ToolCallStart(
                session_update="tool_call", tool_call_id=wire(e.call_id), title=tool_title(info.name, info.arguments),
                kind=tool_kind(info.name), status=final_status(e),
                content=finished_content(info, result_text(e), extra),
                locations=tool_locations(info.name, info.arguments, workspace), raw_input=wire(info.arguments),
                raw_output=raw_output(e, found),
                field_meta=outcome_meta(e, info.safety, evidence=found, recovered=recovered),
            ))
        elif isinstance(e, StepEnd):
            flush_chunks()
        elif isinstance(e, OperatorCommand):  # the operator's `!command`: replayed as the model is told of it
            out.append(update_user_message_text(wire(operator_text(e, next((r for r in events if isinstance(
                r, OperatorResult) and r.turn == e.turn and r.seq > e.seq), None)))))
        elif isinstance(e, TurnEnd):
            flush_chunks()
            if e.reason == "interrupted" and not stopped_said:
                out.append(turn_end_marker(f"{STOPPED_HERE}.", turn_end="interrupted", recovered=True))
                stopped_said = True
            elif e.reason == "cancelled":  # live: the prompt's answer, stop reason `cancelled`
                out.append(turn_end_marker(CANCELLED_HERE, turn_end="cancelled", stop_reason="cancelled"))
            elif e.reason == "error" and e.error is not None:  # as live: the turn's error, not an unanswered prompt
                out.append(turn_end_marker(f"The turn ended with an error: {e.error.code}: {e.error.message}",
                                           turn_end="error", error_code=e.error.code))
        elif isinstance(e, RecoveryVerdict) and e.call_id in results:
            result = results[e.call_id]
            info = calls.get(e.call_id) or CallInfo("tool", {}, None)
            recovered = id(result) in repaired
            found = evidence.get(e.call_id) if recovered else None
            out.append(ToolCallProgress(
                session_update="tool_call_update", tool_call_id=wire(e.call_id), status=final_status(result),
                content=finished_content(info, result_text(result),
                                         [*([evidence_text(found)] if found is not None else []), verdict_text(e)]),
                field_meta=outcome_meta(result, info.safety, e, found, recovered=recovered),
            ))
    flush_chunks()
    return out
