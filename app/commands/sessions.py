"""`cairn sessions` and `cairn show`: what is stored, read without writing (SPEC §6).

Both only read sessions, so they never need a provider and import nothing heavy up front: `show` prints a session as
repair would leave it, a live one as it stands on disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..exit_codes import EXIT_OK


def sessions_command(args: argparse.Namespace, config: Any, store: Any) -> int:
    """One line per session (this workspace's, or every one with --all), or one JSON object per line; a live one
    names its writer's host and pid (HOST; `host`, `pid`, `since` in JSON) where the backend knows them (SPEC §13)."""
    import msgspec

    from cairn.widgets.terminal_text import safe_json, safe_text

    from ..render import first_line, format_time, human_size

    summaries = store.list_sessions()
    if not getattr(args, "all", False):  # this workspace's sessions; unreadable ones (cwd unknown) always show
        here = os.path.realpath(config.workspace)
        summaries = [s for s in summaries if s.status == "unreadable" or os.path.realpath(s.cwd or "/") == here]
    if args.json:
        for s in summaries:
            sys.stdout.buffer.write(safe_json(msgspec.json.encode(msgspec.to_builtins(s))) + b"\n")
        sys.stdout.flush()
        return EXIT_OK
    if not summaries:
        where = "" if getattr(args, "all", False) else " for this directory (cairn sessions --all lists every one)"
        print(f"no sessions yet under {safe_text(str(config.home))}{where}", file=sys.stderr)
        return EXIT_OK
    # HOST only where writers have hosts (PostgreSQL, SPEC §13): a JSONL or SQLite home is one machine's, and its table
    # keeps the columns scripts already read
    hosts = getattr(store.backend, "name", "") == "postgres"
    rows: list[tuple[str, ...]] = [("ID", "STATUS", *(("HOST",) if hosts else ()), "EVENTS", "SIZE", "UPDATED", "CWD",
                                    "FIRST PROMPT")]
    for s in summaries:
        what = s.first_prompt if s.status != "unreadable" else f"({s.reason})"
        size = human_size(s.size) if s.size is not None else "?"
        status = f"{s.status} (rewind pending)" if s.rewind_pending else s.status
        row = (s.id, status, *((writer_label(s),) if hosts else ()), str(s.events), size, format_time(s.updated),
               s.cwd, first_line(what, 50))
        rows.append(tuple(safe_text(cell) for cell in row))
    last = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(last)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(last)) + "  " + r[last])
    return EXIT_OK


def writer_label(summary: Any) -> str:
    """`host:pid` of a live session's writer (SPEC §13), `host` when its pid is unknown; `-` when nobody writes it or
    no host is known (a JSONL or SQLite home is one machine's; a lock held by a connection that is not Cairn's)."""
    if summary.status != "live" or not summary.host:
        return "-"
    return f"{summary.host}:{summary.pid}" if summary.pid else summary.host


def show_command(args: argparse.Namespace, store: Any) -> int:
    """The session as repair would leave it, read without writing (a live one too, as it stands on disk)."""
    from cairn.persistence.events import encode_event
    from cairn.widgets.terminal_text import safe_json, safe_text

    from ..render import render_session

    inspection = store.inspect(args.session_id)
    if inspection.live_pid is not None:
        who = f"process {inspection.live_pid}" if inspection.live_pid else "another process"
        print(f"cairn: session {args.session_id} is live in {who}; showing it as it stands on disk", file=sys.stderr)
    if inspection.torn_bytes:
        print(f"cairn: {inspection.torn_bytes} bytes of a torn last line are not shown", file=sys.stderr)
    events = inspection.events + inspection.repair
    from cairn.persistence.store import rewind_pending

    if rewind_pending(events):  # SPEC §10: an interrupted rewind blocks everything else; every face says so
        from ..agent.rewind import pending_rewind, pending_text

        found = pending_rewind(events)
        assert found is not None
        print(safe_text(f"cairn: {pending_text(*found, args.session_id)}"), file=sys.stderr)
    if args.json:
        out = sys.stdout.buffer
        for e in events:
            out.write(safe_json(encode_event(e)) + b"\n")
        out.flush()
        return _then_follow(args, store, inspection)
    print(safe_text(render_session(events, repair_from=len(inspection.events) if inspection.repair else None)),
          flush=True)
    return _then_follow(args, store, inspection)


def _then_follow(args: argparse.Namespace, store: Any, inspection: Any) -> int:
    """`--follow` (SPEC §13): then each new event as it is committed, until the writer ends (commands/follow.py)."""
    if not getattr(args, "follow", False):
        return EXIT_OK
    from .follow import follow_session

    return follow_session(args, store, inspection)
