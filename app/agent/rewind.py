"""Rewind (SPEC §9 rev 3, §10 rev 4): take back what Cairn did in turns N and later — files, conversation, or both.

**What Cairn did, nothing else.** With workspace snapshots, the log holds a tree at each turn's start and end (and
around commands and rewinds). The snapshots from turn N's start to now cut time into intervals: inside a turn (or a
rewind) the changes are Cairn's; between turns, and after the last snapshot, they are someone else's (the operator, an
editor, another program). A path a turn changed goes back to what it held when the first such turn began; a path only
someone else changed is named and left alone; a path a turn changed and someone else changed after it is a conflict,
named, and nothing is touched without `force`. An interval after a turn that never reached its end snapshot (a crash)
is nobody's for sure: what changed there counts as someone else's, unless it is exactly what one of Cairn's file tools
wrote.

**Only what Cairn captured, at both ends.** A path goes back to content only from a tree, and is deleted only when the
tree did not hold it and the snapshot's manifest does not list it as left out (ignored, over the size limit, a nested
repository, a special file, holding a secret) — each snapshot's own rules, not today's `.gitignore`. A path whose
content now cannot be kept (left out of the snapshot taken now) is not touched, as nothing could bring it back.

Without snapshots (no git, `snapshots = "off"`) the file tools' fingerprints say the same from the log alone: a path
goes back to its before-image, a file that holds neither what Cairn last wrote nor the target was changed outside.

**Crash safety and undo.** The plan (`rewind/plan`) — with the state of every path it will change, kept in the shadow
repository (a `rewind-start` snapshot) or as before-images — is durable before the first file is touched; each path
restored is recorded durably (`rewind/file`, a barrier before the next path is touched); `conversation/rewind` and
`rewind/end` close it. A plan without an end is an
interrupted rewind: everything else waits until it is finished (each path checked against the plan's expected state
first; a path outside the plan is never touched) or abandoned. `undo_rewind` is a rewind whose plan is the inverse of
the most recent one's: what it changed goes back to what the plan recorded it held.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cairn.persistence.blobs import BlobStore
from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ConversationRewind,
    NotRestored,
    RewindEnd,
    RewindFile,
    RewindPlan,
    RewindStep,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
    WorkspaceMoved,
    WorkspaceSnapshot,
)
from cairn.persistence.evidence import FILE_TOOLS, inside, sha256_of_file
from cairn.persistence.session import LiveSession

from ..tools.files import atomic_write
from .snapshots import GITLINK, IGNORED, NESTED, SYMLINK, LeftOut, ShadowRepo, Snapshot, SnapshotUnavailable, state_of

Scope = Literal["files", "conversation", "both"]
# `force`: True overwrites every path someone else changed too; a set of paths (the TUI, asked path by path) overwrites
# those and leaves every other such path alone, named, without refusing the rewind
Force = bool | frozenset[str]
COMMAND_TOOLS = ("run_command",)
GIT = "git:"  # a content id naming a blob of the shadow repository (else: a sha256 of the before-image store)
MAX_KEPT = 10 * 1024 * 1024  # a path whose current content is larger cannot be kept as a before-image: not touched

State = tuple[str | None, str] | None  # (git mode or None, content id); None: nothing there


class RewindRefused(Exception):
    """A rewind that cannot be done as asked (an unknown turn, a conflict with someone else's change, a rewind
    pending). `changed` names the paths in conflict (exit 3); nothing was touched."""

    def __init__(self, message: str, changed: list[str] | None = None) -> None:
        super().__init__(message)
        self.changed = changed or []


@dataclass
class FilePlan:
    """One path: what it goes back to, what it holds now, and whether someone else changed it too."""

    path: str
    restore_sha256: str | None  # None: it did not exist then (restoring deletes it)
    expected: set[str | None]  # contents Cairn may have left there (file tools' mode; an unknown outcome: both)
    current_sha256: str | None = None
    readable: bool = True
    restorable: bool = True  # False: the content to restore was not kept (over the size limit, or lost)
    last_seq: int = -1  # the seq of Cairn's last call that changed it
    restore_mode: str | None = None
    current_mode: str | None = None
    conflict: str = ""  # why someone else's change is in the way ("" none)

    @property
    def already(self) -> bool:
        return self.readable and self.current_sha256 == self.restore_sha256 and (
            self.restore_mode is None or self.current_mode == self.restore_mode)

    @property
    def changed_outside(self) -> bool:
        if self.conflict:
            return not self.already
        return not self.readable or (not self.already and self.current_sha256 not in self.expected)


@dataclass
class Plan:
    to_turn: int
    files: list[FilePlan] = field(default_factory=list)
    command_turns: list[int] = field(default_factory=list)  # turns that ran commands: not restorable (no snapshots)
    tree: str | None = None  # the turn's start tree, when snapshots drive the plan
    after_interruption: bool = False  # a turn in range never reached its end snapshot (a crash)
    not_restored: list[tuple[str, str]] = field(default_factory=list)  # (path, why): left alone
    outside: list[FilePlan] = field(default_factory=list)  # changed only by someone else: restored only when forced
    now: Snapshot | None = None  # the snapshot taken while planning (what an undo puts back)
    undo_of: RewindPlan | None = None
    covered: set[str] = field(default_factory=set)  # the paths the snapshots' trees speak for

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


def _since_move(events: list[AnyEvent]) -> tuple[list[AnyEvent], int]:
    """The events since the session's workspace last moved (snapshots before a move never apply to the new place),
    and the seq of that move (-1: it never moved)."""
    moved = next((e.seq for e in reversed(events) if isinstance(e, WorkspaceMoved)), -1)
    return (events if moved < 0 else [e for e in events if e.seq > moved]), moved


def forced(force: Force, path: str) -> bool:
    return force is True or (isinstance(force, frozenset) and path in force)


def plan_rewind(events: list[AnyEvent], workspace: Path, to_turn: int, blobs: BlobStore | None,
                repo: ShadowRepo | None = None, force: Force = False) -> Plan:
    """What rewinding to before `to_turn` would do, looked at now (nothing in the workspace is changed; with snapshots,
    the workspace is snapshotted). Raises RewindRefused for a turn that does not exist or ran before a move."""
    known = turns_of(events)
    if to_turn not in known:
        raise RewindRefused(f"there is no turn {to_turn} in this session"
                            + (f" (turns {known[0]}–{known[-1]})" if known else " (it has no turns yet)"))
    current, moved = _since_move(events)
    start_seq = next(e.seq for e in events if isinstance(e, TurnStart) and e.turn == to_turn)
    if start_seq < moved:
        raise RewindRefused(f"turn {to_turn} ran before the session's workspace moved to {workspace}: "
                            "rewind goes back only to turns since the move")
    start = next((e for e in current if isinstance(e, WorkspaceSnapshot) and e.turn == to_turn
                  and e.at == "turn-start"), None)
    if repo is not None and start is not None:
        try:
            plan = _snapshot_plan(current, workspace, to_turn, repo, start, force)
        except SnapshotUnavailable:
            pass  # no usable snapshot (git gone, repository pruned): the file tools' before-images still work
        else:
            _add_file_tools_changes(plan, _file_plan(current, workspace, to_turn, blobs))
            return plan
    return _file_plan(current, workspace, to_turn, blobs)


def _add_file_tools_changes(plan: Plan, by_tools: Plan) -> None:
    """What Cairn's own file tools changed on paths no snapshot holds (ignored, say) goes back from their
    before-images, as it would without snapshots."""
    extra = [f for f in by_tools.files if f.path not in plan.covered and not f.already]
    if not extra:
        return
    paths = {f.path for f in extra}
    plan.files = sorted(plan.files + [f for f in extra if f.restorable], key=lambda f: f.path)
    plan.not_restored = sorted([(p, why) for p, why in plan.not_restored if p not in paths]
                               + [(p, why) for p, why in by_tools.not_restored if p in paths])


# -- with snapshots ----------------------------------------------------------------------------------------------------

@dataclass
class _Interval:
    start: WorkspaceSnapshot
    end: WorkspaceSnapshot | None  # None: now
    kind: Literal["cairn", "outside", "unknown"]
    changed: set[str]


def _same_activity(a: WorkspaceSnapshot, b: WorkspaceSnapshot) -> bool:
    if a.at in ("turn-start", "command") and b.at in ("command", "turn-end"):
        return a.turn == b.turn
    return a.at == "rewind-start" and b.at == "rewind-end" and a.call_id == b.call_id


def _intervals(events: list[AnyEvent], start: WorkspaceSnapshot, now: WorkspaceSnapshot,
               repo: ShadowRepo) -> list[_Interval]:
    shots = [e for e in events if isinstance(e, WorkspaceSnapshot) and e.seq >= start.seq] + [now]
    turn_starts = [e for e in events if isinstance(e, TurnStart)]
    out = []
    for a, b in zip(shots, shots[1:]):
        if _same_activity(a, b):
            kind: Literal["cairn", "outside", "unknown"] = "cairn"
        elif a.at in ("turn-start", "command", "rewind-start"):
            kind = "unknown"  # the turn (or rewind) never reached its end snapshot: a crash, or snapshots went off
        elif any(a.seq < t.seq < b.seq and not (b.at == "turn-start" and b.turn == t.turn) for t in turn_starts):
            kind = "unknown"  # a whole turn ran without snapshots in between
        else:
            kind = "outside"
        out.append(_Interval(a, b if b is not now else None, kind, set(repo.changed_between(a.tree, b.tree))))
    return out


def _left_out_at(path: str, manifest: list[LeftOut]) -> str | None:
    for entry in manifest:
        if entry.path == path or (entry.path.endswith("/") and (path + "/").startswith(entry.path)):
            return entry.reason
    return None


def _state_at(repo: ShadowRepo, shot: WorkspaceSnapshot | Snapshot, path: str) -> tuple[State, str | None]:
    """What `path` held at a snapshot: (state, None), or (None, why Cairn cannot tell or did not keep it)."""
    entry = repo.entries(shot.tree).get(path)
    if entry is not None:
        if entry[0] == GITLINK:
            return None, "a nested repository (Cairn does not capture inside it)"
        return (entry[0], GIT + entry[1]), None
    if shot.manifest is None:
        return None, "the snapshot then (from before rev 4) did not record what it left out"
    why = _left_out_at(path, repo.manifest(shot.manifest))
    if why is not None:
        return None, why
    return None, None


def _where(shot: WorkspaceSnapshot) -> str:
    return {"turn-start": f"turn {shot.turn}'s start", "turn-end": f"turn {shot.turn}'s end",
            "command": f"the start of a command of turn {shot.turn}"}.get(shot.at, "a rewind")


def _snapshot_plan(events: list[AnyEvent], workspace: Path, to_turn: int, repo: ShadowRepo,
                   start: WorkspaceSnapshot, force: Force) -> Plan:
    now = repo.snapshot()
    now_event = WorkspaceSnapshot(seq=1 << 62, turn=0, at="now", tree=now.tree, manifest=now.manifest)
    intervals = _intervals(events, start, now_event, repo)
    cairn_wrote = _written_after_last_shot(events, workspace, intervals)
    plan = Plan(to_turn, tree=start.tree, now=now,
                after_interruption=any(i.kind == "unknown" for i in intervals))
    paths = sorted(set().union(*(i.changed for i in intervals))) if intervals else []
    for path in paths:
        first: int | None = None
        conflict = ""
        for n, interval in enumerate(intervals):
            if path not in interval.changed:
                continue
            kind = "cairn" if path in cairn_wrote.get(n, set()) else interval.kind
            if kind == "cairn":
                if first is None:
                    first = n
                elif conflict:
                    break
            elif kind == "unknown" and not conflict:
                # maybe the interrupted turn's command, maybe someone else: the operator decides (--force)
                first = n if first is None else first
                conflict = "changed after a turn was interrupted (by its command or someone else)"
            elif first is not None and not conflict:
                conflict = "changed outside Cairn after a turn changed it"
        origin = intervals[first].start if first is not None else start
        target, why_not = _state_at(repo, origin, path)
        current, why_now = _state_at(repo, now, path)
        item = FilePlan(path, target[1] if target else None, set(), restore_mode=target[0] if target else None,
                        conflict=conflict)
        item.current_sha256, item.current_mode = (current[1], current[0]) if current else (None, None)
        if why_not is not None:
            plan.not_restored.append((path, f"not captured at {_where(origin)}: {why_not}"))
            continue
        if why_now is not None:
            plan.not_restored.append((path, f"{why_now} now: what it holds cannot be kept, so nothing could bring "
                                            "it back"))
            continue
        if item.already:
            continue
        item.expected = {item.current_sha256}
        if first is None:
            item.conflict = "changed outside Cairn's turns"
            plan.outside.append(item)
            if not forced(force, path):
                plan.not_restored.append((path, "changed outside Cairn's turns (by you or another program): left "
                                                "alone (--force restores it too)"))
            continue
        plan.files.append(item)
    if force:
        plan.files = sorted(plan.files + [f for f in plan.outside if forced(force, f.path)], key=lambda f: f.path)
    for interval in intervals:  # a nested repository changed in the range is named, never entered
        for path in interval.changed:
            entry = repo.entries(interval.end.tree if interval.end else now.tree).get(path)
            if entry is not None and entry[0] == GITLINK and path not in {p for p, _ in plan.not_restored}:
                plan.not_restored.append((path, "a nested repository: what changed inside it is not captured"))
    plan.covered = set(paths)
    named = {p for p, _ in plan.not_restored}
    for path, reason in _left_out_changes(repo, [i.start for i in intervals] + [now_event]):
        if path not in named:
            if path.endswith("/"):  # a nested repository, an ignored directory: never entered
                plan.not_restored.append((path, f"{reason}: what changed inside it is not captured"))
            else:  # left out of snapshots and changed in the range: Cairn cannot take back what it never held
                plan.not_restored.append((path, f"{reason}: left out of snapshots, Cairn never held it"))
    plan.not_restored.sort()
    return plan


def _signature(entry: LeftOut) -> tuple[str, int, int, int]:
    return entry.kind, entry.size, entry.mtime_ns, entry.mode


def _left_out_changes(repo: ShadowRepo, shots: list[WorkspaceSnapshot]) -> list[tuple[str, str]]:
    """Paths left out of snapshots that changed between two snapshots of the range (type, size, mtime or mode; came
    or went while not captured), with why they were left out; a directory left out whole (a nested repository, an
    ignored directory) always, since nothing inside it is seen."""
    found: dict[str, str] = {}
    held: dict[str, set[str]] = {}

    def captured(shot: WorkspaceSnapshot) -> set[str]:
        """The paths of the tree, and their directories (a `build/` entry is captured once a file in it is)."""
        if shot.tree not in held:
            paths = set(repo.entries(shot.tree))
            held[shot.tree] = paths | {p[: i + 1] for p in paths for i, c in enumerate(p) if c == "/"}
        return held[shot.tree]

    def listed(shot: WorkspaceSnapshot) -> dict[str, LeftOut]:
        return {e.path: e for e in repo.manifest(shot.manifest)} if shot.manifest else {}

    for a, b in zip(shots, shots[1:]):
        if a.manifest is None or b.manifest is None:
            continue  # a snapshot from before rev 4 lists nothing
        then, later = listed(a), listed(b)
        for path in (set(then) | set(later)) - set(found):
            before, after = then.get(path), later.get(path)
            left = after or before
            assert left is not None
            if left.reason == NESTED or path.endswith("/"):
                found[path] = left.reason  # a directory left out whole: nothing inside it is seen, so say so
            elif before is not None and after is not None:
                if _signature(before) != _signature(after):
                    found[path] = left.reason
            elif path not in (captured(b) if after is None else captured(a)):
                found[path] = left.reason  # came or went while Cairn was not capturing it
    return sorted(found.items())


def _written_after_last_shot(events: list[AnyEvent], workspace: Path, intervals: list[_Interval]) -> dict[int, set[str]]:
    """In the last interval, when it follows a turn that never reached its end snapshot: the paths that hold exactly
    what one of Cairn's file tools wrote after that snapshot — Cairn's, not someone else's."""
    if not intervals or intervals[-1].kind != "unknown":
        return {}
    last = intervals[-1]
    found = set()
    for e in events:
        if isinstance(e, ToolCall) and e.seq > last.start.seq and e.after_sha256 and isinstance(e.arguments, dict):
            path = _relative(workspace, str(e.arguments.get("path", "")))
            target = inside(workspace, path) if path else None
            with contextlib.suppress(OSError, ValueError):
                if path in last.changed and target is not None and sha256_of_file(target) == e.after_sha256:
                    found.add(path)
    return {len(intervals) - 1: found}


