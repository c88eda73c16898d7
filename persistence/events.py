"""Session events (SPEC §2) as msgspec tagged Structs, plus the one encoder and decoders used everywhere.

Every field is always written (no omitted defaults) so a log line is self-describing and identical across backends.
`seq` and `time` are assigned by the live session at append time; constructors leave them at -1/0.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

FORMAT = "cairn-session"
FORMAT_VERSION = 1

Safety = Literal["read_only", "idempotent", "side_effecting"]
# rev 3: `allowed_prefix` (a run_command grant limited to a prefix, in `scope`) and `granted` (ran without asking,
# because of the earlier grant named in `scope`): every call that runs has the decision that let it run in the log
Decision = Literal["allowed_once", "allowed_session", "allowed_prefix", "granted", "denied", "cancelled"]
TurnEndReason = Literal["completed", "cancelled", "error", "interrupted"]
Verdict = Literal["happened", "did_not_happen", "unknown"]

# tool/result error codes (SPEC §2)
TOOL_NOT_STARTED = "TOOL_NOT_STARTED"
TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
CHECKPOINT_FAILED = "CHECKPOINT_FAILED"
TOOL_ERROR = "TOOL_ERROR"
DENIED = "DENIED"
UNKNOWN_TOOL = "UNKNOWN_TOOL"
BAD_ARGUMENTS = "BAD_ARGUMENTS"
TRUNCATED = "TRUNCATED"  # rev 2: the call came from an answer cut off at the token limit and was not run
# turn/end error codes worth naming (others come from providers: HTTP_<status>, TIMEOUT, …)
MAX_TOKENS = "MAX_TOKENS"  # rev 2: the answer hit the output limit

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "other"]


class SessionHeader(msgspec.Struct, kw_only=True):
    """First line of a JSONL session; a row of the `sessions` table in SQLite."""

    format: str = FORMAT
    version: int = FORMAT_VERSION
    id: str
    created: int
    cwd: str


class Event(msgspec.Struct, tag_field="type", kw_only=True, gc=False):
    seq: int = -1
    time: int = 0


class TurnStart(Event, tag="turn/start", kw_only=True):
    turn: int


class StepStart(Event, tag="step/start", kw_only=True):
    turn: int
    step: int


class Attachment(msgspec.Struct, gc=False, kw_only=True):
    """(rev 4) A workspace file an `@path` mention (or an ACP resource link) attached to a prompt: the path as typed,
    relative to the workspace, the whole file's hash and size, and the text the model was sent (cut at the size
    limit, `truncated`). The text is kept so a resumed session sends exactly what was sent before."""

    path: str
    sha256: str
    size: int
    text: str
    truncated: bool = False


class UserMessage(Event, tag="user/message", kw_only=True):
    turn: int
    step: int
    text: str
    attachments: list[Attachment] = []  # rev 4: the files its `@path` mentions attached (optional: older logs load)


class RequestHeader(Event, tag="request/header", kw_only=True):
    turn: int
    step: int
    provider: str
    model: str
    params: dict[str, Any]
    tools: list[str]
    message_count: int
    profile: str | None = None  # rev 2: the config-file profile the provider settings came from (None: none)
    purpose: str = "turn"  # rev 3: "turn", or "compaction" for a summary request (every request has its header first)
    endpoint: str | None = None  # rev 3: the base URL, credentials removed (None: no server, or written before rev 3)


class AssistantChunk(Event, tag="assistant/chunk", kw_only=True):
    turn: int
    step: int
    delta: str


class ToolCallRequest(msgspec.Struct, gc=False):
    """One tool call as the model asked for it, inside `assistant/message`."""

    call_id: str
    name: str
    arguments: Any  # parsed JSON object, or the raw string when the model sent invalid JSON


class Usage(msgspec.Struct, gc=False):
    """Token counts of one answer as the provider reported them; a count the provider did not give is null."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


class AssistantMessage(Event, tag="assistant/message", kw_only=True):
    turn: int
    step: int
    text: str
    tool_calls: list[ToolCallRequest]
    interrupted: bool
    # rev 2 (optional, so older logs load): the reasoning as streamed, what the provider needs back with it (e.g. a
    # thinking signature), why the answer ended (null when interrupted), and token usage.
    reasoning: str | None = None
    reasoning_meta: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


class ReasoningChunk(Event, tag="reasoning/chunk", kw_only=True):
    """Streamed reasoning (rev 2), write-behind like assistant/chunk. Marked ignorable: older readers skip it."""

    turn: int
    step: int
    delta: str
    ignorable: bool = True


class RequestRetry(Event, tag="request/retry", kw_only=True):
    """Appended before a retried request is sent again (rev 2). Ignorable."""

    turn: int
    step: int
    attempt: int  # 2, 3, …
    reason: str  # e.g. "HTTP 429"
    delay_ms: int
    ignorable: bool = True


