"""Bounded waits on state, shared by the tests: poll a condition until it holds, fail with what was awaited (never
hang) once a generous deadline passes; and a stopped clock for the app's own time-judged rules. GUIDE §4 and §7: a
test waits on the state it needs, never on the clock, and asserts no time; a deadline is a timeout, not a measurement.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import anyio
import pytest

POLL = 0.005  # seconds between two looks at the condition


def _give_up_after(deadline: float, what: str, timeout: float) -> None:
    """Fail, saying what was awaited, once the deadline has passed (a wait never hangs)."""
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_sync(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """`condition()`'s first truthy value, polled from a blocking test (a child process, a file, a terminal)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _give_up_after(deadline, what, timeout)
        time.sleep(POLL)
    return value


async def wait_until(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """`condition()`'s first truthy value, polled while the event loop runs everything else."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _give_up_after(deadline, what, timeout)
        await anyio.sleep(POLL)
    return value


async def wait_for(pilot: Any, condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Let a Textual app under `pilot` run until `condition()` is truthy.

    Sleeps with the event loop rather than `pilot.pause()`: the pilot's pauses wait until every widget of the screen has
    drained its message queue, and the persistence-service widget does not while a test holds its fdatasync."""
    return await wait_until(condition, what, timeout)


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by its parent) counts as dead: it runs no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_dead(pid: int, within: float = 10.0) -> bool:
    """Whether `pid` stopped running within `within` seconds (for `assert wait_dead(pid)`)."""
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


class StoppedClock:
    """A module's `time` as a test holds it: `monotonic()` stands still until the test moves it on; the rest (and
    every other module, asyncio's loop included) keeps the real clock. For rules the app judges by the clock (two Esc
    within ESC_ESC, a key within TYPING_GAP of another): a test says how far apart two keys are instead of sleeping.
    """

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def stop_clock(monkeypatch: pytest.MonkeyPatch, user: Any) -> StoppedClock:
    """Stop the clock of the module that defines `user` (a class or function that reads `time.monotonic()`): found
    by where `user` lives, so the test follows it if it moves."""
    clock = StoppedClock()
    monkeypatch.setattr(sys.modules[user.__module__], "time", clock)
    return clock
