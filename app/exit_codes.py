"""Exit codes, the error → code mapping and the one-line failure message shared by the CLI's commands.

Its own module so `cli` (which dispatches), `headless` (which runs `cairn run`) and the small commands (`rm`, `export`,
`config`) all import it and none of them imports another: circles between them made every import order matter.
"""

from __future__ import annotations

import sys

EXIT_OK, EXIT_TURN_ERROR, EXIT_USAGE, EXIT_LOCKED, EXIT_CORRUPT, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130


def fail(message: str, code: int) -> int:
    """One line on stderr. The message may quote a server, a file or a session id: it is made terminal-safe and kept
    on one line."""
    from cairn.widgets.terminal_text import safe_text

    print("cairn: " + " ".join(safe_text(message).split()), file=sys.stderr)
    return code


def exit_code_for(error: BaseException) -> int | None:
    """Map a user-facing error to its exit code; None for a bug (which should surface)."""
    from cairn.persistence import errors as pe

    from .config.checks import ConfigError

    fenced = isinstance(getattr(error, "cause", None), pe.StaleWriter)  # a checkpoint failed: another writer took over
    if isinstance(error, (pe.SessionLocked, pe.StaleWriter)) or fenced:
        return EXIT_LOCKED
    if isinstance(error, (pe.CorruptLog, pe.UnsupportedFormat)):
        return EXIT_CORRUPT
    if isinstance(error, (ConfigError, pe.InvalidSessionId, pe.SessionNotFound, pe.SessionExists, pe.StoreUnavailable)):
        return EXIT_USAGE
    if isinstance(error, pe.PersistenceError):
        return EXIT_TURN_ERROR
    return None