class ContextCompaction(Event, tag="context/compaction", kw_only=True):
    """A summary that replaces, in the derived conversation, every event up to `through_seq` (the log keeps them all).

    `carried`: the OUTCOME_UNKNOWN calls and the verdicts of that part, kept verbatim beside the summary so recovery
    guidance survives any number of compactions. Written ignorable: a reader that skips it sends the full history."""

    summary: str
    through_seq: int
    model: str
    usage: Usage | None = None
    carried: list[dict[str, Any]] = []
    reason: str | None = None  # rev 3: "length" (the window was filling up) or "operator" (`/compact`)
    ignorable: bool = True


class ToolProgress(Event, tag="tool/progress", kw_only=True):
    """The process a run_command call started (rev 2, write-behind), so recovery can tell whether it still runs."""

    turn: int
    step: int
    call_id: str
    pid: int
    started: int  # ms
    ignorable: bool = True


class SessionMode(Event, tag="session/mode", kw_only=True):
    """(rev 3, ignorable) The approval mode an editor set for the session (ACP `ask`, `accept-edits`, `bypass`): an
    operator's decision, durable at once and restored when the session is loaded again."""

    mode: str
    ignorable: bool = True


class RecoveryEvidence(Event, tag="recovery/evidence", kw_only=True):
    """(rev 3 §9, ignorable) What Cairn could verify itself about an OUTCOME_UNKNOWN call when it repaired the log: a
    file tool's path against its fingerprints, a command's process. Evidence, not a verdict."""

    call_id: str
    finding: Verdict
    detail: str
    ignorable: bool = True


class ConversationRewind(Event, tag="conversation/rewind", kw_only=True):
    """(rev 3 §9, ignorable) The derived conversation continues from before turn `to_turn`; the log keeps everything
    (a reader that skips this sends the longer history). `files`: the paths a rewind restored with it, which the model
    is told about in its next request. (rev 4 §10) `rewind_id`: the rewind it belongs to; `undo_of`: set on an undo,
    the rewind whose conversation/rewind no longer applies (the conversation is derived as if it had not happened)."""

    to_turn: int
    files: list[str] = []
    rewind_id: str | None = None
    undo_of: str | None = None
    ignorable: bool = True


class WorkspaceSnapshot(Event, tag="workspace/snapshot", kw_only=True):
    """(rev 3 §9, ignorable) The whole workspace as a tree in Cairn's shadow git repository: at a turn's start
    (`at: "turn-start"`), before a side-effecting command (`"command"`, with its `call_id`; durable before that call's
    pre-tool barrier) and at a turn's end (`"turn-end"`). `left_out`: files over the size limit, not in the tree.

    rev 4 (§10): also around a rewind (`"rewind-start"`, `"rewind-end"`, with the rewind's id in `call_id`), so what a
    rewind changed is told apart from what someone else changed; `left_out` also names files that hold a configured
    secret; `manifest`: the id of a blob in the same shadow repository listing everything the tree left out and why
    (ignored, over the size limit, nested repository, special file, holds a secret, unreadable) with type, size and
    mtime — None on snapshots from before rev 4, which recorded no such list; `workspace`: the directory snapshotted."""

    turn: int
    at: str
    tree: str
    call_id: str | None = None
    left_out: list[str] = []
    manifest: str | None = None
    workspace: str | None = None
    ignorable: bool = True


class InstructionFile(msgspec.Struct, gc=False, kw_only=True):
    """One project-instructions file read for the system prompt: where (`~/…` for the user's own file, else relative
    to the workspace), which level (`user` or `project`), its hash and size as read, and whether it was cut at the
    size limit. `error`: why it could not be read (then it was not sent)."""

    path: str
    scope: str
    sha256: str | None
    size: int
    truncated: bool = False
    error: str | None = None


class ContextInstructions(Event, tag="context/instructions", kw_only=True):
    """(rev 4, ignorable) The project instructions the model is told in its system prompt from this turn on: the files
    read (AGENTS.md from the workspace root down, CLAUDE.md/GEMINI.md where a level has no AGENTS.md, the user's own
    file) and the text sent, secrets scrubbed. Appended at a turn's start only when they differ from the last record,
    so the text is in the log once per change and a resumed session knows what the model was told."""

    turn: int
    files: list[InstructionFile]
    text: str
    notices: list[str] = []
    ignorable: bool = True


class ContextEnvironment(Event, tag="context/environment", kw_only=True):
    """(rev 4, ignorable) The environment lines of the system prompt (date, OS, shell, workspace, git branch and a short
    status), appended at a turn's start when they differ from the last record."""

    turn: int
    text: str
    ignorable: bool = True


