"""`cairn rm` and `cairn export`: sessions that end well, not only accumulate (SPEC §6 rev 2).

`rm` deletes finished sessions and refuses a live one (exit 3), taking the same lock a writer takes, so it can never
pull a log from under a running turn; then it collects what no remaining session names (the before-images in the blob
store, the trees of the workspace snapshots). `export` writes a session as repair would leave it, without writing to
it: a readable Markdown transcript with recovered calls and operator verdicts marked, or the events as JSON lines.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from cairn.persistence.events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ApprovalDecided,
    AssistantMessage,
    ContextCompaction,
    ConversationRewind,
    OperatorCommand,
    OperatorResult,
    RecoveryEvidence,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    WorkspaceMoved,
    WorkspaceSnapshot,
    encode_event,
)
from cairn.widgets.attachment_line import attachments_line
from cairn.widgets.terminal_text import safe_json, safe_text

from ..exit_codes import EXIT_LOCKED, EXIT_OK, exit_code_for, fail
from ..render import fence, format_time, summarize_arguments, superseded_verdicts

RECOVERY_WORDS = {TOOL_OUTCOME_UNKNOWN: "OUTCOME_UNKNOWN", TOOL_NOT_STARTED: "NOT_STARTED"}


def rm_command(args: argparse.Namespace, store: Any) -> int:
    """Delete each named session; a live or unknown one is reported and the others are still deleted. The exit code
    is the worst one met (3 for a live session, 2 for an unknown id)."""
    from cairn.persistence.errors import PersistenceError, SessionLocked

    worst = EXIT_OK
    for session_id in args.session_ids:
        try:
            store.delete(session_id)
        except SessionLocked as e:
            worst = max(worst, fail(str(e), EXIT_LOCKED))
        except PersistenceError as e:
            worst = max(worst, fail(str(e), exit_code_for(e) or 1))
        else:
            print(f"deleted {safe_text(session_id)}")
    collect_before_images(store)
    return worst


def collect_before_images(store: Any) -> None:
    """After `cairn rm`: remove the before-images no remaining session names (SPEC §9 rev 3). A session that cannot be
    read keeps everything (its needs are unknown)."""
    from cairn.persistence.blobs import blob_store_for, names_needed
    from cairn.persistence.errors import PersistenceError

    needed: set[str] = set()
    trees: dict[str, set[str]] = {}  # workspace -> the snapshot trees its remaining sessions name
    sessions: dict[str, set[str]] = {}  # workspace -> its remaining sessions (a moved one: each place it worked in)
    try:
        for session_id in store.backend.list_ids():
            log = store.backend.load(session_id)
            needed |= names_needed(log.events)
            where = log.header.cwd
            sessions.setdefault(where, set()).add(session_id)
            for e in log.events:
                if isinstance(e, WorkspaceMoved):
                    where = e.to
                    sessions.setdefault(where, set()).add(session_id)
                elif isinstance(e, WorkspaceSnapshot):  # its tree and the manifest of what it left out
                    trees.setdefault(where, set()).update(x for x in (e.tree, e.manifest) if x)
    except (PersistenceError, OSError):
        return
    blobs = blob_store_for(store.backend)
    try:
        blobs.collect(needed)
    finally:
        blobs.close()
    prune_snapshots(store.home, trees, sessions)


def prune_snapshots(home: str | Path, trees: dict[str, set[str]], sessions: dict[str, set[str]]) -> None:
    """Each shadow repository keeps only the trees its workspace's remaining sessions name (SPEC §9 rev 3)."""
    from ..agent.snapshots import ShadowRepo, SnapshotUnavailable, git_path

    root = Path(home) / "snapshots"
    if git_path() is None or not root.is_dir():
        return
    known = {ShadowRepo(Path(home), Path(cwd)).git_dir: cwd for cwd in set(trees) | set(sessions)}
    for git_dir in root.glob("*.git"):
        cwd = known.get(git_dir)
        for index in git_dir.glob("index-*"):
            if cwd is None or index.name.removeprefix("index-").removesuffix(".lock") not in sessions.get(cwd, ()):
                index.unlink(missing_ok=True)
        if cwd is None:  # no session of that workspace remains
            shutil.rmtree(git_dir, ignore_errors=True)
            continue
        try:
            ShadowRepo(Path(home), Path(cwd)).keep_only(trees.get(cwd, set()))
        except SnapshotUnavailable:
            continue


