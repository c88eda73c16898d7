"""Rewind (SPEC §9 rev 3): take back what Cairn's file tools changed, the conversation, or both, to before a turn.

The plan comes from the log alone: every fingerprinted `write_file` / `edit_file` call of turns N and later names its
path's content before it (`before_sha256`, whose before-image is in the session's blob store) and the content it left
(`after_sha256`). For each path the content before its first change from turn N on is restored (or the file deleted,
if it did not exist then); a file whose content now is neither what Cairn last wrote nor already the target was changed
outside Cairn and is left alone unless forced. Commands' changes cannot be restored; the plan names the turns that ran
commands.

Crash safety: the plan (`rewind/plan`) is durable before the first file is touched; each restored file is recorded
(`rewind/file`); `conversation/rewind` and `rewind/end` close it, durable. A log with a plan and no end is an interrupted
rewind: `pending_rewind` finds it, and it is finished (what is not yet restored, checked again) or abandoned.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cairn.persistence.blobs import BlobStore
from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ConversationRewind,
    RewindEnd,
    RewindFile,
    RewindPlan,
    RewindStep,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
    WorkspaceSnapshot,
)
from cairn.persistence.evidence import FILE_TOOLS, inside, sha256_of_file
from cairn.persistence.session import LiveSession

from .snapshots import ShadowRepo, SnapshotUnavailable

Scope = Literal["files", "conversation", "both"]
COMMAND_TOOLS = ("run_command",)


class RewindRefused(Exception):
    """A rewind that cannot be done as asked (an unknown turn, files changed outside Cairn, a rewind pending)."""

    def __init__(self, message: str, changed: list[str] | None = None) -> None:
        super().__init__(message)
        self.changed = changed or []


@dataclass
class FilePlan:
    """One path: what it goes back to, what Cairn last left there, and what it holds now."""

    path: str
    restore_sha256: str | None  # None: it did not exist before turn N (restoring deletes it)
    expected: set[str | None]  # contents Cairn may have left (an unknown outcome: before or after)
    current_sha256: str | None = None
    readable: bool = True
    restorable: bool = True  # False: the content to restore was not kept (over the size limit, or lost)
    last_seq: int = -1  # the seq of Cairn's last call that changed it

    @property
    def already(self) -> bool:
        return self.readable and self.current_sha256 == self.restore_sha256

    @property
    def changed_outside(self) -> bool:
        return not self.readable or (not self.already and self.current_sha256 not in self.expected)


@dataclass
class Plan:
    to_turn: int
    files: list[FilePlan] = field(default_factory=list)
    command_turns: list[int] = field(default_factory=list)  # turns that ran commands: not restorable
    tree: str | None = None  # a workspace snapshot rewind: the turn's start tree (commands' changes included)
    after_interruption: bool = False  # the last snapshot was taken inside a turn that never ended (a crash)

    @property
    def changed_outside(self) -> list[str]:
        return [f.path for f in self.files if f.changed_outside]

    @property
    def not_restorable(self) -> list[str]:
        return [f.path for f in self.files if not f.restorable and not f.already]


def prompts(events: list[AnyEvent]) -> list[tuple[int, str]]:
    """(turn, its prompt) for every turn, in order: what a rewind dialog lists."""
    found: dict[int, str] = {}
    for e in events:
        if isinstance(e, UserMessage) and e.step == 1 and e.turn not in found:
            found[e.turn] = e.text
    return sorted(found.items())


def turns_of(events: list[AnyEvent]) -> list[int]:
    return sorted({e.turn for e in events if isinstance(e, TurnStart)})


def _relative(workspace: Path, path: str) -> str | None:
    target = inside(workspace, path)
    if target is None:
        return None
    try:
        return target.relative_to(workspace.resolve()).as_posix()
    except ValueError:
        return None


def plan_rewind(events: list[AnyEvent], workspace: Path, to_turn: int, blobs: BlobStore | None,
                repo: ShadowRepo | None = None) -> Plan:
    """What rewinding to before `to_turn` would do, looked at now (nothing in the workspace is changed). With the
    workspace's shadow repository and a snapshot of that turn's start, the whole workspace goes back to it (commands'
    changes included); otherwise what the file tools changed goes back to their before-images."""
    if to_turn not in turns_of(events):
        known = turns_of(events)
        raise RewindRefused(f"there is no turn {to_turn} in this session"
                            + (f" (turns {known[0]}–{known[-1]})" if known else " (it has no turns yet)"))
    start = next((e for e in events if isinstance(e, WorkspaceSnapshot) and e.turn == to_turn
                  and e.at == "turn-start"), None)
    if repo is not None and start is not None:
        try:
            return _snapshot_plan(events, workspace, to_turn, repo, start)
        except SnapshotUnavailable:
            pass  # no usable snapshot (git gone, repository pruned): the file tools' before-images still work
    return _file_plan(events, workspace, to_turn, blobs)


def _snapshot_plan(events: list[AnyEvent], workspace: Path, to_turn: int, repo: ShadowRepo,
                   start: WorkspaceSnapshot) -> Plan:
    """Every path that differs between the workspace now and the turn's start tree; a path that differs from the last
    snapshot Cairn took (and that Cairn's own file tools did not write since) was changed outside Cairn."""
    now = repo.snapshot().tree
    last = max((e for e in events if isinstance(e, WorkspaceSnapshot)), key=lambda e: e.seq)
    outside = set(repo.changed_between(last.tree, now))
    for e in events:  # what Cairn's file tools wrote after that snapshot is Cairn's
        if isinstance(e, ToolCall) and e.seq > last.seq and e.after_sha256 and isinstance(e.arguments, dict):
            path = _relative(workspace, str(e.arguments.get("path", "")))
            target = inside(workspace, path) if path else None
            with contextlib.suppress(OSError, ValueError):
                if path in outside and target is not None and sha256_of_file(target) == e.after_sha256:
                    outside.discard(path)
    blobs_then = {}
    for line in repo.run("ls-tree", "-r", "-z", start.tree).decode("utf-8", "surrogateescape").split("\0"):
        if "\t" in line:
            meta, path = line.split("\t", 1)
            blobs_then[path] = "git:" + meta.split()[2]
    files = []
    for path in repo.changed_between(now, start.tree):
        target = inside(workspace, path)
        item = FilePlan(path, blobs_then.get(path), set())
        try:
            item.current_sha256 = sha256_of_file(target) if target is not None else None
        except (OSError, ValueError):
            item.readable = False
        if path not in outside:
            item.expected = {item.current_sha256}
        files.append(item)
    return Plan(to_turn, files, [], tree=start.tree, after_interruption=last.at != "turn-end")


def _file_plan(events: list[AnyEvent], workspace: Path, to_turn: int, blobs: BlobStore | None) -> Plan:
    results = {e.source_seq: e for e in events if isinstance(e, ToolResult) and e.source_seq is not None}
    by_path: dict[str, FilePlan] = {}
    commands: set[int] = set()
    for e in events:
        if not isinstance(e, ToolCall) or e.turn < to_turn or e.parent_call_id is not None:
            continue
        result = results.get(e.seq)
        if e.name in COMMAND_TOOLS:
            if result is None or not result.is_error or result.error_code == TOOL_OUTCOME_UNKNOWN:
                commands.add(e.turn)
            continue
        if e.name not in FILE_TOOLS or e.after_sha256 is None or not isinstance(e.arguments, dict):
            continue
        ran = result is None or not result.is_error or result.error_code == TOOL_OUTCOME_UNKNOWN
        if not ran:
            continue
        path = _relative(workspace, str(e.arguments.get("path", "")))
        if path is None:
            continue
        unknown = result is None or result.error_code == TOOL_OUTCOME_UNKNOWN
        left = {e.before_sha256, e.after_sha256} if unknown else {e.after_sha256}
        if path not in by_path:
            by_path[path] = FilePlan(path, e.before_sha256, left)
        else:
            by_path[path].expected = left | ({by_path[path].restore_sha256} if unknown else set())
        by_path[path].last_seq = e.seq
    # a rewind since Cairn's last write to a path left it too (an abandoned one may have restored some files)
    plans = {e.rewind_id: e for e in events if isinstance(e, RewindPlan)}
    for e in events:
        if isinstance(e, RewindStep) and e.outcome == "done" and e.path in by_path and e.rewind_id in plans:
            item = by_path[e.path]
            if e.seq > item.last_seq:
                item.expected |= {f.restore_sha256 for f in plans[e.rewind_id].files if f.path == e.path}
    for item in by_path.values():
        target = inside(workspace, item.path)
        try:
            item.current_sha256 = sha256_of_file(target) if target is not None else None
        except (OSError, ValueError):
            item.readable = False
        if item.restore_sha256 is not None and not item.already:
            item.restorable = blobs is not None and blobs.get(item.restore_sha256) is not None
    return Plan(to_turn, sorted(by_path.values(), key=lambda f: f.path), sorted(commands))


def pending_rewind(events: list[AnyEvent]) -> tuple[RewindPlan, set[str]] | None:
    """An interrupted rewind: its plan and the paths already restored; None when every plan has its end."""
    ended = {e.rewind_id for e in events if isinstance(e, RewindEnd)}
    plan = next((e for e in reversed(events) if isinstance(e, RewindPlan) and e.rewind_id not in ended), None)
    if plan is None:
        return None
    done = {e.path for e in events if isinstance(e, RewindStep) and e.rewind_id == plan.rewind_id
            and e.outcome == "done"}
    return plan, done


@dataclass
class Outcome:
    to_turn: int
    restored: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    conversation: bool = False
    command_turns: list[int] = field(default_factory=list)


def _restore(workspace: Path, path: str, data: bytes | None) -> None:
    """Put `data` at `path` (None: delete it) atomically, never following a symlink by name."""
    from ..tools.files import atomic_write
    from ..tools.workspace import MissingPath, locate

    try:
        with locate(workspace, path, make_parents=data is not None) as found:
            if found.name is None or found.is_dir:
                raise OSError(f"{path} is a directory now")
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(found.name, dir_fd=found.dir_fd)
                    os.fsync(found.dir_fd)
            else:
                atomic_write(found.dir_fd, found.name, data)
    except MissingPath:
        if data is not None:
            raise


async def rewind(session: LiveSession, workspace: Path, blobs: BlobStore | None, to_turn: int, scope: Scope = "both",
                 force: bool = False, repo: ShadowRepo | None = None) -> Outcome:
    """Rewind `session` to before `to_turn`. Raises RewindRefused (nothing changed) when a rewind is pending, the turn
    does not exist, or files were changed outside Cairn and `force` is not set. `repo`: the workspace's shadow
    repository, so a turn with a start snapshot goes back whole (commands' changes included)."""
    import anyio.to_thread

    events = session.events
    if pending_rewind(events) is not None:
        raise RewindRefused("an interrupted rewind is pending: finish it or abandon it first")
    plan = await anyio.to_thread.run_sync(plan_rewind, events, workspace, to_turn, blobs, repo)
    files = scope in ("files", "both")
    if files and plan.changed_outside and not force:
        if plan.after_interruption:
            why = ("changed since Cairn's last snapshot, taken before a turn was interrupted (the interrupted command "
                   "or someone else changed them)")
        else:
            why = "changed outside Cairn since Cairn last wrote it"
        raise RewindRefused(f"{why}: " + ", ".join(plan.changed_outside) + " (use --force to overwrite)",
                            plan.changed_outside)
    chosen = [f for f in plan.files if f.restorable and not f.already] if files else []
    record = RewindPlan(
        rewind_id=secrets.token_hex(6), to_turn=to_turn, conversation=scope in ("conversation", "both"),
        files=[RewindFile(path=f.path, restore_sha256=f.restore_sha256,
                          expected_sha256=f.current_sha256 if f.readable else None) for f in chosen],
        commands_in=plan.command_turns, tree=plan.tree if files else None,
    )
    session.append(record)
    await session.flush()  # the plan is durable before the first file is touched
    outcome = await _carry_out(session, workspace, blobs, record, set(), force, repo)
    if files:
        why = "its earlier content was not kept (over 10 MB, or it held a configured secret)"
        outcome.skipped += [(path, why) for path in plan.not_restorable]
    return outcome


async def finish_rewind(session: LiveSession, workspace: Path, blobs: BlobStore | None, force: bool = False,
                        repo: ShadowRepo | None = None) -> Outcome:
    """Finish an interrupted rewind: each file not yet restored is checked again and restored when it still holds what
    the plan expected (or, with `force`, whatever it holds)."""
    pending = pending_rewind(session.events)
    if pending is None:
        raise RewindRefused("no interrupted rewind to finish")
    plan, done = pending
    return await _carry_out(session, workspace, blobs, plan, done, force, repo)


async def abandon_rewind(session: LiveSession) -> RewindPlan:
    pending = pending_rewind(session.events)
    if pending is None:
        raise RewindRefused("no interrupted rewind to abandon")
    session.append(RewindEnd(rewind_id=pending[0].rewind_id, outcome="abandoned"))
    await session.flush()
    return pending[0]


async def _carry_out(session: LiveSession, workspace: Path, blobs: BlobStore | None, plan: RewindPlan,
                     done: set[str], force: bool, repo: ShadowRepo | None = None) -> Outcome:
    import anyio.to_thread

    from .failpoints import rewind_point

    outcome = Outcome(plan.to_turn, command_turns=list(plan.commands_in), conversation=plan.conversation)
    await rewind_point("rewind-planned", session)
    if plan.tree is not None:  # the whole workspace back to a snapshot: one read-tree, safe to run again
        why = await anyio.to_thread.run_sync(_restore_tree, repo, plan.tree)
        for item in plan.files:
            if why is None:
                outcome.restored.append(item.path)
                session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="done"))
            else:
                outcome.skipped.append((item.path, why))
                session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="skipped", detail=why))
        return await _close(session, plan, outcome)
    for item in plan.files:
        if item.path in done:
            outcome.restored.append(item.path)
            continue
        why = await anyio.to_thread.run_sync(_restore_one, workspace, blobs, item, force)
        if why is None:
            outcome.restored.append(item.path)
            session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="done"))
            await rewind_point("rewind-restored", session)
        else:
            outcome.skipped.append((item.path, why))
            session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="skipped", detail=why))
    return await _close(session, plan, outcome)