# -- from the file tools' fingerprints (no snapshots) ------------------------------------------------------------------

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
    plan = Plan(to_turn, sorted(by_path.values(), key=lambda f: f.path), sorted(commands))
    plan.not_restored = [(p, "its earlier content was not kept (over 10 MB, or it held a configured secret)")
                         for p in plan.not_restorable]
    return plan


# -- an interrupted rewind, and the most recent one ------------------------------------------------------------------

def pending_rewind(events: list[AnyEvent]) -> tuple[RewindPlan, set[str]] | None:
    """An interrupted rewind: its plan and the paths already restored; None when every plan has its end."""
    ended = {e.rewind_id for e in events if isinstance(e, RewindEnd)}
    plan = next((e for e in reversed(events) if isinstance(e, RewindPlan) and e.rewind_id not in ended), None)
    if plan is None:
        return None
    done = {e.path for e in events if isinstance(e, RewindStep) and e.rewind_id == plan.rewind_id
            and e.outcome == "done"}
    return plan, done


def pending_text(plan: RewindPlan, done: set[str], session_id: str) -> str:
    """One line for every face: what is waiting, and what to do about it."""
    left = [f.path for f in plan.files if f.path not in done]
    what = "an undo of a rewind" if plan.undo_of else f"a rewind to before turn {plan.to_turn}"
    return (f"{what} was interrupted (restored: {', '.join(sorted(done)) or 'none'}; not yet: "
            f"{', '.join(left) or 'none'}); nothing else runs until it is settled: "
            f"cairn rewind {session_id} --finish, or --abandon")


