"""A rewind's plan (SPEC §9 rev 3, §10 rev 4): what taking back turns N and later would do, path by path.

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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cairn.persistence.blobs import BlobStore
from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    OperatorCommand,
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

from .rewind_paths import GIT, State
from .snapshots import GITLINK, NESTED, LeftOut, ShadowRepo, Snapshot, SnapshotUnavailable

Scope = Literal["files", "conversation", "both"]
# `force`: True overwrites every path someone else changed too; a set of paths (the TUI, asked path by path) overwrites
# those and leaves every other such path alone, named, without refusing the rewind
Force = bool | frozenset[str]
COMMAND_TOOLS = ("run_command",)


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
        elif isinstance(e, OperatorCommand) and e.turn not in found:  # the operator's `!command` turn
            found[e.turn] = f"!{e.command}"
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
        left: set[str | None] = {e.before_sha256, e.after_sha256} if unknown else {e.after_sha256}
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
