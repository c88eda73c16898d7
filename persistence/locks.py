"""Cross-process lock for a live session: `fcntl.flock` on `$CAIRN_HOME/locks/<id>.lock`.

flock is released by the kernel when the holder dies (SIGKILL included), so a crashed session is never left locked.
The holder's pid is written into the file so a second opener can say who holds it. Readers never take the lock.

The directory cannot be trusted (SPEC §5), so:
- neither `locks/` nor the lock file may be a symlink: the lock file is opened with O_NOFOLLOW (after checking with
  lstat that `locks/` is a real directory), so a planted symlink makes the open fail instead of making Cairn create or
  truncate its target;
- after the flock is taken, the path must still name the locked inode (a file deleted or replaced between our open and
  our flock would otherwise give two holders of "the" lock); if it does not, we start again;
- a lock file deleted while its session is live lets a newcomer lock a fresh inode: that is why the JSONL backend also
  flocks the session file itself (`flock_session_file`), which no one can delete from under the live writer's descriptor,
  and the SQLite backend holds one byte of its database file per live session (`ByteHold`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import struct
import threading
import time
from pathlib import Path

from .errors import SessionLocked, StoreUnavailable

_ATTEMPTS = 20  # replaced-under-us retries; each one means another process deleted or replaced the file right then


def ensure_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) and make every directory created here 0700 whatever the umask.

    An existing directory is left as it is: the user may have pointed `--home` at a directory of their own. Each
    directory made here has its name fsync'd into its parent (SPEC §12: a new name survives a power cut only once its
    directory is synced), so a fresh CAIRN_HOME is not lost whole with the first session written into it."""
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask; chmod is not
        fsync_dir(d.parent)


def fsync_dir(path: Path) -> None:
    """Make the names in directory `path` durable (a new file's, a rename's, an unlink's). A file system that cannot
    fsync a directory (some network ones say EINVAL) is left to its own guarantees."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


class SessionLock:
    """`ops` (optional) is the backend's FileOps: creating the lock file goes through the same fault seam."""

    def __init__(self, lock_dir: Path, session_id: str, ops=None) -> None:
        self.path = lock_dir / f"{session_id}.lock"
        self.session_id = session_id
        self._ops = ops
        self._fd: int | None = None

    def acquire(self) -> None:
        for _ in range(_ATTEMPTS):
            fd = self._open()
            try:
                _flock_or_report(fd, self.session_id)
                if self._still_names(fd):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the path was deleted or replaced between our open and our flock: try the new one
        else:
            raise StoreUnavailable(f"the lock file {self.path} keeps being replaced by another process; try again")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            os.close(fd)  # our flock goes with it
            raise StoreUnavailable(f"cannot write the lock file {self.path} ({_why(e)}); free some space", e) from None
        self._fd = fd

    def _open(self) -> int:
        lock_dir = self.path.parent
        try:
            ensure_private_dir(lock_dir)
            if not stat.S_ISDIR(os.lstat(lock_dir).st_mode):
                raise OSError(errno.ELOOP if os.path.islink(lock_dir) else errno.ENOTDIR, "not a directory")
        except OSError as e:  # at start, as one line, not a traceback (e.g. a read-only locks directory)
            raise StoreUnavailable(f"cannot use the lock directory {lock_dir} ({_why(e)}); fix it or use --home", e) from None
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = self._ops.open(str(self.path), flags, 0o600) if self._ops else os.open(self.path, flags, 0o600)
        except OSError as e:
            raise StoreUnavailable(
                f"cannot create the lock file {self.path} ({_why(e)}): remove whatever is in its place, check that "
                "its directory is writable, or use --home", e,
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StoreUnavailable(f"the lock file {self.path} is not a regular file; remove it and try again")
        os.fchmod(fd, 0o600)  # O_CREAT's mode is filtered by the umask
        return fd

    def _still_names(self, fd: int) -> bool:
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        """Remove the lock file, then let go of the flock: the file is unlinked while still held, so a process that
        opened it meanwhile finds after its own flock that the path no longer names its inode (`_still_names`) and
        starts again on a fresh file. Closed sessions leave no lock files behind."""
        if self._fd is not None:
            if self._still_names(self._fd):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass  # a read-only locks directory: the stale file is harmless, the next writer takes its flock
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "it is a symbolic link, which Cairn does not follow"
    return e.strerror or str(e)


def _flock_or_report(fd: int, session_id: str, pid_in_file: bool = True, attempts: int = 5) -> None:
    """Take an exclusive flock, or raise SessionLocked naming the holder. A few short retries ride out a reader's
    momentary shared probe (`lock_holder`), so only a real holder makes this fail."""
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(0.005)
    raise SessionLocked(session_id, (pid_in_file and _read_pid(fd)) or flock_owner(fd)) from None


def flock_session_file(fd: int, session_id: str) -> None:
    """Lock the session file's own descriptor: the guard that a deleted or replaced lock file cannot defeat."""
    _flock_or_report(fd, session_id, pid_in_file=False)


def _read_pid(fd: int) -> int | None:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 64 or not st.st_size:
            return None
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def flock_owner(fd: int) -> int | None:
    """The pid holding a flock on the file behind `fd`, from Linux's /proc/locks (None when it cannot be told)."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", "rb") as f:
            table = f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == dev and fields[4].isdigit():
            return int(fields[4]) or None
    return None


def lock_holder(lock_dir: Path, session_id: str) -> int | None:
    """None when nobody holds the session's lock file; otherwise the holder's pid (0 if it could not be read).
    Never blocks, never follows a symlink, never opens anything but a regular file."""
    path = lock_dir / f"{session_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # absent, a symlink, unreadable: no lock this process can see
    try:
        return probe_flock(fd)
    finally:
        os.close(fd)


def probe_flock(fd: int, pid_in_file: bool = True) -> int | None:
    """None when no one holds an exclusive flock on `fd`'s file; else the holder's pid (0 when unknown)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return (pid_in_file and _read_pid(fd)) or flock_owner(fd) or 0
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None


# -- a byte of a shared file, per session (the SQLite backend) --------------------------------------------------------

HOLD_BASE = 1 << 40  # far past SQLite's own lock bytes (at 1 GiB) and any real database: these bytes are Cairn's alone
_FLOCK = "hhqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid
_idle_fds: dict[tuple[int, int, bool], list[int]] = {}
_idle_guard = threading.Lock()


def hold_offset(session_id: str) -> int:
    """The byte of the shared file that stands for `session_id` (a 40-bit hash: two ids share one once in a trillion)."""
    return HOLD_BASE + int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:5], "big")