def last_rewind(events: list[AnyEvent]) -> RewindPlan | None:
    """The most recent completed rewind (an undo counts: undoing it again redoes what it undid)."""
    completed = {e.rewind_id for e in events if isinstance(e, RewindEnd) and e.outcome == "completed"}
    return next((e for e in reversed(events) if isinstance(e, RewindPlan) and e.rewind_id in completed), None)


def plan_undo(events: list[AnyEvent], workspace: Path, repo: ShadowRepo | None) -> Plan:
    """The inverse of the most recent rewind: each path it restored goes back to what its plan recorded it held."""
    undone = last_rewind(events)
    if undone is None:
        raise RewindRefused("there is no rewind to undo in this session")
    if undone.workspace is not None and Path(undone.workspace) != Path(workspace).resolve():
        raise RewindRefused(f"the last rewind ran in {undone.workspace}, not in {workspace}: it cannot be undone here")
    done = {e.path for e in events if isinstance(e, RewindStep) and e.rewind_id == undone.rewind_id
            and e.outcome == "done"}
    now = None
    if repo is not None:
        # what each path holds now is what the undone rewind wrote (else a conflict): already kept; this snapshot
        # only lets the undo be undone in turn, so an undo goes on without it
        with contextlib.suppress(SnapshotUnavailable):
            now = repo.snapshot()
    plan = Plan(undone.to_turn, now=now, undo_of=undone)
    for f in undone.files:
        if f.path not in done:
            continue
        git = f.expected_sha256 is not None and f.expected_sha256.startswith(GIT) or \
            f.restore_sha256 is not None and f.restore_sha256.startswith(GIT)
        item = FilePlan(real_path(f), f.expected_sha256, {f.restore_sha256}, restore_mode=f.expected_mode)
        item.restorable = f.expected_sha256 is None or _content_known(f.expected_sha256, repo)
        try:
            current = _current_state(workspace, item.path, git)
            item.current_mode, item.current_sha256 = (current[0], current[1]) if current else (None, None)
        except (OSError, ValueError):
            item.readable = False
        if item.already:
            continue
        if not item.readable or item.current_sha256 != f.restore_sha256 or (
                f.restore_mode is not None and item.current_mode != f.restore_mode):
            item.conflict = "changed since the rewind put it back"
        plan.files.append(item)
    return plan


