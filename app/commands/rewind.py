"""`cairn rewind` and `cairn fork` (SPEC §6 and §9 rev 3): take turns back, headless, or branch a session off.

`rewind` opens the session for writing (locked, repaired, evidence gathered) in the session's own workspace, then
takes back what Cairn changed in turns N and later (files, conversation or both) with the same crash-safe plan the TUI
and ACP use (SPEC §10: from the turns' snapshots where git is there, else the file tools' before-images). A path a turn
changed and someone else changed after it is a conflict: named, nothing touched (exit 3) unless `--force`. `--undo`
takes the most recent rewind back; `--dry-run` prints the plan and writes nothing. An interrupted rewind blocks every
other rewind until `--finish` (each path checked against the plan first; exit 3 naming what changed) or `--abandon`.
`fork` copies the history before turn N (default: all of it, repaired) into a new session; the original is untouched.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from cairn.widgets.terminal_text import safe_text

from ..exit_codes import EXIT_LOCKED, EXIT_OK, EXIT_USAGE, fail


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    rw = sub.add_parser("rewind", parents=[common],
                        help="undo turns N and later: what Cairn changed in the workspace (its tools and, with git, "
                             "its commands), the conversation, or both; --undo takes the last rewind back")
    rw.add_argument("session_id", metavar="SESSION_ID")
    rw.add_argument("--turn", type=int, metavar="N", help="the first turn to undo (see `cairn show`)")
    what = rw.add_mutually_exclusive_group()
    what.add_argument("--files", action="store_true", help="restore files only (the conversation stays)")
    what.add_argument("--conversation", action="store_true", help="rewind the conversation only (files stay)")
    rw.add_argument("--force", action="store_true",
                    help="also restore paths someone else changed (conflicts, and changes made between turns)")
    rw.add_argument("--dry-run", action="store_true", help="print the plan (restore / delete / not restored, with "
                                                            "reasons) and write nothing")
    settle = rw.add_mutually_exclusive_group()
    settle.add_argument("--undo", action="store_true",
                        help="put files and conversation back as they were just before the most recent rewind")
    settle.add_argument("--finish", action="store_true", help="finish a rewind a crash interrupted")
    settle.add_argument("--abandon", action="store_true", help="give up a rewind a crash interrupted")

    fk = sub.add_parser("fork", parents=[common], help="a new session with this one's history before turn N")
    fk.add_argument("session_id", metavar="SESSION_ID")
    fk.add_argument("--turn", type=int, metavar="N", help="the first turn left out (default: keep every turn)")
    fk.add_argument("--session-id", dest="new_id", metavar="NEW", help="the new session's id (default: a new one)")


def rewind_command(args: argparse.Namespace, config: Any, store: Any) -> int:
    from ..agent.rewind import RewindRefused

    settling = args.finish or args.abandon or args.undo
    if not settling and args.turn is None:
        return fail("say which turn to undo from: cairn rewind SESSION_ID --turn N (cairn show lists the turns), "
                    "or --undo", EXIT_USAGE)
    if settling and args.turn is not None:
        return fail("--turn goes with a new rewind, not with --undo, --finish or --abandon", EXIT_USAGE)
    if args.dry_run and (args.finish or args.abandon):
        return fail("--dry-run shows a rewind's plan (--turn N, or --undo); --finish and --abandon have none",
                    EXIT_USAGE)
    try:
        return anyio.run(_dry_run if args.dry_run else _rewind, args, config, store)
    except RewindRefused as e:
        return fail(str(e), EXIT_LOCKED if e.changed else EXIT_USAGE)
    except OSError as e:  # the snapshot store or the workspace cannot be written (a read-only mount, a full disk)
        where = f" ({e.filename})" if e.filename else ""
        if args.dry_run:
            return fail(f"cannot plan the rewind of session {args.session_id}: {e.strerror or e}{where}; "
                        "nothing was written", EXIT_USAGE)
        return fail(f"cannot rewind session {args.session_id}: {e.strerror or e}{where}; a rewind that had begun "
                    f"is shown by `cairn show {args.session_id}` and finished with `cairn rewind {args.session_id} "
                    "--finish`", EXIT_USAGE)


def _say(message: str) -> None:
    """Why this rewind works without workspace snapshots (no git, an unusable store): one line on stderr, so the
    operator knows that only what Cairn's file tools changed can be restored."""
    print(safe_text(f"cairn: {message}"), file=sys.stderr)


def _scope(args: argparse.Namespace) -> Any:
    return "files" if args.files else "conversation" if args.conversation else "both"


