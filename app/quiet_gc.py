"""Full garbage collections at quiet moments, not in the middle of a stream.

Python's automatic full (generation 2) collection scans every tracked object; in the TUI that is Textual, Rich,
Pygments, the loaded session and the rendered answers, and each full collection stalled the screen 20-55 ms at
random points of a streamed answer, which is what a key typed then waited for (P9 in docs/benchmarks.md). While the
app runs: what is alive once the first frame is drawn is frozen (`gc.freeze`: it lives as long as the app), automatic
full collections are held back, and the chat runs one after each model step and each turn, when the stream has
ended. Young generations are still collected automatically (they take well under a millisecond). Everything is put
back when the app ends, so a test process that runs many apps keeps Python's defaults between them.
"""

from __future__ import annotations

import gc

HELD_BACK = 1_000_000  # generation-1 collections between automatic full collections: in effect never

_saved: tuple[int, int, int] | None = None


def hold_full_collections() -> None:
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(_saved[0], _saved[1], HELD_BACK)


def collect_now() -> None:
    """The full collection held back; called at quiet moments (a step or turn has ended)."""
    if _saved is not None:
        gc.collect()


def release_full_collections() -> None:
    global _saved
    if _saved is not None:
        gc.set_threshold(*_saved)
        gc.unfreeze()
        _saved = None