# -- carrying a plan out ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    to_turn: int
    restored: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    conversation: bool = False
    command_turns: list[int] = field(default_factory=list)
    undo: bool = False


async def rewind(session: LiveSession, workspace: Path, blobs: BlobStore | None, to_turn: int, scope: Scope = "both",
                 force: Force = False, repo: ShadowRepo | None = None) -> Outcome:
    """Rewind `session` to before `to_turn`. Raises RewindRefused (nothing changed) when a rewind is pending, the turn
    does not exist, or a path a turn changed was changed by someone else too and `force` is False."""
    import anyio.to_thread

    _refuse_if_pending(session)
    files = scope in ("files", "both")
    plan = await anyio.to_thread.run_sync(plan_rewind, session.events, workspace, to_turn, blobs,
                                          repo if files else None, force)
    return await _apply(session, workspace, blobs, repo, plan, files, scope in ("conversation", "both"), force)


async def undo_rewind(session: LiveSession, workspace: Path, blobs: BlobStore | None, force: Force = False,
                      repo: ShadowRepo | None = None) -> Outcome:
    """Put files and conversation back as they were just before the most recent rewind (crash-safe like a rewind)."""
    import anyio.to_thread

    _refuse_if_pending(session)
    plan = await anyio.to_thread.run_sync(plan_undo, session.events, workspace, repo)
    assert plan.undo_of is not None
    return await _apply(session, workspace, blobs, repo, plan, True, plan.undo_of.conversation, force)