async def _dry_run(args: argparse.Namespace, config: Any, store: Any) -> int:
    """The plan, read without a lock or a repair written: nothing in the session or the workspace changes."""
    import anyio.to_thread

    from cairn.persistence.blobs import blob_store_for
    from cairn.persistence.store import session_workspace

    from ..agent.rewind import pending_rewind, pending_text, plan_lines, plan_rewind, plan_undo
    from ..compose import workspace_snapshots

    inspection = store.inspect(args.session_id)
    events = inspection.events + inspection.repair
    workspace = session_workspace(inspection.header, events)
    if not workspace.is_dir():
        return fail(f"session {args.session_id}'s workspace {workspace} no longer exists (cairn resume "
                    f"{args.session_id} --workspace DIR moves it)", EXIT_USAGE)
    pending = pending_rewind(events)
    if pending is not None:
        return fail(pending_text(*pending, args.session_id), EXIT_USAGE)
    repo = workspace_snapshots(config, _say, workspace, args.session_id)
    blobs = blob_store_for(store.backend)
    try:
        if args.undo:
            plan = await anyio.to_thread.run_sync(plan_undo, events, workspace, repo)
        else:
            files = _scope(args) in ("files", "both")
            plan = await anyio.to_thread.run_sync(plan_rewind, events, workspace, args.turn, blobs,
                                                  repo if files else None, args.force)
    finally:
        blobs.close()
    for line in plan_lines(plan, "both" if args.undo else _scope(args)):
        print(safe_text(line))
    return EXIT_OK


async def _rewind(args: argparse.Namespace, config: Any, store: Any) -> int:
    from cairn.persistence.blobs import blob_store_for
    from cairn.persistence.session import LiveSession
    from cairn.persistence.store import session_workspace

    from ..agent.rewind import abandon_rewind, describe, finish_rewind, pending_rewind, pending_text, rewind, undo_rewind
    from ..compose import workspace_snapshots

    opened = store.open_for_resume(args.session_id)
    blobs = blob_store_for(store.backend)
    try:
        async with LiveSession(opened) as session:
            workspace = session_workspace(session.header, session.events)
            if not workspace.is_dir():
                return fail(f"session {session.id}'s workspace {workspace} no longer exists: nothing was rewound "
                            f"(cairn resume {session.id} --workspace DIR moves it)", EXIT_USAGE)
            repo = workspace_snapshots(config, _say, workspace, session.id, holds_secret=session.holds_secret)
            pending = pending_rewind(session.events)
            if args.abandon:
                plan = await abandon_rewind(session)
                print(f"abandoned the interrupted rewind to before turn {plan.to_turn}: files and conversation stay "
                      "as they are now")
                return EXIT_OK
            if args.finish:
                outcome = await finish_rewind(session, workspace, blobs, force=args.force, repo=repo)
            elif pending is not None:
                return fail(pending_text(*pending, session.id), EXIT_USAGE)
            elif args.undo:
                outcome = await undo_rewind(session, workspace, blobs, force=args.force, repo=repo)
            else:
                outcome = await rewind(session, workspace, blobs, args.turn, _scope(args), force=args.force,
                                       repo=repo)
    finally:
        blobs.close()
    for line in describe(outcome):
        print(safe_text(line))
    return EXIT_OK


def fork_command(args: argparse.Namespace, store: Any) -> int:
    from cairn.persistence.events import TurnStart, encode_event
    from cairn.persistence.store import session_workspace

    inspection = store.inspect(args.session_id)
    events = inspection.events + inspection.repair
    if args.turn is not None:
        cut = next((e.seq for e in events if isinstance(e, TurnStart) and e.turn == args.turn), None)
        if cut is None:
            return fail(f"there is no turn {args.turn} in session {args.session_id}", EXIT_USAGE)
        events = events[:cut]
    # the fork works where its history did: snapshots taken before a move never apply to another place, and the
    # copied history keeps its workspace/moved events, so the fork's own header names the same directory
    opened = store.create(str(session_workspace(inspection.header, events)), session_id=args.new_id)
    try:
        if events:
            opened.writer.append([(e.seq, encode_event(e)) for e in events], durable=True)
    finally:
        opened.writer.close()
        opened.lock.release()
    kept = f"turns before {args.turn}" if args.turn is not None else "all of its history"
    print(safe_text(f"forked {args.session_id} into {opened.header.id} ({kept}, {len(events)} events)"))
    return EXIT_OK
