"""The `cairn` command line (SPEC §6).

Headless commands (`run`, `sessions`, `show`) import neither Textual nor the ACP package, so they start fast; those are
imported only by the TUI and `cairn acp`. Every failure a user can cause is one line on stderr and an exit code:
0 done, 1 turn ended in error, 2 usage/configuration (including an unknown session id), 3 session locked, 4 log corrupt
or format unsupported, 130 cancelled.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, Sequence

from cairn.version import __version__

from .exit_codes import EXIT_CANCELLED, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, exit_code_for, fail

DESCRIPTION = """\
Cairn: a terminal agent whose sessions survive a hard crash at any instant.

Run with no command for the full-screen TUI on a new session in the current directory."""

EPILOG = """\
environment:
  CAIRN_HOME        where sessions live (default: the user data dir for cairn)
  CAIRN_BACKEND     jsonl (default), sqlite or postgres
  CAIRN_DATABASE_URL  the PostgreSQL database of --backend postgres (a libpq URL; never printed)
  CAIRN_PROVIDER    demo, script, openai or anthropic (default: openai when a key is set, else demo; a resumed session keeps
                    its own provider and model unless one is chosen)
  CAIRN_MODEL, CAIRN_SCRIPT, CAIRN_BASE_URL, CAIRN_API_KEY (or OPENAI_API_KEY / ANTHROPIC_API_KEY)
  CAIRN_CONFIG, CAIRN_PROFILE  the config file and its profile (see `cairn config`)
  CAIRN_MAX_TOKENS  output token limit per answer (default 8192)
  CAIRN_TIMEOUT     seconds to wait for the model's next bytes (default 120; 0 = no limit)
  CAIRN_MAX_RETRIES retries of a failed request before any of the answer arrived (default 4)
  CAIRN_TEMPERATURE, CAIRN_TOP_P, CAIRN_REASONING_EFFORT  sent to the openai provider only when set

