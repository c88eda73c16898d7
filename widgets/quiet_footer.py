"""Textual's key footer, rebuilt only when the keys it shows change.

Textual's `Footer` throws its keys away and composes new ones on every bindings signal: a focus change, the terminal
reporting focus, each `refresh_bindings()`, whether or not anything it shows changed. A fresh session's first typed
keys set off four such rebuilds in a row (~8 ms each at 120 columns); the event loop was busy with them while the
frame that echoed the keys waited for the interpreter lock in Textual's writer thread: ~35 ms before the terminal got
it (P8 in docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer


class QuietFooter(Footer):
    _shown: Any = None  # what the last compose showed (None: nothing yet)

    def _showing(self) -> tuple[Any, ...]:
        """What compose would show now: the shown bindings, enabled or not, and the command palette's key."""
        palette = self.app.COMMAND_PALETTE_BINDING
        return tuple((key, binding, enabled, tooltip)
                     for key, (_, binding, enabled, tooltip) in self.screen.active_bindings.items()
                     if binding.show or key == palette)

    def compose(self) -> ComposeResult:
        self._shown = self._showing() if self._bindings_ready else None
        yield from super().compose()

    def bindings_changed(self, screen: Screen[Any]) -> None:
        """Textual's, except that the rebuild it schedules is skipped when the keys are those already shown."""
        self._bindings_ready = True
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        if not self.is_attached:  # (its screen closed meanwhile: as Textual's recompose, nothing to do)
            return
        if self._shown is None or self._showing() != self._shown:
            await self.recompose()
