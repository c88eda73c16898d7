"""Errors the persistence layer raises. Each message is one readable line: what went wrong and what to do."""

from __future__ import annotations


class PersistenceError(Exception):
    """Base class; the CLI maps subclasses to exit codes."""


class InvalidSessionId(PersistenceError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"invalid session id {session_id!r}: use 1-64 letters, digits, '.', '_' or '-', not starting with '.'"
        )
        self.session_id = session_id


class SessionNotFound(PersistenceError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r}; `cairn sessions` lists the ones that exist")
        self.session_id = session_id


class SessionExists(PersistenceError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists; use --resume {session_id} to continue it")
        self.session_id = session_id


class SessionLocked(PersistenceError):
    def __init__(self, session_id: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid else "another process"
        super().__init__(
            f"session {session_id!r} is live in {holder}; close it there first (reading it with `cairn show` works)"
        )
        self.session_id = session_id
        self.pid = pid


class CorruptLog(PersistenceError):
    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: session log is corrupt ({reason}); the file was left untouched")
        self.path = path
        self.line = line
        self.reason = reason


class NotASessionFile(CorruptLog):
    """What sits at a session's path is not a regular file (a directory, FIFO, device or symlink): nothing to read.

    A CorruptLog (exit 4) because the session's storage holds something Cairn cannot use, not because it is missing."""

    def __init__(self, path: str, what: str) -> None:
        PersistenceError.__init__(self, f"{path} is {what}, not a session file; move it out of the sessions directory")
        self.path = path
        self.line = 0
        self.reason = f"{what}, not a regular file"


class CorruptDatabase(CorruptLog):
    """The SQLite file itself cannot be used: not a database, damaged, or another program's database."""

    def __init__(self, path: str, reason: str) -> None:
        PersistenceError.__init__(
            self, f"{path}: {reason}; the file was left untouched (move it away or use another --home)"
        )
        self.path = path
        self.line = 0
        self.reason = reason


class UnsupportedFormat(PersistenceError):
    """A header version this build does not understand: distinct from corruption."""

    def __init__(self, path: str, version: object, supported: int) -> None:
        if isinstance(version, int) and version > supported:
            what = f"was written by a newer Cairn (format version {version}, this build reads {supported}); upgrade Cairn"
        elif isinstance(version, int):
            what = f"uses an older format version {version} that this build (version {supported}) no longer reads"
        else:
            what = f"is not a Cairn session (format/version {_short_repr(version)})"
        super().__init__(f"{path}: session {what}")
        self.path = path
        self.version = version
        self.reason = f"session {what}"


def _short_repr(value: object, limit: int = 40) -> str:
    """A header's first line can be anything (a whole JSON array): keep the message one short line."""
    text = repr(value)
    if isinstance(value, (list, dict)):
        kind = "a JSON array" if isinstance(value, list) else "a JSON object"
        return kind if len(text) > limit else f"{kind} {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CheckpointFailed(PersistenceError):
    """A barrier could not make the log durable. The events stay queued; the next barrier retries them."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"checkpoint failed: {cause}")
        self.cause = cause


class NotDurableAtClose(CheckpointFailed):
    """The last flush, when a session is closed, failed: no later checkpoint will retry what is still queued.

    Says what is true then (SPEC §5: no "the next checkpoint retries" when there is none): which events are durable,
    which were not written, and what a resume makes of it. Events written to the OS before the error may still be on
    disk (a resume keeps every complete line, cuts a torn one); the rest are lost."""

    def __init__(self, session_id: str, cause: BaseException, durable_seq: int, last_seq: int) -> None:
        self.cause = cause
        self.durable_seq = durable_seq
        self.last_seq = last_seq
        lost = last_seq - durable_seq
        if isinstance(cause, StaleWriter):  # fenced: never written, by design; the session lives on elsewhere
            PersistenceError.__init__(
                self, f"{cause}: its last {lost} event{'s' if lost != 1 else ''} (seq {durable_seq + 1}–{last_seq}) "
                      f"were not stored; the session goes on where the other writer has it (cairn show {session_id})")
            return
        kept = (f"Events up to seq {durable_seq} are durable" if durable_seq >= 0
                else "None of its events is durable")
        PersistenceError.__init__(
            self,
            f"session {session_id!r} was closed without writing its last {lost} event{'s' if lost != 1 else ''} "
            f"(seq {durable_seq + 1}–{last_seq}): {cause}. {kept}; of the later ones only what reached the disk "
            f"before the error survives, the rest is lost. Resuming the session (cairn run --resume {session_id}) "
            "keeps what is on disk and closes an unfinished turn as interrupted; free some space or fix the disk "
            "first",
        )


class StaleWriter(PersistenceError):
    """Another writer appended to this session behind our back; we stop writing rather than interleave."""


class StoreUnavailable(PersistenceError):
    """The session store cannot be used at all (e.g. its directory is read-only, the disk is full)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.reason = message


class SessionUnreadable(StoreUnavailable):
    """A session file exists but this user may not read (or write) it: a permissions problem, exit 2."""


class DatabaseBusy(SessionLocked):
    """Another process holds the SQLite write lock for longer than the busy timeout (exit 3, like a locked session)."""

    def __init__(self, path: str, seconds: float) -> None:
        PersistenceError.__init__(
            self,
            f"{path} is locked by another process (its write lock was held for more than {seconds:g} s); "
            "try again when that process is done",
        )
        self.session_id = ""
        self.pid = None