exit codes: 0 ok, 1 turn ended in error, 2 usage or configuration, 3 session locked, 4 log corrupt or unsupported,
130 cancelled"""


class OneLineParser(argparse.ArgumentParser):
    """Argument errors are one line, like every other error (SPEC §6 rev 3), with where to read more: not the usage
    block. Sub-command parsers are of this class too (argparse makes them of their parent's class)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("cairn").strip()
        self.exit(fail(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)", EXIT_USAGE))


def common_options(default: Any = None) -> OneLineParser:
    p = OneLineParser(add_help=False, argument_default=default)
    g = p.add_argument_group("common options")
    g.add_argument("--home", metavar="DIR", help="session storage directory (= CAIRN_HOME)")
    g.add_argument("--backend", choices=["jsonl", "sqlite", "postgres"],
                   help="storage backend (= CAIRN_BACKEND; default jsonl)")
    g.add_argument("--database-url", metavar="URL",
                   help="PostgreSQL database for --backend postgres (= CAIRN_DATABASE_URL; a libpq URL)")
    g.add_argument("--provider", choices=["demo", "script", "openai", "anthropic"],
                   help="model provider (= CAIRN_PROVIDER)")
    g.add_argument("--model", metavar="NAME", help="model name (= CAIRN_MODEL)")
    g.add_argument("--script", metavar="FILE", help="JSON script for the script provider (= CAIRN_SCRIPT)")
    g.add_argument("--workspace", metavar="DIR", help="directory the tools work in (default: the current directory; "
                   "a resumed session's own); on a resume, moves the session there")
    g.add_argument("--base-url", metavar="URL", help="OpenAI-compatible server (= CAIRN_BASE_URL)")
    g.add_argument("--max-tokens", metavar="N", help="output token limit per answer (= CAIRN_MAX_TOKENS; default 8192)")
    g.add_argument("--profile", metavar="NAME", help="profile of the config file to use (= CAIRN_PROFILE)")
    g.add_argument("--config", metavar="FILE", help="config file (= CAIRN_CONFIG; default: the user config dir's "
                   "cairn/config.toml)")
    return p


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(
        prog="cairn", description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt, parents=[common_options()]
    )
    parser.add_argument("--version", action="version", version=f"cairn {__version__}")
    # A subcommand's copy of the common options must not reset, with its own defaults, what was given before the
    # command (`cairn --home DIR run …`): absent there, they leave the namespace alone.
    common = common_options(argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("resume", parents=[common], help="open a session in the TUI (repairing it first)")
    r.add_argument("session_id", nargs="?", metavar="SESSION_ID", help="default: the most recent one in this directory")

    run = sub.add_parser(
        "run", parents=[common], formatter_class=fmt, help="run one headless turn and stream the answer",
        description="Run one turn without the TUI. The answer streams to stdout; tool activity goes to stderr.",
    )
    group = run.add_mutually_exclusive_group()
    group.add_argument("--session-id", metavar="ID", help="create a new session with this id (error if it exists)")
    group.add_argument("--resume", metavar="ID", help="continue an existing session (repairing it first)")
    run.add_argument("--yes", action="store_true", help="approve every tool call (otherwise side effects are denied)")
    run.add_argument("--json", action="store_true", help="print every event as one JSON line instead of text")
    run.add_argument("prompt", nargs="+", metavar="PROMPT", help="the prompt (several words are joined; - reads stdin)")

    s = sub.add_parser("sessions", parents=[common], help="list this workspace's sessions (--all: every one)")
    s.add_argument("--json", action="store_true", help="one JSON object per session per line")
    s.add_argument("--all", action="store_true", help="sessions of every directory, not only this workspace's")

    rm = sub.add_parser("rm", parents=[common], help="delete finished sessions (a live one is refused, exit 3)")
    rm.add_argument("session_ids", nargs="+", metavar="SESSION_ID")

    ex = sub.add_parser("export", parents=[common], help="a session as a readable transcript or as JSON lines")
    ex.add_argument("session_id", metavar="SESSION_ID")
    ex.add_argument("--format", choices=["md", "json"], default="md",
                    help="md: Markdown transcript, recovered calls and verdicts marked (default); json: the events")

    show = sub.add_parser("show", parents=[common], help="print a session as repair would leave it, without writing")
    show.add_argument("session_id", metavar="SESSION_ID")
    show.add_argument("--json", action="store_true", help="one event per line, as stored")
    show.add_argument("--follow", action="store_true", help="then each new event as committed, until the writer ends")

    ins = sub.add_parser("inspect", parents=[common], help="read-only event history of a session (TUI); never locks or writes")
    ins.add_argument("session_id", metavar="SESSION_ID")
    ins.add_argument("--follow", action="store_true", help="keep showing the events another process is writing")

    at = sub.add_parser("attach", parents=[common], help="the chat view of a session another process is writing, live "
                        "and read-only (TUI)")
    at.add_argument("session_id", metavar="SESSION_ID")

    from .commands.rewind import add_parsers as add_rewind_parsers

    add_rewind_parsers(sub, common)

    sub.add_parser("acp", parents=[common], help="run as an Agent Client Protocol agent over stdio")

    c = sub.add_parser("config", parents=[common], help="show the effective configuration and where each value came from")
    c.add_argument("--json", action="store_true", help="one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return dispatch(args)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:
        code = exit_code_for(e)
        if code is None:
            raise
        return fail(str(e), code)


def open_store(config: Any):  # -> SessionStore; without importing the agent (fast start-up)
    from cairn.persistence.store import SessionStore

    return SessionStore(config.home, config.backend, getattr(config, "database_url", None))


def config_from(args: argparse.Namespace, runs_model: bool = True):  # -> Config
    """`runs_model=False` for commands that only read sessions: they never need (or check) a provider."""
    from .config.resolver import resolve_config

    return resolve_config(
        home=args.home, backend=args.backend, provider=args.provider, model=args.model, script=args.script,
        workspace=args.workspace, base_url=args.base_url, max_tokens=args.max_tokens,
        database_url=args.database_url, profile=args.profile, config_file=args.config, runs_model=runs_model,
    )


def dispatch(args: argparse.Namespace) -> int:
    command = args.command
    if command == "run":
        from .headless import run_command

        return run_command(args, config_from(args))
    if command == "sessions":
        from .commands.sessions import sessions_command

        config = config_from(args, runs_model=False)
        return sessions_command(args, config, open_store(config))
    if command == "show":
        from .commands.sessions import show_command

        return show_command(args, open_store(config_from(args, runs_model=False)))
    if command in ("rm", "export"):
        from .commands.housekeeping import export_command, rm_command

        store = open_store(config_from(args, runs_model=False))
        return export_command(args, store) if command == "export" else rm_command(args, store)
    if command in ("rewind", "fork"):
        from .commands.rewind import fork_command, rewind_command

        config = config_from(args, runs_model=False)
        store = open_store(config)
        return rewind_command(args, config, store) if command == "rewind" else fork_command(args, store)
    if command == "inspect":
        from .screens.inspector import inspect_command  # Textual: imported for this command only

        return inspect_command(args, config_from(args, runs_model=False))
    if command == "attach":
        from .screens.attach import attach_command  # Textual: imported for this command only

        resume = argparse.Namespace(**{**vars(args), "command": "resume"})  # its `r`: as `cairn resume SESSION_ID`
        return attach_command(args, config_from(args, runs_model=False), lambda: tui_command(resume, config_from(resume)))
    if command == "config":
        from .commands.config import config_command

        return config_command(args, config_from(args))
    if command == "acp":
        from importlib.util import find_spec

        from .acp.early import start_acp  # the standard library only: `initialize` is answered before the rest loads

        if find_spec("acp") is None or find_spec("pydantic") is None:
            return fail("the ACP agent needs the agent-client-protocol package: reinstall Cairn (pip install -e .)", EXIT_USAGE)
        return start_acp(lambda: config_from(args))
    return tui_command(args, config_from(args))


def tui_command(args: argparse.Namespace, config: Any) -> int:
    """`cairn` (new session here) and `cairn resume [ID]` (default: the most recent session in this directory; the
    sessions screen when there is none). The session is opened, and repaired, before the app starts."""
    from . import quiet_gc

    quiet_gc.pause_until_first_frame()  # nothing start-up allocates is garbage: collect from the first frame on (P8)
    try:
        return run_tui(args, config)
    finally:
        quiet_gc.resume_collections()


def run_tui(args: argparse.Namespace, config: Any) -> int:
    store = open_store(config)
    notice = None
    if args.command == "resume":
        session_id = args.session_id or store.latest_in(str(config.workspace))
        opened = store.open_for_resume(session_id) if session_id else None
        session_config, unavailable, provider = tui_open_for(config, opened)
    else:
        provider = build_provider(config)  # configuration errors end here, before a session is created
        opened = store.create(cwd=str(config.workspace), deferred=True)  # on disk with its first prompt
        session_config, unavailable = config, None
    from cairn.persistence.errors import PersistenceError

    from .config.checks import ConfigError
    from .tui import CairnApp

    while True:
        # the provider built by the check above is the app's (built once; no event loop just to close it: P8)
        app = CairnApp(session_config, opened, store, unavailable=unavailable, notice=notice, provider=provider)
        provider = None
        try:
            choice = app.run()
        finally:
            app.close_if_still_open()
        fenced = app.chat.service.fenced if app.chat is not None else None
        if choice is None:  # a session another writer took over ends in one line and exit 3, as `cairn run` does
            return fail(fenced, EXIT_LOCKED) if fenced else EXIT_OK
        notice = None
        if choice.action == "open" and choice.session_id:
            try:  # the sessions screen never quits the app: a session that cannot be opened is said so there
                opened, session_config, unavailable, provider = tui_open_chosen(store, config, choice.session_id)
            except (PersistenceError, ConfigError) as e:
                opened, session_config, unavailable = None, config, None
                notice = f"Cannot open session {choice.session_id}: {e}"
                continue
        else:
            provider = build_provider(config)
            opened = store.create(cwd=str(config.workspace), deferred=True)
            session_config, unavailable = config, None


def tui_open_chosen(store: Any, config: Any, session_id: str) -> tuple[Any, Any, str | None, Any]:
    """The session chosen on the sessions screen, opened (repaired) in its own workspace, with what `tui_open_for`
    gives. A --workspace given at launch was meant for the new session then, so it never moves the one chosen now.
    Raises PersistenceError or ConfigError (a workspace that no longer exists), for that screen to say."""
    opened = store.open_for_resume(session_id)
    return (opened, *tui_open_for(config, opened, may_move=False))


def tui_config_for(config: Any, opened: Any) -> tuple[Any, str | None]:
    """The config a session opens with in the TUI, and why its provider cannot be built (None: it can)."""
    session_config, unavailable, provider = tui_open_for(config, opened)
    if provider is not None:
        import anyio

        anyio.run(provider.aclose)
    return session_config, unavailable


def tui_open_for(config: Any, opened: Any, may_move: bool = True) -> tuple[Any, str | None, Any]:
    """The config a session opens with in the TUI, why its provider cannot be built (None: it can), and that provider
    (None when it cannot be built). Unlike `cairn run`, the TUI opens the session anyway: the resume screen and
    verdicts need no model, and the app says what continuing needs when a prompt is sent. Not so without a workspace:
    the session runs in its own (SPEC §10), and one that no longer exists (none named, or `may_move` off) raises
    ConfigError with the session closed again; an explicit --workspace moves it there, durably, first."""
    if opened is None:
        return config, None, None
    from cairn.persistence.store import move_workspace

    from .config.checks import ConfigError
    from .config.resumed import config_for_session, resumed_workspace

    try:
        config = resumed_workspace(config, opened.header, opened.events, may_move=may_move)
        move_workspace(opened, config.workspace)
    except BaseException:
        try:  # (not compose.close_unused: the agent stack is imported after the first frame, P8)
            opened.writer.close()
        finally:
            opened.lock.release()
        raise
    try:
        session_config = config_for_session(config, opened.events)
    except ConfigError as e:
        return config, str(e), None
    try:
        provider = build_provider(session_config)
    except ConfigError as e:
        return session_config, str(e), None
    return session_config, None, provider


def build_provider(config: Any) -> Any:
    """The configured provider (configuration errors raise ConfigError: exit 2)."""
    from .config.provider import make_provider

    return make_provider(config)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
