"""A power-cut file system for tests (LazyFS semantics), in pure Python over FUSE (mfusepy on libfuse3).

Model
-----
* The daemon keeps the whole tree in memory as inodes: regular files (bytes, mode, times), directories (name -> inode)
  and symlinks; hard links are allowed (git uses link()). There are two states: the *logical* one every process sees and
  the *durable* one that survives a cut.
* fsync/fdatasync of a file makes that inode's content, size and mode durable -- not its name.
* fsync of a directory (`fsyncdir`: os.fsync on an O_RDONLY fd of it) makes its entries durable as they are now: new
  names, renames into and out of it, unlinks, new subdirectories' names. As POSIX says, a new name is durable only once
  its directory is fsync'd. An inode reached by a durable name whose content was never fsync'd comes back empty
  (size 0); a directory never fsync'd comes back with its durable entries (empty if new). Each directory is durable on
  its own: a rename across directories with only the destination fsync'd comes back under both names (hard links); a
  directory durable under two names comes back under the first found (`shadowed_dirs`).
* A cut drops everything that is not durable, as a power loss would. With `keep_prefix=True` (seeded) every surviving
  file also keeps a random prefix of the writes/truncates made since its last fsync, applied in order, the last kept
  write possibly cut short at a random byte -- as real disks do. Never a byte that was not written.
* sync(2)/syncfs(2) make nothing durable here: Linux does not forward them to a FUSE server (only virtiofs gets
  FUSE_SYNCFS). Only fsync, fdatasync and fsync of a directory do.

Mount: attr/entry/negative timeouts 0 (every process sees the daemon's truth), no direct_io (MAP_SHARED mmap works:
SQLite's -shm), no writeback cache (every write() reaches the daemon before it returns), use_ino, rename flags
(RENAME_NOREPLACE, RENAME_EXCHANGE) honoured. There are no lock/flock operations, so the kernel keeps flock and fcntl
locks itself, per mount. A file unlinked or replaced while open is renamed by libfuse to `.fuse_hidden*`; the model
treats that as the unlink it is (no readdir, no durable name) and keeps the open file usable (fstat, fchmod).
A cut first freezes the state (every later request fails with EIO: the power is gone), unmounts (`fusermount3 -u`,
else `-uz`), rebuilds the logical state from the durable one and mounts again: no kernel cache outlives a cut. The
caller must have ended every process using the mount before a cut (a process still inside gets EIO until it lets go).

Limits: O_TMPFILE, mknod, xattrs are not supported (EOPNOTSUPP/ENOSYS: Python's tempfile falls back); a file still open
after its directory was removed answers fstat/fchmod with ESTALE (libfuse's high-level API names files by path).
Everything lives in the daemon's memory, with each file's writes since its last fsync kept for keep_prefix: test-sized
trees only. Permissions are the kernel's (default_permissions) from the modes kept here.

Process: `PowerCutFS.start()` runs `python tests/powercut_fs.py serve ...`, a daemon controlled by JSON lines over its
stdin/stdout; its stderr (libfuse's and ours) goes to `log_path`. It dies with its parent (PR_SET_PDEATHSIG, and EOF on
its stdin), and a small reaper process it forks first lazily unmounts its mounts if it dies any other way, so no stale
mount is left behind.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import errno
import functools
import importlib.util
import json
import os
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

WAIT = 20.0  # seconds for the daemon to answer; a loaded 2-core CI machine needs well under one
FSNAME = "powercut"
FSTYPE = "fuse.powercut"
ROOT = 1

_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_FALLOC_FL_KEEP_SIZE = 1
_PR_SET_PDEATHSIG = 1
_HIDDEN = ".fuse_hidden"


# --------------------------------------------------------------------------------------------------- availability


@functools.cache
def unavailable() -> str | None:
    """None when a power-cut mount can work here, else the one-line reason (no /dev/fuse, no fusermount3, no libfuse3,
    mfusepy missing)."""
    if not sys.platform.startswith("linux"):
        return "power-cut mounts need Linux FUSE"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened: {exc.strerror}"
    fusermount = shutil.which("fusermount3")
    if fusermount is None:
        return "no fusermount3 (Debian package fuse3)"
    if os.geteuid() != 0 and not os.stat(fusermount).st_mode & stat.S_ISUID:
        return "not root and fusermount3 is not setuid"
    if ctypes.util.find_library("fuse3") is None:
        return "no libfuse3 (Debian package fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (pip install mfusepy==3.1.1)"
    return None


def require() -> None:
    """pytest.skip(reason) when unavailable -- unless env CAIRN_REQUIRE_POWERCUT=1, then pytest.fail(reason,
    pytrace=False)."""
    reason = unavailable()
    if reason is None:
        return
    import pytest

    if os.environ.get("CAIRN_REQUIRE_POWERCUT") == "1":
        pytest.fail(f"power-cut file system required (CAIRN_REQUIRE_POWERCUT=1) but unavailable: {reason}",
                    pytrace=False)
    pytest.skip(f"power-cut file system unavailable: {reason}")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable (fsyncdir)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unescape(field_text: str) -> str:
    """/proc/mounts and mountinfo write space, tab, newline and backslash as \\ooo."""
    if "\\" not in field_text:
        return field_text
    out, i = [], 0
    while i < len(field_text):
        if field_text[i] == "\\" and field_text[i + 1:i + 4].isdigit():
            out.append(chr(int(field_text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


def mounted_at(path: str | os.PathLike[str]) -> list[str]:
    """The file system types mounted at `path` now, per /proc/mounts (innermost last)."""
    target = os.path.realpath(path)
    found = []
    with open("/proc/mounts", encoding="utf-8", errors="surrogateescape") as mounts:
        for line in mounts:
            parts = line.split()
            if len(parts) >= 3 and _unescape(parts[1]) == target:
                found.append(parts[2])
    return found


def _mount_devs(path: str) -> list[str]:
    """`major:minor` of the power-cut mounts at `path`, per /proc/self/mountinfo."""
    devs = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
        for line in info:
            parts = line.split()
            sep = parts.index("-")
            if _unescape(parts[4]) == path and parts[sep + 1] == FSTYPE:
                devs.append(parts[2])
    return devs


# --------------------------------------------------------------------------------------------------- the model


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class Image:
    """What of one inode survives a cut."""

    mode: int
    uid: int
    gid: int
    mtime: int
    data: bytes = b""
    entries: dict[str, int] = field(default_factory=dict)
    target: str = ""


@dataclass
class Node:
    ino: int
    mode: int
    uid: int
    gid: int
    atime: int
    mtime: int
    ctime: int
    links: int = 1  # directory entries naming it (a directory: 1 while linked)
    data: bytearray = field(default_factory=bytearray)
    entries: dict[str, int] = field(default_factory=dict)
    hidden: dict[str, int] = field(default_factory=dict)  # libfuse's .fuse_hidden names of unlinked open files
    target: str = ""
    opens: int = 0
    # Writes ("w", offset, bytes) and size changes ("t", size, b"") since the last fsync, in order (keep_prefix).
    log: list[tuple[str, int, bytes]] = field(default_factory=list)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)

    def image(self, *, empty: bool = False) -> Image:
        return Image(self.mode, self.uid, self.gid, self.mtime, b"" if empty else bytes(self.data),
                     {} if empty else dict(self.entries), self.target)

    def touch(self, now: int) -> None:
        self.mtime = self.ctime = now


def _node_from(ino: int, img: Image) -> Node:
    return Node(ino, img.mode, img.uid, img.gid, img.mtime, img.mtime, img.mtime, links=0, data=bytearray(img.data),
                entries=dict(img.entries), target=img.target)


def _apply(data: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, at, payload = op
    if kind == "t":
        del data[at:]
        data.extend(bytes(at - len(data)))
    else:
        if at > len(data):
            data.extend(bytes(at - len(data)))
        data[at:at + len(payload)] = payload


class State:
    """The logical and durable trees; every method is called with `lock` held."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.RLock()
        self.seed = seed
        self.rng = random.Random(seed)
        now = time.time_ns()
        root = Node(ROOT, stat.S_IFDIR | 0o755, os.getuid(), os.getgid(), now, now, now)
        self.nodes: dict[int, Node] = {ROOT: root}
        self.durable: dict[int, Image] = {ROOT: root.image()}
        self.next_ino = ROOT + 1
        self.counters = {"fsync": 0, "fdatasync": 0, "fsyncdir": 0, "writes": 0, "bytes_written": 0, "cuts": 0,
                         "mounts": 0}

    def new_node(self, mode: int, uid: int, gid: int) -> Node:
        now = time.time_ns()
        node = Node(self.next_ino, mode, uid, gid, now, now, now)
        self.nodes[node.ino] = node
        self.next_ino += 1
        return node

    def maybe_free(self, node: Node) -> None:
        if node.links <= 0 and node.opens <= 0 and node.ino != ROOT:
            self.nodes.pop(node.ino, None)

    def sync_file(self, node: Node) -> None:
        self.durable[node.ino] = node.image()
        node.log.clear()

    def sync_dir(self, node: Node) -> None:
        self.durable[node.ino] = node.image()
        for child in node.entries.values():
            if child not in self.durable:  # its name is durable now, its content not (yet)
                self.durable[child] = self.nodes[child].image(empty=True)

    def _tree(self, nodes: dict[int, Node]) -> tuple[set[int], dict[tuple[int, str], int]]:
        """Inodes reachable from the root, and every (directory, name) -> inode on the way."""
        seen, stack = {ROOT}, [ROOT]
        names: dict[tuple[int, str], int] = {}
        while stack:
            parent = stack.pop()
            for name, child in nodes[parent].entries.items():
                names[(parent, name)] = child
                if child not in seen:
                    seen.add(child)
                    if nodes[child].is_dir:
                        stack.append(child)
        return seen, names

    def unsynced(self) -> tuple[int, int]:
        reachable, _ = self._tree(self.nodes)
        files = dirs = 0
        for ino in reachable:
            node, img = self.nodes[ino], self.durable.get(ino)
            if node.is_dir:
                dirs += img is None or img.entries != node.entries
            elif node.is_reg:
                files += img is None or bool(node.log)
        return files, dirs

    def cut(self, *, keep_prefix: bool) -> dict[str, int]:
        """Replace the logical state by what a power cut leaves: the durable state (plus prefixes)."""
        old = self.nodes
        old_reachable, old_names = self._tree(old)
        # The durable tree: each directory placed once (a directory durable under two names keeps the first).
        entries: dict[int, dict[str, int]] = {}
        stack, placed, shadowed = [ROOT], {ROOT}, 0
        while stack:
            ino = stack.pop()
            kept: dict[str, int] = {}
            for name, child in sorted(self.durable[ino].entries.items()):
                if stat.S_ISDIR(self.durable[child].mode):
                    if child in placed:
                        shadowed += 1
                        continue
                    placed.add(child)
                    stack.append(child)
                kept[name] = child
            entries[ino] = kept
        new: dict[int, Node] = {}
        for ino in [ROOT, *sorted({c for kept in entries.values() for c in kept.values()})]:
            new[ino] = _node_from(ino, self.durable[ino])
        kept_bytes = 0
        for ino, node in new.items():
            if node.is_dir:
                node.entries = entries[ino]
                node.links = 1
            elif ino in old and old[ino].log and keep_prefix and node.is_reg:
                kept_bytes += self._keep_prefix(node.data, old[ino].log)
        for kept in entries.values():
            for child in kept.values():
                if not new[child].is_dir:
                    new[child].links += 1
        new_reachable, new_names = self._tree(new)
        counts = {
            "dropped_files": sum(1 for i in old_reachable - new_reachable if not old[i].is_dir),
            "dropped_dirs": sum(1 for i in old_reachable - new_reachable if old[i].is_dir),
            "dropped_names": sum(1 for key, ino in old_names.items() if new_names.get(key) != ino),
            "restored_names": sum(1 for key, ino in new_names.items() if old_names.get(key) != ino),
            "reverted_files": sum(1 for i in new_reachable & old_reachable
                                  if new[i].is_reg and old[i].is_reg and new[i].data != old[i].data),
            "shadowed_dirs": shadowed,
            "kept_prefix_bytes": kept_bytes,
        }
        self.nodes = new
        self.durable = {ino: node.image() for ino, node in new.items()}
        self.counters["cuts"] += 1
        return counts

    def _keep_prefix(self, data: bytearray, log: list[tuple[str, int, bytes]]) -> int:
        """Apply a random prefix of `log` to `data`, the next write possibly cut short; the bytes written."""
        keep = self.rng.randint(0, len(log))
        written = 0
        for op in log[:keep]:
            _apply(data, op)
            written += len(op[2])
        if keep < len(log) and log[keep][0] == "w" and len(log[keep][2]) > 1:
            part = self.rng.randrange(0, len(log[keep][2]))
            if part:
                _apply(data, ("w", log[keep][1], log[keep][2][:part]))
                written += part
        return written