class OperatorCommand(Event, tag="operator/command", kw_only=True):
    """(rev 4, ignorable) The operator's own shell command (`!command` in the TUI), run in the workspace as a turn of its
    own after the turn's start snapshot: its intent, durable before the command starts. Not a model tool call; its
    output reaches the model as context with the next prompt."""

    turn: int
    command: str
    ignorable: bool = True


class OperatorResult(Event, tag="operator/result", kw_only=True):
    """(rev 4, ignorable) How an operator command ended: its exit code (None when it was stopped or could not start)
    and its output (cut at the tool output limit, with a notice)."""

    turn: int
    exit_code: int | None
    output: str
    ignorable: bool = True


class WorkspaceMoved(Event, tag="workspace/moved", kw_only=True):
    """(rev 4 §10, ignorable) The session's workspace moved from `from_` to `to` (`cairn resume --workspace DIR`):
    tools, snapshots and rewinds run in `to` from here on, and snapshots taken before the move never apply to it."""

    from_: str = msgspec.field(name="from")
    to: str
    ignorable: bool = True


class RewindFile(msgspec.Struct, gc=False, kw_only=True):
    """One file of a rewind plan: what it goes back to (a before-image's sha256, or None: delete it), and what Cairn
    last wrote there (None: it did not exist), so a change made outside Cairn is seen before anything is overwritten.

    rev 4 (§10): content ids may also be `git:<blob id>` (a blob of the shadow repository); `restore_mode` /
    `expected_mode` are git modes (`100644`, `100755`, `120000` for a symbolic link, restored as a link); the content
    a path holds at plan time (`expected_*`) is kept before the first file is touched, so the rewind can be undone."""

    path: str
    restore_sha256: str | None
    expected_sha256: str | None
    restore_mode: str | None = None
    expected_mode: str | None = None
    # the path's bytes (base64) when the name is not UTF-8: `path` is stored with U+FFFD in its place (SPEC §2), and a
    # rewind must still reach the real file
    raw_path: str | None = None


class NotRestored(msgspec.Struct, gc=False, kw_only=True):
    """(rev 4 §10) A path a rewind leaves alone, and why (left out of the snapshot then, changed outside Cairn, …)."""

    path: str
    reason: str


class RewindPlan(Event, tag="rewind/plan", kw_only=True):
    """(rev 3 §9, ignorable) A rewind's plan, made durable before the first file is touched."""

    rewind_id: str
    to_turn: int
    files: list[RewindFile] = []
    conversation: bool = False
    commands_in: list[int] = []  # turns that ran commands: their changes are not restored
    # a workspace snapshot rewind: the shadow repository's tree the workspace goes back to (None: file tools' images)
    tree: str | None = None
    # rev 4 (§10): the rewind this one undoes (`cairn rewind --undo`), the workspace it acts on, the snapshot of the
    # workspace taken just before it (what an undo puts back), and what it leaves alone, with reasons
    undo_of: str | None = None
    workspace: str | None = None
    before_tree: str | None = None
    not_restored: list[NotRestored] = []
    ignorable: bool = True


class RewindStep(Event, tag="rewind/file", kw_only=True):
    """(rev 3 §9, ignorable) One file of a rewind restored (`done`) or left as it was (`skipped`, with why)."""

    rewind_id: str
    path: str
    outcome: Literal["done", "skipped"]
    detail: str = ""
    ignorable: bool = True


class RewindEnd(Event, tag="rewind/end", kw_only=True):
    """(rev 3 §9, ignorable) A rewind finished (`completed`) or was given up (`abandoned`) by the operator."""

    rewind_id: str
    outcome: Literal["completed", "abandoned"]
    ignorable: bool = True


class ApprovalAsked(Event, tag="approval/asked", kw_only=True):
    turn: int
    step: int
    call_id: str


class ApprovalDecided(Event, tag="approval/decided", kw_only=True):
    turn: int
    step: int
    call_id: str
    decision: Decision
    scope: str | None = None  # rev 3: the prefix granted (`allowed_prefix`), or the grant that let it run (`granted`)


class ToolCall(Event, tag="tool/call", kw_only=True):
    turn: int
    step: int
    call_id: str
    name: str
    arguments: Any
    safety: Safety
    parent_call_id: str | None
    # rev 3 (§9), file tools only: the path's content hash before the body (None: it did not exist) and the hash the
    # body will leave; computed before the pre-tool barrier. A call is fingerprinted when `after_sha256` is set.
    before_sha256: str | None = None
    after_sha256: str | None = None


class ToolResult(Event, tag="tool/result", kw_only=True):
    turn: int
    step: int
    call_id: str
    is_error: bool
    content: str
    error_code: str | None
    source_seq: int | None


