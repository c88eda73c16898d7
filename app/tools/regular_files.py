"""Reading only regular files, from a worker thread: what every file tool shares.

A FIFO, socket or device is refused at once from its lstat, and what is opened is opened `O_NONBLOCK | O_NOFOLLOW`
and fstat'd before a byte is read, so no tool ever waits on a pipe (a thread stuck on one could not be cancelled and
would keep the process from exiting). The tool bodies are plain blocking code run through `in_thread`, which turns
OS errors into a ToolFailure the model can read.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Callable

import anyio.to_thread

from .base import ToolFailure
from .workspace import Located, printable

BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a file as binary (the heuristic git and grep use)
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


async def in_thread(func: Callable[..., str], *args: Any, abandon_on_cancel: bool = False) -> str:
    """Run a blocking body in a worker thread, turning OS errors into a ToolFailure the model can read.

    Writers keep the default (cancellation waits for the thread), so a cancelled write has either happened or not by the
    time the loop records the outcome. Readers may be abandoned: nothing depends on them finishing.
    """
    try:
        return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=abandon_on_cancel)
    except OSError as exc:
        where = f" ({printable(os.fsdecode(exc.filename))})" if isinstance(exc.filename, (str, bytes)) else ""
        raise ToolFailure(f"{exc.strerror or exc}{where}") from exc


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def refuse_irregular(shown: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise ToolFailure(f"{shown} is {kind_of(mode)}; only regular files are read or written")


def open_regular(found: Located) -> tuple[int, os.stat_result]:
    """Open the located regular file for reading: refused from its lstat before opening if it is anything else, and
    checked again on the open descriptor (it may have been swapped in between). Returns (fd, fstat)."""
    assert found.name is not None and found.st is not None
    refuse_irregular(found.shown, found.st.st_mode)
    try:
        fd = os.open(found.name, FILE_FLAGS, dir_fd=found.dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolFailure(f"{found.shown} was replaced by a symbolic link while it was opened; try again") from None
        raise
    try:
        st = os.fstat(fd)
        refuse_irregular(found.shown, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular_file(found: Located) -> bytes:
    fd, _ = open_regular(found)
    with os.fdopen(fd, "rb") as f:
        return f.read()
