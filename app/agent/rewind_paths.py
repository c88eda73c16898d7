"""One path of a rewind on disk: what it holds now in the plan's id space (a blob of the shadow repository, or a sha256
of the before-image store), where the content to put back comes from, and putting it there atomically, inside the
workspace, never following a symbolic link (SPEC §9 rev 3, §12).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from cairn.persistence.blobs import BlobStore
from cairn.persistence.events import RewindFile
from cairn.persistence.evidence import inside, sha256_of_file

from ..tools.file_writes import atomic_write
from .snapshots import SYMLINK, ShadowRepo, SnapshotUnavailable, state_of

GIT = "git:"  # a content id naming a blob of the shadow repository (else: a sha256 of the before-image store)

State = tuple[str | None, str] | None  # (git mode or None, content id); None: nothing there


def _raw(path: str) -> str | None:
    """The name's bytes, when the log cannot hold it as text (not UTF-8)."""
    try:
        path.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return base64.b64encode(os.fsencode(path)).decode()


def real_path(item: RewindFile) -> str:
    """The path a plan's entry names on disk (its bytes, for a name that is not UTF-8)."""
    return os.fsdecode(base64.b64decode(item.raw_path)) if item.raw_path else item.path


def _read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return f.read()


def _is_git(item: RewindFile) -> bool:
    return any(x is not None and x.startswith(GIT) for x in (item.restore_sha256, item.expected_sha256))


def _current_state(workspace: Path, path: str, git: bool) -> State:
    """What `path` holds now, in the plan's id space: (mode, git:<blob>) with snapshots, (None, sha256) without."""
    target = inside(workspace, path)
    if target is None:
        raise OSError(errno.EXDEV, "it is outside the workspace now")
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(target).st_mode) and not os.listdir(target):
            return None  # an empty directory where a file goes: nothing to lose (a rewind removes it to write)
    if git:
        found = state_of(target)
        return (found[0], GIT + found[1]) if found else None
    digest = sha256_of_file(target)
    return (None, digest) if digest is not None else None


def _matches(now: State, content: str | None, mode: str | None) -> bool:
    if content is None:
        return now is None
    return now is not None and now[1] == content and (mode is None or now[0] == mode)


def _content_known(content: str, repo: ShadowRepo | None) -> bool:
    return not content.startswith(GIT) or repo is not None


def _content(content: str, blobs: BlobStore | None, repo: ShadowRepo | None) -> bytes | None:
    if content.startswith(GIT):
        if repo is None:
            return None
        try:
            return repo.blob(content[len(GIT):])
        except SnapshotUnavailable:
            return None
    return blobs.get(content) if blobs is not None else None


def write_path(workspace: Path, path: str, data: bytes | None, mode: str | None) -> None:
    """Put `data` at `path` (None: delete it) atomically, inside the workspace, never following a symbolic link: every
    parent is opened with O_NOFOLLOW from the workspace root (a link where a directory should be is refused), the name
    itself replaced, not followed. Mode `120000` writes a symbolic link whose target is `data`."""
    parts = path.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"{path} is not a plain relative path")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workspace, flags)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if data is None:
                    return  # nothing there to delete
                os.mkdir(part, 0o755, dir_fd=fd)
                os.fsync(fd)  # the new directory's name survives a power cut with what goes into it (SPEC §12)
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(e.errno, f"{part} is a symbolic link or a file now, not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        _replace(fd, parts[-1], data, mode)
    finally:
        os.close(fd)


def _replace(dir_fd: int, name: str, data: bytes | None, mode: str | None) -> None:
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        try:  # an empty directory where the file was (what it held already went back) holds nothing to lose
            if data is None:
                raise OSError(errno.EISDIR, f"{name} is a directory now")
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            raise OSError(errno.EISDIR, f"{name} is a directory now") from None
        old = None
    if data is None:
        if old is not None:
            os.unlink(name, dir_fd=dir_fd)
            os.fsync(dir_fd)
        return
    if mode != SYMLINK:
        bits = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
        if mode == "100755":
            bits |= (bits & 0o444) >> 2
        elif mode == "100644":
            bits &= ~0o111
        atomic_write(dir_fd, name, data, bits)
        return
    tmp = f".{name[:100]}.{secrets.token_hex(6)}.cairn-tmp"
    os.symlink(os.fsdecode(data), tmp, dir_fd=dir_fd)  # a link is restored as a link, never followed
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse to fsync a directory
        os.fsync(dir_fd)
