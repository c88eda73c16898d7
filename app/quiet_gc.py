"""Full garbage collections at quiet moments, not in the middle of a stream.

Python's automatic full (generation 2) collection scans every tracked object; in the TUI that is Textual, Rich,
Pygments, the loaded session and the rendered answers, and each full collection stalled the screen 20-55 ms at
random points of a streamed answer, which is what a key typed then waited for (P9 in docs/benchmarks.md). While the
app runs: what is alive once the first frame is drawn is frozen (`gc.freeze`: it lives as long as the app), automatic
full collections are held back, and the chat runs one after each model step and each turn, when the stream has
ended. Young generations are still collected automatically (they take well under a millisecond). Everything is put
back when the app ends, so a test process that runs many apps keeps Python's defaults between them.

Before that first frame the CLI collects nothing at all (`pause_until_first_frame`): start-up allocates what lives on
(Textual's and Cairn's modules, the loaded session, the first screen's widgets), so the automatic collections then
freed next to nothing and cost ~60 ms of a ~0.5 s open, a 33 ms full one right before the first frame (P8 in
docs/benchmarks.md). The first frame freezes all of it and turns collection back on.
"""

from __future__ import annotations

import gc

HELD_BACK = 1_000_000  # generation-1 collections between automatic full collections: in effect never

_saved: tuple[int, int, int] | None = None
_paused = False


def pause_until_first_frame() -> None:
    """No collection until `hold_full_collections` (the first frame) or `resume_collections` (the app never got
    that far): the TUI's start-up, called by the CLI before Textual is imported."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collections() -> None:
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def hold_full_collections() -> None:
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(_saved[0], _saved[1], HELD_BACK)
    resume_collections()  # (after the freeze: what start-up built is never scanned)


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
