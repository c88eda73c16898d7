"""JSONL backend (SPEC §5): `$CAIRN_HOME/sessions/<id>.jsonl`, a header line then one event per line, mode 0600.

Every write goes through a `FileOps` object so tests can inject ENOSPC/EIO at write or at fdatasync without patching.

The sessions directory is not trusted (SPEC §5): a name is looked at with `lstat` before it is opened, opened without
following symlinks and without blocking (a FIFO named `x.jsonl` must not hang a listing), and checked again with `fstat`
on the descriptor actually read. A writer holds an exclusive flock on the session file itself, so deleting the lock file
of a live session does not let a second writer in. A torn tail is copied to `<id>.jsonl.torn-<ms>` before it is cut.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

from .backend import Backend, EncodedEvent, LoadedLog, Writer
from .checks import PARALLEL_MIN, RunningCheck, VerifyBeside, verify_checks
from .codec import decode_events, decode_header
from .errors import (
    CorruptLog,
    NotASessionFile,
    SessionExists,
    SessionNotFound,
    SessionUnreadable,
    StoreUnavailable,
)
from .events import SessionHeader, encoder, raw_decoder
from .ids import valid_session_id
from .locks import ensure_private_dir, flock_session_file, fsync_dir, probe_flock

_SAFE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class FileOps:
    """The system calls the JSONL writer makes; subclass to inject faults."""

    inline_safe = True  # set False in a subclass whose calls may block on purpose

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)


def write_all(ops: FileOps, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[ops.write(fd, view) :]


class JsonlWriter(Writer):
    def __init__(self, fd: int, size: int, ops: FileOps, check: RunningCheck) -> None:
        self.inline_safe = ops.inline_safe
        self._fd = fd
        self._ops = ops
        self._durable_size = size  # bytes known to be on disk
        self._size = size  # bytes written to the OS
        self._needs_rewind = False  # a failed write may have left a partial line after _durable_size
        self._check = check
        self._durable_check = check.at

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        ops = self._ops
        try:
            if self._needs_rewind:
                ops.ftruncate(self._fd, self._durable_size)
                self._size = self._durable_size
                self._check.advance(self._durable_check)
                self._needs_rewind = False
            data, at = self._check.stamp_lines(batch, durable)
            written = ops.write(self._fd, data) if data else 0
            if written < len(data):  # a short write: the rest, piece by piece
                write_all(ops, self._fd, data[written:])
            self._size += len(data)
            self._check.advance(at)
            if durable:
                ops.fdatasync(self._fd)
                self._durable_size = self._size
                self._durable_check = at
        except OSError:
            self._needs_rewind = True
            raise
        return len(data)

    def close(self) -> None:
        self._ops.close(self._fd)


class JsonlBackend(Backend):
    name = "jsonl"

    def __init__(self, home: Path, ops: FileOps | None = None) -> None:
        self.dir = Path(home) / "sessions"
        self.ops = ops or FileOps()

    def path(self, session_id: str) -> Path:
        return self.dir / f"{session_id}.jsonl"

    def check_writable(self) -> None:
        try:
            ensure_private_dir(self.dir)
        except OSError as e:
            raise StoreUnavailable(f"cannot create the session directory {self.dir}: {e.strerror}", e) from None
        if not os.path.isdir(self.dir):
            raise StoreUnavailable(f"{self.dir} is not a directory; move it away or use --home")
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise StoreUnavailable(f"the session directory {self.dir} is not writable; fix its permissions or use --home")

    def create(self, header: SessionHeader) -> Writer:
        self.check_writable()
        path = self.path(header.id)
        line = encoder.encode(header) + b"\n"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = self.ops.open(str(path), flags, 0o600)
        except FileExistsError:
            raise SessionExists(header.id) from None
        except OSError as e:
            raise StoreUnavailable(f"cannot create {path}: {e.strerror}; free some space or fix permissions", e) from None
        try:
            flock_session_file(fd, header.id)
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
            write_all(self.ops, fd, line)
            self.ops.fdatasync(fd)
            fsync_dir(self.dir)
        except BaseException as e:
            self.ops.close(fd)
            path.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise StoreUnavailable(
                    f"cannot create {path}: {e.strerror or e}; free some space or fix the disk, then try again", e
                ) from None
            raise
        return JsonlWriter(fd, len(line), self.ops, RunningCheck())

    def _open_existing(self, session_id: str, flags: int, opener=os.open) -> int:
        """A descriptor on the session's regular file, or the error that says what is there instead."""
        path = self.path(session_id)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise SessionNotFound(session_id) from None
        except OSError as e:
            raise SessionUnreadable(f"cannot read {path}: {e.strerror}; fix the permissions of {self.dir}", e) from None
        if not stat.S_ISREG(st.st_mode):
            raise NotASessionFile(str(path), _kind(st.st_mode))
        try:
            fd = opener(str(path), flags | _SAFE_OPEN, 0o600)
        except FileNotFoundError:
            raise SessionNotFound(session_id) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise NotASessionFile(str(path), "a symbolic link") from None
            if flags & (os.O_WRONLY | os.O_RDWR) and _readable(path):
                raise SessionUnreadable(
                    f"cannot open {path} for writing ({e.strerror}): `cairn show {session_id}` can read it; "
                    "fix its permissions to continue it", e,
                ) from None
            raise SessionUnreadable(f"cannot read {path} ({e.strerror}); fix its permissions", e) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between lstat and open
            os.close(fd)
            raise NotASessionFile(str(path), _kind(mode))
        return fd

    def load(self, session_id: str) -> LoadedLog:
        fd = self._open_existing(session_id, os.O_RDONLY)
        try:
            data = _read_all(fd, str(self.path(session_id)))
            live_pid = probe_flock(fd, pid_in_file=False)
        finally:
            os.close(fd)
        log = self._parse(data, str(self.path(session_id)), session_id)
        log.extra["live_pid"] = live_pid
        return log

    @staticmethod
    def _parse(data: bytes, path: str, session_id: str | None = None) -> LoadedLog:
        nl = data.find(b"\n")
        if nl < 0:
            if data[:1] in (b"", b"{"):
                raise CorruptLog(path, 1, "the header line is incomplete (the session was never fully created)")
            what = "an SQLite database" if data.startswith(b"SQLite format 3\x00") else "a file without a header line"
            raise CorruptLog(path, 1, f"{what}, not a Cairn session log")
        try:
            header = decode_header(data[:nl], path)
        except RecursionError:
            raise CorruptLog(path, 1, "the header line is nested too deeply to be a session header") from None
        if session_id is not None and header.id != session_id:
            shown = header.id if len(header.id) <= 70 else header.id[:69] + "…"
            raise CorruptLog(path, 1, f"its header names session {shown!r}, not {session_id!r}: renamed or copied?")
        body = memoryview(data)[nl + 1 :]  # no 50 MB copy of the body
        # a long body is checked in a thread while it is decoded (P4); the outcome is used only when the whole body
        # was kept, and decoding's errors still come first
        beside = VerifyBeside(data, nl + 1, len(data), path, first_line=2) if len(body) >= PARALLEL_MIN else None
        try:
            events, kept = decode_events(body, path, first_line=2, tail_may_be_torn=True)
        except RecursionError:
            if beside is not None:
                beside.join()
            raise CorruptLog(path, _too_deep_line(data), "JSON nested too deeply") from None
        except BaseException:
            if beside is not None:
                beside.join()
            raise
        if beside is not None and kept == len(body):
            check, _ = beside.result()
        else:
            if beside is not None:
                beside.join()
            check, _ = verify_checks(data, nl + 1, nl + 1 + kept, path, first_line=2)
        check.next_seq = len(events)
        return LoadedLog(header, events, path, torn_bytes=len(body) - kept, check=check)

    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        self.check_writable()
        path = str(self.path(session_id))
        fd = self._open_existing(session_id, os.O_RDWR | os.O_APPEND, self.ops.open)
        try:
            flock_session_file(fd, session_id)  # before reading: what we read is what no one else is appending to
            data = _read_all(fd, path)
            log = self._parse(data, path, session_id)
            size = len(data) - log.torn_bytes
            if log.torn_bytes:
                self._keep_torn_tail(session_id, data[size:])
                self.ops.ftruncate(fd, size)
                self.ops.fdatasync(fd)
        except BaseException as e:
            self.ops.close(fd)
            if isinstance(e, OSError):
                raise StoreUnavailable(f"cannot prepare {path} for writing: {e.strerror or e}", e) from None
            raise
        return JsonlWriter(fd, size, self.ops, RunningCheck(log.check)), log

    def _keep_torn_tail(self, session_id: str, tail: bytes) -> Path:
        """Copy the bytes about to be cut to `<id>.jsonl.torn-<ms>` (0600) and make the copy durable first."""
        ms = time.time_ns() // 1_000_000
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for n in range(1000):
            copy = self.dir / f"{session_id}.jsonl.torn-{ms + n}"
            try:
                fd = self.ops.open(str(copy), flags, 0o600)
                break
            except FileExistsError:
                continue
        else:
            raise StoreUnavailable(f"cannot name a copy of the torn tail of {self.path(session_id)}")
        try:
            os.fchmod(fd, 0o600)
            write_all(self.ops, fd, tail)
            self.ops.fdatasync(fd)
        except BaseException:
            self.ops.close(fd)
            copy.unlink(missing_ok=True)
            raise
        self.ops.close(fd)
        fsync_dir(self.dir)
        return copy

    def exists(self, session_id: str) -> bool:
        return os.path.lexists(self.path(session_id))

    def delete(self, session_id: str) -> None:
        """Unlink the session file (and the torn-tail copies beside it), after taking the file's own flock: a writer
        whose lock file was deleted still holds that one, so a live session is never removed under it."""
        path = self.path(session_id)
        try:
            fd = self._open_existing(session_id, os.O_RDONLY)
        except NotASessionFile:
            fd = None  # a directory or FIFO squatting on the name: removing the name is what the user asked for
        try:
            if fd is not None:
                flock_session_file(fd, session_id)
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
            for torn in self.dir.glob(f"{session_id}.jsonl.torn-*"):
                torn.unlink()
            fsync_dir(self.dir)
        except OSError as e:
            raise StoreUnavailable(f"cannot delete {path}: {e.strerror}", e) from None
        finally:
            if fd is not None:
                os.close(fd)

    def size(self, session_id: str) -> int | None:
        try:
            return os.lstat(self.path(session_id)).st_size
        except OSError:
            return None

    def modified_ms(self, session_id: str) -> int:
        try:
            return os.lstat(self.path(session_id)).st_mtime_ns // 1_000_000
        except OSError:
            return 0

    def list_ids(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StoreUnavailable(f"cannot list the session directory {self.dir}: {e.strerror}", e) from None
        ids = (n[: -len(".jsonl")] for n in names if n.endswith(".jsonl"))
        return sorted(i for i in ids if valid_session_id(i))


def _read_all(fd: int, path: str) -> bytes:
    """Everything in the file up to its end, read as it stands now. The first read asks for the size fstat gives, so a
    file that does not grow meanwhile comes back as that one buffer: reading in 1 MB pieces and joining them copied a
    50 MB session twice (~20 ms of P4). Reading goes on until end of file, so a file that grew is read whole too."""
    chunks = []
    try:
        size = os.fstat(fd).st_size
        while chunk := os.read(fd, max(size, 1 << 20)):
            chunks.append(chunk)
            size = 0
    except OSError as e:
        raise SessionUnreadable(f"cannot read {path}: {e.strerror}", e) from None
    return b"".join(chunks)  # (one piece: that very object, no copy)


def _too_deep_line(data: bytes) -> int:
    """The line number of the first line whose JSON nests too deeply to decode (error path only)."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        try:
            raw_decoder.decode(line)
        except RecursionError:
            return number
        except Exception:
            continue
    return 0


def _readable(path: Path) -> bool:
    """Whether this process can open the file for reading (a message must not offer `cairn show` when it cannot)."""
    try:
        os.close(os.open(path, os.O_RDONLY | _SAFE_OPEN))
    except OSError:
        return False
    return True
