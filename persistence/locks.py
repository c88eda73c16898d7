"""Cross-process lock for a live session: `fcntl.flock` on `$CAIRN_HOME/locks/<id>.lock`.

flock is released by the kernel when the holder dies (SIGKILL included), so a crashed session is never left locked.
The holder's pid is written into the file so a second opener can say who holds it. Readers never take the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .errors import SessionLocked, StoreUnavailable


class SessionLock:
    def __init__(self, lock_dir: Path, session_id: str) -> None:
        self.path = lock_dir / f"{session_id}.lock"
        self.session_id = session_id
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:  # at start, as one line, not a traceback (e.g. a read-only locks directory)
            raise StoreUnavailable(
                f"cannot create the lock file {self.path} ({e.strerror}): its directory must be writable; "
                "fix its permissions or use --home"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise SessionLocked(self.session_id, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def lock_holder(lock_dir: Path, session_id: str) -> int | None:
    """None when nobody holds the session; otherwise the holder's pid (0 if it could not be read). Never blocks."""
    path = lock_dir / f"{session_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(fd) or 0
    finally:
        os.close(fd)
    return None