# --------------------------------------------------------------------------------------------------- FUSE operations


def _context() -> tuple[int, int]:
    import mfusepy

    uid, gid, _pid = mfusepy.fuse_get_context()
    return uid, gid


class Ops:
    """The FUSE operations of one mount over the shared State (mfusepy calls these by name)."""

    use_ns = True
    flag_nopath = True  # with flag_nullpath_ok: mfusepy sets libfuse's nullpath_ok; open files go by handle
    flag_nullpath_ok = True

    def __init__(self, state: State) -> None:
        self.state = state
        self.alive = True
        self.ready = threading.Event()
        self.handles: dict[int, tuple[int, int]] = {}  # fh -> (ino, open flags)
        self.next_fh = 1

    # -- plumbing

    @contextmanager
    def _live(self) -> Iterator[State]:
        with self.state.lock:
            if not self.alive:
                raise _err(errno.EIO)
            yield self.state

    def _lookup(self, path: str) -> Node:
        nodes = self.state.nodes
        node = nodes[ROOT]
        for part in path.split("/"):
            if not part:
                continue
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            child = node.entries.get(part, node.hidden.get(part))
            if child is None:
                raise _err(errno.ENOENT)
            node = nodes[child]
        return node

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.state.nodes[self.handles[fh][0]]
        if path is None:
            raise _err(errno.EBADF)
        return self._lookup(path)

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        if not name:
            raise _err(errno.EBUSY)
        if len(name.encode("utf-8", "surrogateescape")) > 255:
            raise _err(errno.ENAMETOOLONG)
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise _err(errno.ENOTDIR)
        return parent, name

    def _open_handle(self, node: Node, flags: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = (node.ino, flags)
        node.opens += 1
        return fh

    def _close_handle(self, fh: int) -> None:
        with self.state.lock:
            entry = self.handles.pop(fh, None)
            if not self.alive:  # a frozen mount's handle: its inode numbers now name the state after the cut
                return
            node = self.state.nodes.get(entry[0]) if entry else None
            if node is not None:
                node.opens -= 1
                self.state.maybe_free(node)

    def _truncate(self, node: Node, size: int) -> None:
        if not node.is_reg:
            raise _err(errno.EISDIR if node.is_dir else errno.EINVAL)
        if size < 0:
            raise _err(errno.EINVAL)
        if size != len(node.data):
            op = ("t", size, b"")
            _apply(node.data, op)
            node.log.append(op)
        node.touch(time.time_ns())

    def _new_entry(self, path: str, mode: int) -> tuple[Node, str, Node]:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _err(errno.EEXIST)
        uid, gid = _context()
        node = self.state.new_node(mode, uid, gid)
        parent.entries[name] = node.ino
        parent.touch(node.mtime)
        return parent, name, node

    # -- lifecycle

    def init_with_config(self, conn: Any, config: Any) -> None:
        with self.state.lock:
            self.state.counters["mounts"] += 1
        self.ready.set()

    # -- metadata

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._live() as st:
            node = self._node(path, fh)
            if node.is_dir:
                size = 4096
                nlink = (2 + sum(1 for c in node.entries.values() if st.nodes[c].is_dir)) if node.links else 0
            else:
                size = len(node.data) if node.is_reg else len(node.target.encode("utf-8", "surrogateescape"))
                nlink = node.links
            return {"st_ino": node.ino, "st_mode": node.mode, "st_nlink": nlink, "st_uid": node.uid,
                    "st_gid": node.gid, "st_size": size, "st_atime": node.atime, "st_mtime": node.mtime,
                    "st_ctime": node.ctime, "st_blksize": 4096, "st_blocks": (size + 511) // 512}

    def access(self, path: str, amode: int) -> int:
        with self._live():
            self._lookup(path)
            return 0

    def statfs(self, path: str) -> dict[str, int]:
        with self._live() as st:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 22, "f_bfree": 1 << 21,
                    "f_bavail": 1 << 21, "f_files": 1 << 22, "f_ffree": (1 << 22) - len(st.nodes),
                    "f_favail": (1 << 22) - len(st.nodes), "f_namemax": 255}

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        with self._live():
            node = self._node(path, fh)
            node.mode = stat.S_IFMT(node.mode) | (mode & 0o7777)
            node.ctime = time.time_ns()
            return 0

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        with self._live():
            node = self._node(path, fh)
            if uid != -1:
                node.uid = uid
            if gid != -1:
                node.gid = gid
            node.ctime = time.time_ns()
            return 0

    def utimens(self, path: str | None, times: tuple[int | None, int | None] | None = None,
                fh: int | None = None) -> int:
        with self._live():
            node = self._node(path, fh)
            now = time.time_ns()
            atime, mtime = times if times is not None else (now, now)
            if atime is not None:
                node.atime = atime
            if mtime is not None:
                node.mtime = mtime
            node.ctime = now
            return 0

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._live():
            self._truncate(self._node(path, fh), length)
            return 0

    # -- names

    def mkdir(self, path: str, mode: int) -> int:
        with self._live():
            self._new_entry(path, stat.S_IFDIR | (mode & 0o7777))
            return 0

    def rmdir(self, path: str) -> int:
        with self._live() as st:
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                raise _err(errno.ENOENT)
            node = st.nodes[ino]
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            if node.entries:
                raise _err(errno.ENOTEMPTY)
            del parent.entries[name]
            parent.touch(time.time_ns())
            node.links = 0
            node.hidden.clear()  # unlinked files still open there: libfuse can no longer name them (ESTALE)
            st.maybe_free(node)
            return 0

    def unlink(self, path: str) -> int:
        with self._live() as st:
            parent, name = self._parent(path)
            if name in parent.hidden:  # libfuse removing a hidden file at its last close: unlinked already
                hidden = st.nodes.get(parent.hidden.pop(name))
                if hidden is not None:
                    st.maybe_free(hidden)
                return 0
            ino = parent.entries.get(name)
            if ino is None:
                raise _err(errno.ENOENT)
            node = st.nodes[ino]
            if node.is_dir:
                raise _err(errno.EISDIR)
            del parent.entries[name]
            now = time.time_ns()
            parent.touch(now)
            node.links -= 1
            node.ctime = now
            st.maybe_free(node)
            return 0

    def symlink(self, path: str, target: str) -> int:
        """mfusepy: symlink(link path, what it points to)."""
        with self._live():
            _parent, _name, node = self._new_entry(path, stat.S_IFLNK | 0o777)
            node.target = target
            return 0

    def readlink(self, path: str) -> str:
        with self._live():
            node = self._lookup(path)
            if not stat.S_ISLNK(node.mode):
                raise _err(errno.EINVAL)
            return node.target

    def link(self, path: str, existing: str) -> int:
        """mfusepy: link(new path, existing path)."""
        with self._live():
            node = self._lookup(existing)
            if node.is_dir:
                raise _err(errno.EPERM)
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            parent.entries[name] = node.ino
            now = time.time_ns()
            parent.touch(now)
            node.links += 1
            node.ctime = now
            return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        with self._live() as st:
            if flags & ~(_RENAME_NOREPLACE | _RENAME_EXCHANGE) or flags == _RENAME_NOREPLACE | _RENAME_EXCHANGE:
                raise _err(errno.EINVAL)
            src_dir, src_name = self._parent(old)
            src_ino = src_dir.entries.get(src_name)
            if src_ino is None:
                raise _err(errno.ENOENT)
            dst_dir, dst_name = self._parent(new)
            dst_ino = dst_dir.entries.get(dst_name)
            src = st.nodes[src_ino]
            now = time.time_ns()
            if (dst_name.startswith(_HIDDEN) and dst_dir is src_dir and dst_ino is None and not flags
                    and not src.is_dir):
                # libfuse hides a file unlinked (or replaced) while open: for everyone else it is an unlink.
                del src_dir.entries[src_name]
                src_dir.hidden[dst_name] = src_ino
                src_dir.touch(now)
                src.links -= 1
                src.ctime = now
                return 0
            if src.is_dir and self._contains(src, dst_dir.ino):
                raise _err(errno.EINVAL)
            if flags & _RENAME_EXCHANGE:
                if dst_ino is None:
                    raise _err(errno.ENOENT)
                if st.nodes[dst_ino].is_dir and self._contains(st.nodes[dst_ino], src_dir.ino):
                    raise _err(errno.EINVAL)
                src_dir.entries[src_name], dst_dir.entries[dst_name] = dst_ino, src_ino
                src_dir.touch(now)
                dst_dir.touch(now)
                return 0
            if dst_ino is not None and flags & _RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            if dst_ino == src_ino:
                return 0
            if dst_ino is not None:
                dst = st.nodes[dst_ino]
                if src.is_dir and not dst.is_dir:
                    raise _err(errno.ENOTDIR)
                if not src.is_dir and dst.is_dir:
                    raise _err(errno.EISDIR)
                if dst.is_dir and dst.entries:
                    raise _err(errno.ENOTEMPTY)
                dst.links = 0 if dst.is_dir else dst.links - 1
                dst.ctime = now
                st.maybe_free(dst)
            del src_dir.entries[src_name]
            dst_dir.entries[dst_name] = src_ino
            src_dir.touch(now)
            dst_dir.touch(now)
            src.ctime = now
            return 0

    def _contains(self, directory: Node, ino: int) -> bool:
        stack = [directory]
        while stack:
            node = stack.pop()
            if node.ino == ino:
                return True
            stack.extend(self.state.nodes[c] for c in node.entries.values() if self.state.nodes[c].is_dir)
        return False

    # -- files

    def create(self, path: str, mode: int, flags: int) -> int:
        with self._live() as st:
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                _parent, _name, node = self._new_entry(path, stat.S_IFREG | (mode & 0o7777))
            else:
                if flags & os.O_EXCL:
                    raise _err(errno.EEXIST)
                node = st.nodes[ino]
                if node.is_dir:
                    raise _err(errno.EISDIR)
                if flags & os.O_TRUNC:
                    self._truncate(node, 0)
            return self._open_handle(node, flags)

    def open(self, path: str, flags: int) -> int:
        with self._live():
            node = self._lookup(path)
            if node.is_dir and flags & os.O_ACCMODE != os.O_RDONLY:
                raise _err(errno.EISDIR)
            if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
                self._truncate(node, 0)
            return self._open_handle(node, flags)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self._live():
            node = self._node(path, fh)
            if node.is_dir:
                raise _err(errno.EISDIR)
            node.atime = time.time_ns()
            return bytes(node.data[offset:offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._live() as st:
            node = self._node(path, fh)
            if not node.is_reg:
                raise _err(errno.EBADF)
            if fh in self.handles and self.handles[fh][1] & os.O_APPEND:
                offset = len(node.data)
            op = ("w", offset, bytes(data))
            _apply(node.data, op)
            node.log.append(op)
            node.touch(time.time_ns())
            st.counters["writes"] += 1
            st.counters["bytes_written"] += len(data)
            return len(data)

    def fallocate(self, path: str | None, mode: int, offset: int, length: int, fh: int) -> int:
        with self._live():
            node = self._node(path, fh)
            if mode & ~_FALLOC_FL_KEEP_SIZE:
                raise _err(errno.EOPNOTSUPP)
            if not mode & _FALLOC_FL_KEEP_SIZE and offset + length > len(node.data):
                self._truncate(node, offset + length)
            return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        self._close_handle(fh)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self._live() as st:
            node = self._node(path, fh)
            st.counters["fdatasync" if datasync else "fsync"] += 1
            if node.is_dir:
                st.sync_dir(node)
            else:
                st.sync_file(node)
            return 0

    # -- directories

    def opendir(self, path: str) -> int:
        with self._live():
            node = self._lookup(path)
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            return self._open_handle(node, os.O_RDONLY)

    def readdir(self, path: str | None, fh: int) -> list[Any]:
        with self._live() as st:
            node = self._node(path, fh)
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            items: list[Any] = [(".", {"st_mode": node.mode, "st_ino": node.ino}, 0), ("..", {"st_mode": node.mode}, 0)]
            for name, ino in node.entries.items():
                child = st.nodes[ino]
                items.append((name, {"st_mode": child.mode, "st_ino": ino}, 0))
            return items

    def releasedir(self, path: str | None, fh: int) -> int:
        self._close_handle(fh)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self._live() as st:
            node = self._node(path, fh)
            st.counters["fsyncdir"] += 1
            st.sync_dir(node)
            return 0


def _fuse_class() -> Any:
    """mfusepy's FUSE, passing what it drops on libfuse3: rename flags and the open file of f-calls (fchmod,
    ftruncate, futimens with nullpath_ok have no path), and UTIME_NOW/UTIME_OMIT."""
    import mfusepy

    if mfusepy.fuse_version_major != 3:
        raise RuntimeError(f"mfusepy loaded libfuse {mfusepy.fuse_version_major}, not libfuse3")

    class Fuse(mfusepy.FUSE):  # type: ignore[misc]
        def _path(self, path: bytes | None) -> str | None:
            return None if path is None else path.decode(self.encoding, self.errors)

        @staticmethod
        def _fh(fip: Any) -> int | None:
            return fip.contents.fh if fip else None

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return self.operations.rename(self._path(old), self._path(new), flags)  # type: ignore[no-any-return]

        def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
            return self.operations.chmod(self._path(path), mode, self._fh(fip))  # type: ignore[no-any-return]

        def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
            uid = -1 if uid == 0xFFFFFFFF else uid
            gid = -1 if gid == 0xFFFFFFFF else gid
            return self.operations.chown(self._path(path), uid, gid, self._fh(fip))  # type: ignore[no-any-return]

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            return self.operations.truncate(self._path(path), length, self._fh(fip))  # type: ignore[no-any-return]

        def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
            times: tuple[int | None, int | None] | None = None
            if buf:
                now = time.time_ns()
                pair: list[int | None] = []
                for ts in (buf.contents.actime, buf.contents.modtime):
                    if ts.tv_nsec == _UTIME_OMIT:
                        pair.append(None)
                    elif ts.tv_nsec == _UTIME_NOW:
                        pair.append(now)
                    else:
                        pair.append(ts.tv_sec * 10**9 + ts.tv_nsec)
                times = (pair[0], pair[1])
            return self.operations.utimens(self._path(path), times, self._fh(fip))  # type: ignore[no-any-return]

    return Fuse


# --------------------------------------------------------------------------------------------------- the daemon


class Daemon:
    def __init__(self, mountpoint: str, seed: int, reaper: int) -> None:
        self.mountpoint = mountpoint
        self.state = State(seed)
        self.reaper = reaper
        self.fuse = _fuse_class()
        self.ops: Ops | None = None
        self.thread: threading.Thread | None = None
        self.stuck_threads = 0

    def mount(self) -> None:
        ops = Ops(self.state)
        before = set(_mount_devs(self.mountpoint))
        thread = threading.Thread(target=self._serve, args=(ops,), name="fuse", daemon=True)
        self.ops, self.thread = ops, thread
        thread.start()
        deadline = time.monotonic() + WAIT
        while True:
            fresh = set(_mount_devs(self.mountpoint)) - before
            if ops.ready.is_set() and fresh:
                for dev in fresh:
                    os.write(self.reaper, f"{dev}\n".encode())
                return
            if not thread.is_alive():
                raise RuntimeError("libfuse ended before the mount was live (see the log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the mount was not live after {WAIT:g} s")
            time.sleep(0.002)

    def _serve(self, ops: Ops) -> None:
        try:
            self.fuse(ops, self.mountpoint, foreground=True, fsname=FSNAME, subtype=FSNAME, default_permissions=True,
                      attr_timeout=0, entry_timeout=0, negative_timeout=0, use_ino=True)
        except BaseException as exc:  # noqa: BLE001 -- a daemon thread: report, the main thread decides
            if ops.alive:
                traceback.print_exc()
            else:  # a loop left behind by a lazy unmount, ending when its last user let go
                print(f"powercut: a frozen mount's loop ended ({exc!r})", file=sys.stderr, flush=True)

    def unmount(self) -> None:
        """Freeze (every later request fails: the power is gone), unmount, wait for libfuse's loop to end."""
        if self.ops is not None:
            with self.state.lock:
                self.ops.alive = False
        fusermount = shutil.which("fusermount3") or "fusermount3"
        lazy = False
        for args in (["-u"], ["-uz"]):
            if not _mount_devs(self.mountpoint):
                break
            done = subprocess.run([fusermount, *args, self.mountpoint], capture_output=True, text=True)
            if done.returncode == 0:
                break
            lazy = True
            print(f"powercut: fusermount3 {' '.join(args)}: {done.stderr.strip()}", file=sys.stderr, flush=True)
        if self.thread is not None:
            # After a lazy unmount the loop runs on until the last user lets go; it serves a frozen Ops (EIO).
            self.thread.join(timeout=0.2 if lazy else 10)
            if self.thread.is_alive():
                self.stuck_threads += 1
                print("powercut: libfuse loop still running after unmount (mount was busy)", file=sys.stderr,
                      flush=True)
        self.ops = self.thread = None

    def cut(self, keep_prefix: bool) -> dict[str, int]:
        self.unmount()
        with self.state.lock:
            counts = self.state.cut(keep_prefix=keep_prefix)
        self.mount()
        return counts

    def stats(self) -> dict[str, Any]:
        with self.state.lock:
            files, dirs = self.state.unsynced()
            return {**self.state.counters, "unsynced_files": files, "unsynced_dirs": dirs,
                    "inodes": len(self.state.nodes), "open_handles": len(self.ops.handles) if self.ops else 0,
                    "seed": self.state.seed, "stuck_threads": self.stuck_threads}


def _start_reaper(mountpoint: str) -> tuple[int, int]:
    """Fork (before any thread) a process that lazily unmounts this daemon's mounts once the daemon is gone.
    Returns its pid and the pipe end to which the daemon writes each mount's `major:minor` (then `clean` when it has
    unmounted everything itself); the pipe's closing is the signal."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(read_end)
        return pid, write_end
    try:
        os.close(write_end)
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        received = b""
        while chunk := os.read(read_end, 4096):
            received += chunk
        tokens = received.decode().split()
        ours = set() if tokens[-1:] == ["clean"] else set(tokens)
        for dev in _mount_devs(mountpoint):
            if dev in ours:
                subprocess.run([shutil.which("fusermount3") or "fusermount3", "-uz", mountpoint],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(f"powercut reaper: unmounted {mountpoint} ({dev}) after the daemon died", file=sys.stderr,
                      flush=True)
    finally:
        os._exit(0)


def serve(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="powercut_fs.py serve")
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != args.parent:  # the parent died before prctl
        sys.exit("powercut: parent gone")
    os.environ.pop("FUSE_LIBRARY_PATH", None)
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"  # mfusepy would prefer libfuse2 if both are installed
    mountpoint = os.path.realpath(args.mountpoint)
    reaper_pid, reaper = _start_reaper(mountpoint)
    control_in = os.fdopen(0, "rb", buffering=0)
    control_out = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to the log, never into the control channel

    def reply(message: dict[str, Any]) -> None:
        os.write(control_out, (json.dumps(message) + "\n").encode())

    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    daemon = Daemon(mountpoint, args.seed, reaper)
    try:
        daemon.mount()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        reply({"ok": False, "error": f"mount failed: {exc}"})
        daemon.unmount()
        os._exit(1)
    reply({"ok": True, "ready": True, "pid": os.getpid(), "reaper": reaper_pid})
    for raw in iter(control_in.readline, b""):
        try:
            request = json.loads(raw)
            op = request.get("op")
            if op == "cut":
                reply({"ok": True, "counts": daemon.cut(bool(request.get("keep_prefix")))})
            elif op == "stats":
                reply({"ok": True, "stats": daemon.stats()})
            elif op == "stop":
                daemon.unmount()
                if not _mount_devs(mountpoint):
                    os.write(reaper, b"clean\n")  # nothing left for the reaper, whatever mounts come next
                reply({"ok": True})
                break
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001 -- answer, keep serving
            traceback.print_exc()
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    else:  # our parent closed the channel (or died)
        daemon.unmount()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------------- the client


def _wait_gone(pid: int, timeout: float) -> None:
    """Wait until process `pid` (not our child) has exited: absent, or a zombie nobody reaps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as proc_stat:
                if proc_stat.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.002)


class PowerCutFS:
    """A power-cut file system mounted at `mountpoint` by a daemon process; a context manager (start/stop)."""

    def __init__(self, mountpoint: Path, *, seed: int | None = None, log_path: Path | None = None) -> None:
        self.mountpoint = Path(os.path.realpath(mountpoint))
        self.seed = seed if seed is not None else random.randrange(2**32)
        self.log_path = log_path or self.mountpoint.with_name(self.mountpoint.name + ".powercut.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._started = False
        self._reaper: int | None = None

    def __enter__(self) -> "PowerCutFS":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PowerCutFS({str(self.mountpoint)!r}, seed={self.seed})"

    @property
    def pid(self) -> int | None:
        """The daemon's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> "PowerCutFS":
        """Spawn the daemon and wait until the mount is live. Call it from a thread that outlives the mount (the
        daemon gets SIGKILL when the thread that spawned it ends: PR_SET_PDEATHSIG)."""
        if self._proc is not None:
            raise RuntimeError(f"{self!r} is already started")
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"power-cut file system unavailable: {reason}")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if FSTYPE in mounted_at(self.mountpoint):
            raise RuntimeError(f"a power-cut file system is already mounted at {self.mountpoint}")
        self._started = True
        self._buffer = b""
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", os.path.abspath(__file__), "serve", "--mountpoint", str(self.mountpoint),
                 "--seed", str(self.seed), "--parent", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd="/", start_new_session=True)
        atexit.register(self.stop)
        try:
            self._reaper = self._reply(WAIT)["reaper"]
        except BaseException:
            self.stop()
            raise
        return self

    def cut(self, *, keep_prefix: bool = False) -> dict[str, int]:
        """Power cut now: unmount, drop what is not durable, remount serving the durable state. Every process using
        the mount must have ended first. Returns counts (dropped_files, dropped_dirs, dropped_names, restored_names,
        reverted_files, shadowed_dirs, kept_prefix_bytes)."""
        counts: dict[str, int] = self._request({"op": "cut", "keep_prefix": keep_prefix})["counts"]
        return counts

    def stats(self) -> dict[str, Any]:
        """fsync/fdatasync/fsyncdir/writes/cuts/mounts seen, unsynced files and directories now, the seed."""
        result: dict[str, Any] = self._request({"op": "stats"})["stats"]
        return result

    def stop(self) -> None:
        """Unmount and end the daemon; idempotent; raises if a mount could not be removed."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.poll() is None:
                    self._send(proc, {"op": "stop"})
                    self._reply(WAIT, proc)
            except (OSError, RuntimeError):
                pass
            finally:
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None:
                        pipe.close()
                try:
                    proc.wait(timeout=WAIT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        atexit.unregister(self.stop)
        if self._reaper is not None:  # once it has looked, no later mount at this path can be taken for ours
            _wait_gone(self._reaper, 5.0)
            self._reaper = None
        if self._started:
            self._ensure_unmounted()

    # -- plumbing

    def _ensure_unmounted(self) -> None:
        deadline = time.monotonic() + 5.0
        forced = False
        while FSTYPE in mounted_at(self.mountpoint):
            if time.monotonic() > deadline - 4.0 and not forced:  # the reaper had a second; do it ourselves
                forced = True
                subprocess.run([shutil.which("fusermount3") or "fusermount3", "-uz", str(self.mountpoint)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"a power-cut mount is still at {self.mountpoint}; see {self.log_path}")
            time.sleep(0.005)

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._proc is None:
            raise RuntimeError(f"{self!r} is not started")
        self._send(self._proc, message)
        return self._reply(WAIT)

    @staticmethod
    def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def _reply(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
        proc = proc or self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the power-cut daemon did not answer in {timeout:g} s{self._log_tail()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"the power-cut daemon exited ({proc.wait()}){self._log_tail()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"power-cut daemon: {answer.get('error')}{self._log_tail()}")
        return answer

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"\n--- {self.log_path} (tail) ---\n{text[-4000:]}" if text else ""


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        serve(sys.argv[2:])
    else:
        sys.exit("usage: powercut_fs.py serve --mountpoint DIR --seed N --parent PID")
