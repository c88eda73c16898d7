"""`cairn rewind` and `cairn fork` (SPEC §6 and §9 rev 3): take turns back, headless, or branch a session off.

`rewind` opens the session for writing (locked, repaired, evidence gathered), then restores files, conversation or both
to before `--turn N` with the same crash-safe plan the TUI and ACP use (the whole workspace from the turn's git snapshot
where there is one, else the file tools' before-images); a file changed outside Cairn is named and
nothing is touched (exit 3) unless `--force`. An interrupted rewind is reported and `--finish` or `--abandon` settles it.
`fork` copies the history before turn N (default: all of it, repaired) into a new session; the original is untouched.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio

from cairn.widgets.terminal_text import safe_text

from ..exit_codes import EXIT_LOCKED, EXIT_OK, EXIT_USAGE, fail


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    rw = sub.add_parser("rewind", parents=[common],
                        help="undo turns N and later: the workspace (what Cairn's tools, and with git its commands, "
                             "changed), the conversation, or both")
    rw.add_argument("session_id", metavar="SESSION_ID")
    rw.add_argument("--turn", type=int, metavar="N", help="the first turn to undo (see `cairn show`)")
    what = rw.add_mutually_exclusive_group()
    what.add_argument("--files", action="store_true", help="restore files only (the conversation stays)")
    what.add_argument("--conversation", action="store_true", help="rewind the conversation only (files stay)")
    rw.add_argument("--force", action="store_true", help="overwrite files changed outside Cairn since it wrote them")
    settle = rw.add_mutually_exclusive_group()
    settle.add_argument("--finish", action="store_true", help="finish a rewind a crash interrupted")
    settle.add_argument("--abandon", action="store_true", help="give up a rewind a crash interrupted")

    fk = sub.add_parser("fork", parents=[common], help="a new session with this one's history before turn N")
    fk.add_argument("session_id", metavar="SESSION_ID")
    fk.add_argument("--turn", type=int, metavar="N", help="the first turn left out (default: keep every turn)")
    fk.add_argument("--session-id", dest="new_id", metavar="NEW", help="the new session's id (default: a new one)")


def rewind_command(args: argparse.Namespace, config: Any, store: Any) -> int:
    from ..agent.rewind import RewindRefused

    if not (args.finish or args.abandon) and args.turn is None:
        return fail("say which turn to undo from: cairn rewind SESSION_ID --turn N (cairn show lists the turns)",
                    EXIT_USAGE)
    try:
        return anyio.run(_rewind, args, config, store)
    except RewindRefused as e:
        return fail(str(e), EXIT_LOCKED if e.changed else EXIT_USAGE)


async def _rewind(args: argparse.Namespace, config: Any, store: Any) -> int:
    from cairn.persistence.blobs import blob_store_for
    from cairn.persistence.session import LiveSession

    from ..agent.rewind import abandon_rewind, describe, finish_rewind, pending_rewind, rewind
    from ..compose import workspace_snapshots

    opened = store.open_for_resume(args.session_id)
    blobs = blob_store_for(store.backend)
    try:
        async with LiveSession(opened) as session:
            workspace = Path(session.header.cwd)
            repo = workspace_snapshots(config, None, workspace, session.id)
            pending = pending_rewind(session.events)
            if args.abandon:
                plan = await abandon_rewind(session)
                print(f"abandoned the interrupted rewind to before turn {plan.to_turn}")
                return EXIT_OK
            if args.finish:
                outcome = await finish_rewind(session, workspace, blobs, force=args.force, repo=repo)
            elif pending is not None:
                plan, done = pending
                left = [f.path for f in plan.files if f.path not in done]
                return fail(
                    f"a rewind to before turn {plan.to_turn} was interrupted (restored: {', '.join(sorted(done)) or 'none'}; "
                    f"not yet: {', '.join(left) or 'none'}): run cairn rewind {session.id} --finish or --abandon",
                    EXIT_USAGE,
                )
            else:
                scope = "files" if args.files else "conversation" if args.conversation else "both"
                outcome = await rewind(session, workspace, blobs, args.turn, scope, force=args.force, repo=repo)
    finally:
        blobs.close()
    for line in describe(outcome):
        print(safe_text(line))
    return EXIT_OK


def fork_command(args: argparse.Namespace, store: Any) -> int:
    from cairn.persistence.events import TurnStart, encode_event

    inspection = store.inspect(args.session_id)
    events = inspection.events + inspection.repair
    if args.turn is not None:
        cut = next((e.seq for e in events if isinstance(e, TurnStart) and e.turn == args.turn), None)
        if cut is None:
            return fail(f"there is no turn {args.turn} in session {args.session_id}", EXIT_USAGE)
        events = events[:cut]
    opened = store.create(inspection.header.cwd, session_id=args.new_id)
    try:
        if events:
            opened.writer.append([(e.seq, encode_event(e)) for e in events], durable=True)
    finally:
        opened.writer.close()
        opened.lock.release()
    kept = f"turns before {args.turn}" if args.turn is not None else "all of its history"
    print(safe_text(f"forked {args.session_id} into {opened.header.id} ({kept}, {len(events)} events)"))
    return EXIT_OK
