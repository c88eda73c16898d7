"""JSONL backend (SPEC §5): `$CAIRN_HOME/sessions/<id>.jsonl`, a header line then one event per line, mode 0600.

Every write goes through a `FileOps` object so tests can inject ENOSPC/EIO at write or at fdatasync without patching.
"""

from __future__ import annotations

import os
from pathlib import Path

from .backend import Backend, EncodedEvent, LoadedLog, Writer
from .codec import decode_events, decode_header
from .errors import CorruptLog, SessionExists, SessionNotFound, StoreUnavailable
from .events import SessionHeader, encoder


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


def fsync_dir(path: Path) -> None:
    """Make a newly created file's directory entry durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(ops: FileOps, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[ops.write(fd, view) :]


class JsonlWriter(Writer):
    def __init__(self, fd: int, size: int, ops: FileOps) -> None:
        self.inline_safe = ops.inline_safe
        self._fd = fd
        self._ops = ops
        self._durable_size = size  # bytes known to be on disk
        self._size = size  # bytes written to the OS
        self._needs_rewind = False  # a failed write may have left a partial line after _durable_size

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        ops = self._ops
        try:
            if self._needs_rewind:
                ops.ftruncate(self._fd, self._durable_size)
                self._size = self._durable_size
                self._needs_rewind = False
            data = b"\n".join([d for _, d in batch]) + b"\n" if batch else b""
            write_all(ops, self._fd, data)
            self._size += len(data)
            if durable:
                ops.fdatasync(self._fd)
                self._durable_size = self._size
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
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StoreUnavailable(f"cannot create the session directory {self.dir}: {e.strerror}") from None
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise StoreUnavailable(f"the session directory {self.dir} is not writable; fix its permissions or use --home")

    def create(self, header: SessionHeader) -> Writer:
        self.check_writable()
        path = self.path(header.id)
        line = encoder.encode(header) + b"\n"
        try:
            fd = self.ops.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            raise SessionExists(header.id) from None
        try:
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
            write_all(self.ops, fd, line)
            self.ops.fdatasync(fd)
            fsync_dir(self.dir)
        except BaseException:
            self.ops.close(fd)
            path.unlink(missing_ok=True)
            raise
        return JsonlWriter(fd, len(line), self.ops)

    def _read(self, session_id: str) -> tuple[bytes, str]:
        path = self.path(session_id)
        try:
            with open(path, "rb") as f:
                return f.read(), str(path)
        except FileNotFoundError:
            raise SessionNotFound(session_id) from None

    def load(self, session_id: str) -> LoadedLog:
        data, path = self._read(session_id)
        return self._parse(data, path)

    @staticmethod
    def _parse(data: bytes, path: str) -> LoadedLog:
        nl = data.find(b"\n")
        if nl < 0:
            raise CorruptLog(path, 1, "the header line is incomplete (the session was never fully created)")
        header = decode_header(data[:nl], path)
        body = memoryview(data)[nl + 1 :]  # no 50 MB copy of the body
        events, kept = decode_events(body, path, first_line=2, tail_may_be_torn=True)
        return LoadedLog(header, events, path, torn_bytes=len(body) - kept)

    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        self.check_writable()
        data, path = self._read(session_id)
        log = self._parse(data, path)
        fd = self.ops.open(path, os.O_WRONLY | os.O_APPEND, 0o600)
        try:
            size = len(data) - log.torn_bytes
            if log.torn_bytes:
                self.ops.ftruncate(fd, size)
                self.ops.fdatasync(fd)
        except BaseException:
            self.ops.close(fd)
            raise
        return JsonlWriter(fd, size, self.ops), log

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def list_ids(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.name[: -len(".jsonl")] for p in self.dir.glob("*.jsonl"))