def _refuse_if_pending(session: LiveSession) -> None:
    pending = pending_rewind(session.events)
    if pending is not None:
        raise RewindRefused(pending_text(*pending, session.id))


async def _apply(session: LiveSession, workspace: Path, blobs: BlobStore | None, repo: ShadowRepo | None, plan: Plan,
                 files: bool, conversation: bool, force: Force) -> Outcome:
    import anyio.to_thread

    if isinstance(force, frozenset):  # asked path by path: what the operator kept is left alone, and named
        kept_back = [f for f in plan.files if f.changed_outside and f.path not in force]
        plan.files = [f for f in plan.files if f not in kept_back]
        plan.not_restored = sorted(plan.not_restored + [(f.path, f"{f.conflict or 'changed outside Cairn'}: you chose "
                                                                 "to leave it") for f in kept_back])
    if files and plan.changed_outside and not force:
        if plan.undo_of is not None:
            why = "changed since the rewind put it back"
        elif plan.after_interruption and any(f.conflict.startswith("changed after") for f in plan.files):
            why = ("changed since Cairn's last snapshot, taken before a turn was interrupted (the interrupted command "
                   "or someone else changed them)")
        else:
            why = "changed outside Cairn after a turn changed it" if plan.tree else \
                "changed outside Cairn since Cairn last wrote it"
        raise RewindRefused(f"{why}: " + ", ".join(plan.changed_outside) + " (use --force to overwrite)",
                            plan.changed_outside)
    chosen = [f for f in plan.files if f.restorable and not f.already] if files else []
    # deletions first, deepest first, then what is written: a directory a turn made where a file was is emptied
    # before the file comes back (and the reverse)
    chosen.sort(key=lambda f: (f.restore_sha256 is not None, -f.path.count("/") if f.restore_sha256 is None else 0,
                               f.path))
    rewind_id = secrets.token_hex(6)
    kept = await anyio.to_thread.run_sync(_keep_current, workspace, blobs, chosen, plan.now)
    record = RewindPlan(
        rewind_id=rewind_id, to_turn=plan.to_turn, conversation=conversation,
        files=[RewindFile(path=f.path, restore_sha256=f.restore_sha256, expected_sha256=f.current_sha256,
                          restore_mode=f.restore_mode, expected_mode=f.current_mode, raw_path=_raw(f.path))
               for f in chosen if f.path not in kept],
        commands_in=plan.command_turns,
        undo_of=plan.undo_of.rewind_id if plan.undo_of is not None else None,
        workspace=str(Path(workspace).resolve()), before_tree=plan.now.tree if plan.now else None,
        not_restored=[NotRestored(path=p, reason=why) for p, why in plan.not_restored + list(kept.items())]
        if files else [],
    )
    if plan.now is not None and files:
        session.append(WorkspaceSnapshot(turn=_last_turn(session.events), at="rewind-start", tree=plan.now.tree,
                                         call_id=rewind_id, left_out=[p for p, _ in plan.now.left_out],
                                         manifest=plan.now.manifest, workspace=str(Path(workspace).resolve())))
    session.append(record)
    await session.flush()  # the plan, and what it replaces, are durable before the first file is touched
    outcome = await _carry_out(session, workspace, blobs, record, set(), force is True, repo)
    outcome.undo = plan.undo_of is not None
    return outcome


