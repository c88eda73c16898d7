"""Rewind (SPEC §9 rev 3, §10 rev 4): take back what Cairn did in turns N and later — files, conversation, or both.

**Crash safety and undo.** The plan (`rewind/plan`) — with the state of every path it will change, kept in the shadow
repository (a `rewind-start` snapshot) or as before-images — is durable before the first file is touched; each path
restored is recorded durably (`rewind/file`, a barrier before the next path is touched); `conversation/rewind` and
`rewind/end` close it. A plan without an end is an
interrupted rewind: everything else waits until it is finished (each path checked against the plan's expected state
first; a path outside the plan is never touched) or abandoned. `undo_rewind` is a rewind whose plan is the inverse of
the most recent one's: what it changed goes back to what the plan recorded it held.

The pieces: `rewind_plan` (what a rewind would do, from snapshots or from the file tools' fingerprints) and
`rewind_paths` (one path on disk: its state, its content, writing it back).
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cairn.persistence.blobs import BlobStore
from cairn.persistence.events import (
    AnyEvent,
    ConversationRewind,
    NotRestored,
    RewindEnd,
    RewindFile,
    RewindPlan,
    RewindStep,
    WorkspaceSnapshot,
)
from cairn.persistence.evidence import inside
from cairn.persistence.session import LiveSession

from .rewind_paths import (
    GIT,
    _content,
    _content_known,
    _current_state,
    _is_git,
    _matches,
    _raw,
    _read_nofollow,
    real_path,
    write_path,
)
from .rewind_plan import Force, FilePlan, Plan, RewindRefused, Scope, plan_rewind, turns_of
from .snapshots import ShadowRepo, Snapshot, SnapshotUnavailable

MAX_KEPT = 10 * 1024 * 1024  # a path whose current content is larger cannot be kept as a before-image: not touched


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


# stays beside `_carry_out`: it calls `write_path` through this module's name (tests/test_durability_moments.py
# and tests/test_workspace_rewind.py watch the effect by patching `rewind.write_path`)
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