class ByteHold:
    """An exclusive open-file-description lock (F_OFD_SETLK) on one byte of a file that many sessions share.

    Why: SQLite keeps every session in one database file, so a writer cannot flock the file the way the JSONL writer
    flocks its session file; a lock file can be deleted or replaced from under it. A byte-range lock on the database
    file itself is held by the kernel for the live writer, cannot be taken away by renaming or deleting anything, and
    goes when the holder dies. OFD locks (not classic POSIX ones) because each writer's lock is its own, even inside one
    process (ACP hosts several sessions). The descriptors are never closed, only unlocked and reused: closing any
    descriptor of the database file would drop the POSIX locks SQLite itself holds on it in this process.
    """

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        self._fd: int | None = None
        self._key: tuple[int, int, bool] | None = None

    def acquire(self) -> bool:
        """True when this holds the byte now; False when another holder has it."""
        fd, key = _borrow(self.path, writable=True)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, self.offset, 1, 0))
        except (BlockingIOError, PermissionError):
            _give_back(fd, key)
            return False
        except BaseException:
            _give_back(fd, key)
            raise
        self._fd, self._key = fd, key
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        fd, key, self._fd = self._fd, self._key, None
        assert key is not None  # (set together with _fd by acquire)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, self.offset, 1, 0))
        except OSError:
            return  # the descriptor is in doubt: keep it out of the pool (and open: see the class docstring)
        _give_back(fd, key)

    @property
    def held(self) -> bool:
        return self._fd is not None


def byte_is_held(path: Path, offset: int) -> bool:
    """Whether anyone (this process included) holds the byte; never blocks, never takes it."""
    try:
        fd, key = _borrow(path, writable=False)
    except OSError:
        return False
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
        return struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        _give_back(fd, key)


def _borrow(path: Path, writable: bool) -> tuple[int, tuple[int, int, bool]]:
    st = os.stat(path, follow_symlinks=False)
    key = (st.st_dev, st.st_ino, writable)
    with _idle_guard:
        idle = _idle_fds.get(key)
        if idle:
            return idle.pop(), key
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)  # not the database (SQLite holds no lock on it): closing is harmless
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return fd, (found.st_dev, found.st_ino, writable)  # its own key, even if the path was replaced meanwhile


def _give_back(fd: int, key: tuple[int, int, bool]) -> None:
    with _idle_guard:
        _idle_fds.setdefault(key, []).append(fd)