def _raw(path: str) -> str | None:
    """The name's bytes, when the log cannot hold it as text (not UTF-8)."""
    try:
        path.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return base64.b64encode(os.fsencode(path)).decode()


def real_path(item: RewindFile) -> str:
    """The path a plan's entry names on disk (its bytes, for a name that is not UTF-8)."""
    return os.fsdecode(base64.b64decode(item.raw_path)) if item.raw_path else item.path


def _last_turn(events: list[AnyEvent]) -> int:
    return max(turns_of(events) or [0])


def _keep_current(workspace: Path, blobs: BlobStore | None, chosen: list[FilePlan],
                  now: Snapshot | None) -> dict[str, str]:
    """Keep what each chosen path holds now, so the rewind can be undone: in the snapshot just taken (shadow
    repository) or as a before-image. Returns the paths that cannot be kept, with why (they are not touched)."""
    cannot: dict[str, str] = {}
    for item in chosen:
        if item.current_sha256 is None or item.current_sha256.startswith(GIT):
            continue  # nothing there, or held by the snapshot just taken
        target = inside(workspace, item.path)
        try:
            data = _read_nofollow(target) if target is not None else None
        except OSError as e:
            cannot[item.path] = f"it cannot be read ({e.strerror or e})"
            continue
        if data is None:
            continue
        if blobs is None or len(data) > MAX_KEPT:
            cannot[item.path] = "what it holds now cannot be kept (over 10 MB, or no store): nothing could bring it back"
            continue
        try:
            blobs.put(data)
        except Exception as e:  # a store that failed: the path is left alone, never changed without its way back
            cannot[item.path] = f"what it holds now could not be kept ({e})"
    return cannot


def _read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return f.read()


async def finish_rewind(session: LiveSession, workspace: Path, blobs: BlobStore | None, force: bool = False,
                        repo: ShadowRepo | None = None) -> Outcome:
    """Finish an interrupted rewind: every path not yet restored is checked against the state the plan expected
    first; a path that changed since is refused (RewindRefused naming it, nothing touched) unless `force`."""
    import anyio.to_thread

    pending = pending_rewind(session.events)
    if pending is None:
        raise RewindRefused("no interrupted rewind to finish")
    plan, done = pending
    if plan.workspace is not None and Path(plan.workspace) != Path(workspace).resolve():
        raise RewindRefused(f"the interrupted rewind ran in {plan.workspace}, not in {workspace}")
    changed = await anyio.to_thread.run_sync(_changed_since_plan, workspace, plan, done)
    if changed and not force:
        raise RewindRefused("changed since the interrupted rewind was planned: " + ", ".join(changed)
                            + " (--force restores them anyway, or --abandon leaves everything as it is)", changed)
    outcome = await _carry_out(session, workspace, blobs, plan, done, force, repo)
    outcome.undo = plan.undo_of is not None
    return outcome