async def _close(session: LiveSession, plan: RewindPlan, outcome: Outcome) -> Outcome:
    if plan.conversation:
        session.append(ConversationRewind(to_turn=plan.to_turn, files=outcome.restored))
    session.append(RewindEnd(rewind_id=plan.rewind_id, outcome="completed"))
    await session.flush()
    return outcome


def _restore_tree(repo: ShadowRepo | None, tree: str) -> str | None:
    """Put the workspace back to a snapshot tree; None when done, else why not."""
    if repo is None:
        return "workspace snapshots are off or git is missing: finish this rewind where git is available"
    try:
        repo.restore(tree)
    except SnapshotUnavailable as e:
        return str(e)
    return None


def _restore_one(workspace: Path, blobs: BlobStore | None, item: RewindFile, force: bool) -> str | None:
    """Restore one planned file; None when done, else why it was left as it is."""
    target = inside(workspace, item.path)
    if target is None:
        return "it is outside the workspace now"
    try:
        now = sha256_of_file(target)
    except (OSError, ValueError) as e:
        return f"it cannot be read ({e})"
    if now == item.restore_sha256:
        return None  # already as it was (restored before a crash, or never changed)
    if now != item.expected_sha256 and not force:
        return "it changed after the rewind was planned"
    data = None
    if item.restore_sha256 is not None:
        data = blobs.get(item.restore_sha256) if blobs is not None else None
        if data is None:
            return "its earlier content is not in the store"
    try:
        _restore(workspace, item.path, data)
    except OSError as e:
        return f"it could not be written ({e.strerror or e})"
    return None


def describe(outcome: Outcome) -> list[str]:
    """The lines an operator reads after a rewind."""
    lines = []
    if outcome.restored:
        lines.append(f"restored to before turn {outcome.to_turn}: " + ", ".join(outcome.restored))
    for path, why in outcome.skipped:
        lines.append(f"not restored: {path}: {why}")
    if outcome.conversation:
        lines.append(f"the conversation continues from before turn {outcome.to_turn}")
    if outcome.command_turns:
        lines.append("commands ran in turn" + ("s " if len(outcome.command_turns) > 1 else " ")
                     + ", ".join(map(str, outcome.command_turns)) + ": what they changed is not restored")
    if not lines:
        lines.append(f"nothing to restore from turn {outcome.to_turn} on")
    return lines

