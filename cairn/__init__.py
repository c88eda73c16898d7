"""Cairn: a terminal agent whose sessions survive a hard crash at any instant.

The repository keeps its three packages at its top (`app/`, `widgets/`, `persistence/`); installed, they are
`cairn.app`, `cairn.widgets` and `cairn.persistence`, so `cairn` is the only top-level name Cairn owns.
`open_session` is imported on first use: headless commands and `cairn.persistence` must not pay for the agent loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

__all__ = ["__version__", "open_session"]

if TYPE_CHECKING:
    from .app.api import open_session


def __getattr__(name: str) -> Any:
    if name == "open_session":
        from .app.api import open_session

        return open_session
    raise AttributeError(f"module 'cairn' has no attribute {name!r}")