def _changed_since_plan(workspace: Path, plan: RewindPlan, done: set[str]) -> list[str]:
    changed = []
    for item in plan.files:
        if item.path in done:
            continue
        try:
            now = _current_state(workspace, real_path(item), _is_git(item))
        except (OSError, ValueError):
            continue  # cannot be read (a directory now): the rewind leaves it alone and names it, as it would have
        if not (_matches(now, item.restore_sha256, item.restore_mode)
                or _matches(now, item.expected_sha256, item.expected_mode)):
            changed.append(item.path)
    return changed


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
    for item in plan.files:
        if item.path in done:
            outcome.restored.append(item.path)
            continue
        why = await anyio.to_thread.run_sync(_restore_one, workspace, blobs, repo, item, force)
        if why is None:
            outcome.restored.append(item.path)
            session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="done"))
            # durable before the next path is touched (the restored file itself was fsync'd): after a crash or a
            # power cut, what the interrupted rewind shows as restored is what was (SPEC §9: each path is recorded)
            await session.flush()
            await rewind_point("rewind-restored", session)
        else:
            outcome.skipped.append((item.path, why))
            session.append(RewindStep(rewind_id=plan.rewind_id, path=item.path, outcome="skipped", detail=why))
    outcome.skipped += [(n.path, n.reason) for n in plan.not_restored]
    if plan.before_tree is not None and repo is not None:  # what the rewind did is Cairn's, told apart from others'
        with contextlib.suppress(SnapshotUnavailable):
            shot = await anyio.to_thread.run_sync(repo.snapshot)
            session.append(WorkspaceSnapshot(turn=_last_turn(session.events), at="rewind-end", tree=shot.tree,
                                             call_id=plan.rewind_id, left_out=[p for p, _ in shot.left_out],
                                             manifest=shot.manifest, workspace=str(repo.workspace)))
    if plan.conversation:
        session.append(ConversationRewind(to_turn=plan.to_turn, files=outcome.restored, rewind_id=plan.rewind_id,
                                          undo_of=plan.undo_of))
    session.append(RewindEnd(rewind_id=plan.rewind_id, outcome="completed"))
    await session.flush()
    return outcome


# -- one path ---------------------------------------------------------------------------------------------------------

def _is_git(item: RewindFile) -> bool:
    return any(x is not None and x.startswith(GIT) for x in (item.restore_sha256, item.expected_sha256))


def _current_state(workspace: Path, path: str, git: bool) -> State:
    """What `path` holds now, in the plan's id space: (mode, git:<blob>) with snapshots, (None, sha256) without."""
    target = inside(workspace, path)
    if target is None:
        raise OSError(errno.EXDEV, "it is outside the workspace now")
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(target).st_mode) and not os.listdir(target):
            return None  # an empty directory where a file goes: nothing to lose (a rewind removes it to write)
    if git:
        found = state_of(target)
        return (found[0], GIT + found[1]) if found else None
    digest = sha256_of_file(target)
    return (None, digest) if digest is not None else None


def _matches(now: State, content: str | None, mode: str | None) -> bool:
    if content is None:
        return now is None
    return now is not None and now[1] == content and (mode is None or now[0] == mode)


def _restore_one(workspace: Path, blobs: BlobStore | None, repo: ShadowRepo | None, item: RewindFile,
                 force: bool) -> str | None:
    """Restore one planned path; None when done, else why it was left as it is."""
    try:
        now = _current_state(workspace, real_path(item), _is_git(item))
    except (OSError, ValueError) as e:
        return f"it cannot be read ({getattr(e, 'strerror', None) or e})"
    if _matches(now, item.restore_sha256, item.restore_mode):
        return None  # already as it was (restored before a crash, or never changed)
    if not _matches(now, item.expected_sha256, item.expected_mode) and not force:
        return "it changed after the rewind was planned"
    data = None
    if item.restore_sha256 is not None:
        data = _content(item.restore_sha256, blobs, repo)
        if data is None:
            return "its earlier content is not in the store"
    try:
        write_path(workspace, real_path(item), data, item.restore_mode)
    except OSError as e:
        return f"it could not be written ({e.strerror or e})"
    return None