class RecoveryVerdict(Event, tag="recovery/verdict", kw_only=True):
    call_id: str
    verdict: Verdict
    note: str


class StepEnd(Event, tag="step/end", kw_only=True):
    turn: int
    step: int


class TurnError(msgspec.Struct, gc=False):
    code: str
    message: str


class TurnEnd(Event, tag="turn/end", kw_only=True):
    turn: int
    reason: TurnEndReason
    error: TurnError | None


class IgnorableEvent(msgspec.Struct, gc=False):
    """An event of a type this build does not know, marked `"ignorable": true` by its writer.

    Kept so seq stays contiguous and the log round-trips; never produced by this build.
    """

    seq: int
    time: int
    type: str
    fields: dict[str, Any]


KnownEvent = (
    TurnStart | StepStart | UserMessage | RequestHeader | AssistantChunk | AssistantMessage | ApprovalAsked
    | ApprovalDecided | ToolCall | ToolResult | RecoveryVerdict | StepEnd | TurnEnd | ReasoningChunk | RequestRetry
    | ToolProgress | ContextCompaction | SessionMode | RecoveryEvidence | ConversationRewind | RewindPlan | RewindStep
    | RewindEnd | WorkspaceSnapshot | WorkspaceMoved | ContextInstructions | ContextEnvironment | OperatorCommand
    | OperatorResult
)
AnyEvent = KnownEvent | IgnorableEvent

encoder = msgspec.json.Encoder()
event_decoder = msgspec.json.Decoder(KnownEvent)
header_decoder = msgspec.json.Decoder(SessionHeader)
raw_decoder = msgspec.json.Decoder()


CHECK_MARK = b',"chk":"'  # how a check rides on the last line of a durable batch (checks.py)
_ESCAPED_KEY = b',"\\u0063hk":"'  # the same key spelled so that it cannot be read as one


def encode_event(event: AnyEvent) -> bytes:
    """One event as its JSON line body (no newline)."""
    if isinstance(event, IgnorableEvent):
        return unmarked(encoder.encode({"seq": event.seq, "time": event.time, "type": event.type, **event.fields}))
    return unmarked(encoder.encode(event))


def unmarked(data: bytes) -> bytes:
    """`data` with any key "chk" inside a value (a model's tool arguments, a copied event) written as "\\u0063hk":
    the same JSON, never the bytes of a check mark, which would make a clean log read as changed after it was
    written."""
    return data.replace(CHECK_MARK, _ESCAPED_KEY) if CHECK_MARK in data else data


def event_type(event: AnyEvent) -> str:
    if isinstance(event, IgnorableEvent):
        return event.type
    return type(event).__struct_config__.tag  # type: ignore[return-value]


def to_builtins(event: AnyEvent) -> dict[str, Any]:
    """The event as a plain dict in its on-disk shape (for `--json` output and tests)."""
    return raw_decoder.decode(encode_event(event))


def usage_totals(events: list[AnyEvent], fields: tuple[str, ...] = ("input_tokens", "output_tokens")) -> dict[str, int | None]:
    """Each count summed over the answers that reported it; null when no answer did (unknown is not zero)."""
    totals: dict[str, int | None] = {name: None for name in fields}
    for e in events:
        if isinstance(e, AssistantMessage) and e.usage is not None:
            for name in fields:
                value = getattr(e.usage, name)
                if value is not None:
                    totals[name] = (totals[name] or 0) + value
    return totals


class InvalidEvent(ValueError):
    """Raised at append for an event the reader would refuse (a field of the wrong type): the writer never stores it."""


class NonFiniteNumber(ValueError):
    """Raised at append for NaN/Infinity, which JSON cannot carry (msgspec would silently write null)."""


# Values of exactly these types hold no number that could be non-finite: not looked into (one call per plain value
# was most of a barrier's check, P1). Subclasses still are (a float subclass is a float).
_PLAIN = frozenset({str, int, bool, type(None)})


def check_finite(value: Any, where: str) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NonFiniteNumber(f"{where}: non-finite number {value!r} cannot be stored")
    elif isinstance(value, dict):
        for k, v in value.items():
            if type(v) not in _PLAIN:
                check_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if type(v) not in _PLAIN:
                check_finite(v, f"{where}[{i}]")


def check_event_finite(event: AnyEvent) -> None:
    """Only the free-form fields can hold floats; the rest are typed."""
    if isinstance(event, RequestHeader):
        check_finite(event.params, "request/header.params")
    elif isinstance(event, ToolCall):
        check_finite(event.arguments, "tool/call.arguments")
    elif isinstance(event, AssistantMessage):
        for call in event.tool_calls:
            check_finite(call.arguments, "assistant/message.tool_calls.arguments")
    elif isinstance(event, IgnorableEvent):
        check_finite(event.fields, event.type)
