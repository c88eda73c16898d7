"""Exit codes and the one-line failure message shared by the CLI's commands.

Its own module so `cli` (which dispatches) and `headless` (which runs `cairn run`) both import it and neither imports
the other: the circle between them made every import order matter.
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