def _content_known(content: str, repo: ShadowRepo | None) -> bool:
    return not content.startswith(GIT) or repo is not None


def _content(content: str, blobs: BlobStore | None, repo: ShadowRepo | None) -> bytes | None:
    if content.startswith(GIT):
        if repo is None:
            return None
        try:
            return repo.blob(content[len(GIT):])
        except SnapshotUnavailable:
            return None
    return blobs.get(content) if blobs is not None else None


def write_path(workspace: Path, path: str, data: bytes | None, mode: str | None) -> None:
    """Put `data` at `path` (None: delete it) atomically, inside the workspace, never following a symbolic link: every
    parent is opened with O_NOFOLLOW from the workspace root (a link where a directory should be is refused), the name
    itself replaced, not followed. Mode `120000` writes a symbolic link whose target is `data`."""
    parts = path.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"{path} is not a plain relative path")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workspace, flags)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if data is None:
                    return  # nothing there to delete
                os.mkdir(part, 0o755, dir_fd=fd)
                os.fsync(fd)  # the new directory's name survives a power cut with what goes into it (SPEC §12)
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(e.errno, f"{part} is a symbolic link or a file now, not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        _replace(fd, parts[-1], data, mode)
    finally:
        os.close(fd)


def _replace(dir_fd: int, name: str, data: bytes | None, mode: str | None) -> None:
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        try:  # an empty directory where the file was (what it held already went back) holds nothing to lose
            if data is None:
                raise OSError(errno.EISDIR, f"{name} is a directory now")
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            raise OSError(errno.EISDIR, f"{name} is a directory now") from None
        old = None
    if data is None:
        if old is not None:
            os.unlink(name, dir_fd=dir_fd)
            os.fsync(dir_fd)
        return
    if mode != SYMLINK:
        bits = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
        if mode == "100755":
            bits |= (bits & 0o444) >> 2
        elif mode == "100644":
            bits &= ~0o111
        atomic_write(dir_fd, name, data, bits)
        return
    tmp = f".{name[:100]}.{secrets.token_hex(6)}.cairn-tmp"
    os.symlink(os.fsdecode(data), tmp, dir_fd=dir_fd)  # a link is restored as a link, never followed
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse to fsync a directory
        os.fsync(dir_fd)


# -- what the operator reads -----------------------------------------------------------------------------------------

def describe(outcome: Outcome) -> list[str]:
    """The lines an operator reads after a rewind."""
    lines = []
    if outcome.restored:
        if outcome.undo:
            lines.append("undid the last rewind: " + ", ".join(outcome.restored))
        else:
            lines.append(f"restored to before turn {outcome.to_turn}: " + ", ".join(outcome.restored))
    for path, why in outcome.skipped:
        lines.append(f"not restored: {path}: {why}")
    if outcome.conversation:
        lines.append("the conversation is back as it was before the last rewind" if outcome.undo
                     else f"the conversation continues from before turn {outcome.to_turn}")
    if outcome.command_turns:
        lines.append("commands ran in turn" + ("s " if len(outcome.command_turns) > 1 else " ")
                     + ", ".join(map(str, outcome.command_turns)) + ": what they changed is not restored")
    if not lines:
        lines.append("nothing to undo" if outcome.undo else f"nothing to restore from turn {outcome.to_turn} on")
    return lines


def plan_lines(plan: Plan, scope: Scope = "both") -> list[str]:
    """A dry run: what the rewind would do, path by path, with reasons for what it leaves alone."""
    head = "undo the last rewind" if plan.undo_of is not None else f"rewind to before turn {plan.to_turn}"
    lines = [f"dry run: {head} (nothing is written)"]
    if scope in ("files", "both"):
        for f in plan.files:
            if f.already or not f.restorable:
                continue
            verb = "delete" if f.restore_sha256 is None else "restore"
            note = " (it did not exist then)" if f.restore_sha256 is None else ""
            conflict = f" — CONFLICT: {f.conflict or 'changed outside Cairn'}; needs --force" if f.changed_outside else ""
            lines.append(f"{verb}: {f.path}{note}{conflict}")
        lines += [f"not restored: {path}: {why}" for path, why in plan.not_restored]
        if plan.command_turns:
            lines.append("commands ran in turn" + ("s " if len(plan.command_turns) > 1 else " ")
                         + ", ".join(map(str, plan.command_turns)) + ": what they changed is not restored")
    if scope in ("conversation", "both"):
        lines.append("conversation: back as it was before the last rewind" if plan.undo_of is not None
                     else f"conversation: continues from before turn {plan.to_turn}")
    if len(lines) == 1:
        lines.append("nothing to change")
    return lines