def export_command(args: argparse.Namespace, store: Any) -> int:
    inspection = store.inspect(args.session_id)
    events = inspection.events + inspection.repair
    out = sys.stdout
    if args.format == "json":
        stored = len(inspection.events)
        for i, e in enumerate(events):
            line = encode_event(e)
            if i >= stored:  # not in the log yet: what repair will append when the session is resumed
                line = line[:-1] + b',"repair":true}'
            out.buffer.write(safe_json(line) + b"\n")
        out.flush()
        return EXIT_OK
    out.write(safe_text(markdown(inspection.header.id, inspection.header.cwd, events, len(inspection.events))))
    return EXIT_OK


def markdown(session_id: str, cwd: str, events: list[AnyEvent], stored: int) -> str:
    """A transcript people can read: prompts, answers, tool calls with their outcome, recovery marked."""
    lines = [f"# Cairn session {session_id}", "", f"- workspace: `{cwd}`"]
    if events:
        lines.append(f"- from {format_time(events[0].time)} to {format_time(events[-1].time)}, {len(events)} events")
    if stored < len(events):
        lines.append(f"- the log ends inside a turn: the last {len(events) - stored} events are what repair will add")
    calls: dict[int, ToolCall] = {}
    evidence = {e.call_id: e for e in events if isinstance(e, RecoveryEvidence)}  # written after the turn's end
    decided: dict[str, str] = {}  # call id -> the decision that let it run (or not), as shown
    superseded = superseded_verdicts(events)  # SPEC §11: a later verdict on a call supersedes the earlier one
    for i, e in enumerate(events):
        if isinstance(e, TurnStart):
            lines += ["", f"## Turn {e.turn}"]
        elif isinstance(e, UserMessage):
            lines += ["", *(f"> {line}" for line in e.text.splitlines() or [""])]
            if e.attachments:
                lines.append(f"> _{attachments_line(e.attachments)}_")
        elif isinstance(e, AssistantMessage) and (e.text or e.interrupted):
            lines += ["", e.text.rstrip() or "_(interrupted before any text)_"]
            if e.interrupted and e.text:
                lines.append("_(interrupted)_")
        elif isinstance(e, ToolCall) and e.parent_call_id is None:
            calls[e.seq] = e
        elif isinstance(e, ApprovalDecided):
            decided[e.call_id] = e.decision + (f" ({e.scope})" if e.scope else "")
        elif isinstance(e, ToolResult):
            call = calls.get(e.source_seq) if e.source_seq is not None else None
            name = call.name if call else "a tool"
            arguments = summarize_arguments(call.arguments) if call else ""
            status = RECOVERY_WORDS.get(e.error_code or "", e.error_code or "ok")
            marker = " **(recovered after a crash)**" if i >= stored or e.error_code in RECOVERY_WORDS else ""
            approval = f" · approval: {decided[e.call_id]}" if e.call_id in decided else ""
            lines += ["", f"**{name}**({arguments}) `{e.call_id}` → {status}{marker}{approval}", fence(e.content, "text")]
            if e.call_id in evidence:
                found = evidence[e.call_id]
                lines += ["", f"**Evidence** on `{e.call_id}` (Cairn checked): {found.finding} — {found.detail}"]
        elif isinstance(e, RecoveryVerdict):
            note = f" — {e.note}" if e.note else ""
            later = f" _(superseded by the verdict at seq {superseded[e.seq]})_" if e.seq in superseded else ""
            lines += ["", f"**Operator verdict** on `{e.call_id}`: {e.verdict}{note}{later}"]
        elif isinstance(e, ConversationRewind):
            restored = f"; files restored: {', '.join(e.files)}" if e.files else ""
            lines += ["", f"_Rewound here: the conversation continues from before turn {e.to_turn}{restored}._"]
        elif isinstance(e, OperatorCommand):  # the operator's own `!command`, and how it ended
            unknown = "" if any(isinstance(r, OperatorResult) and r.turn == e.turn for r in events[i:]) else (
                " → outcome unknown (Cairn stopped while it ran) **(recovered after a crash)**")
            lines += ["", f"**Operator command** `!{e.command}`{unknown}"]
        elif isinstance(e, OperatorResult):
            status = f"exit code {e.exit_code}" if e.exit_code is not None else "did not finish"
            lines += [f"→ {status}", fence(e.output, "text")]
        elif isinstance(e, ContextCompaction):
            lines += ["", f"_Context compacted here (events through seq {e.through_seq} summarised)._"]
        elif isinstance(e, TurnEnd) and e.reason != "completed":
            error = f": {e.error.code} {e.error.message}" if e.error else ""
            lines += ["", f"_Turn {e.turn} ended {e.reason}{error}_"]
    return "\n".join(lines) + "\n"
