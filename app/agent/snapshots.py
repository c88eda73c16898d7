"""Workspace snapshots in a shadow git repository (SPEC §9 rev 3, §10 rev 4).

At each turn's start, before each side-effecting `run_command`, at each turn's end and around each rewind, Cairn records
the whole workspace as a git tree (what `git add -A` would take, `.gitignore` honoured) in a repository of its own under
`CAIRN_HOME/snapshots/` — its `GIT_DIR` and index outside the workspace, never the user's repository, config, hooks or
credentials.

What a tree leaves out is recorded too (rev 4): a manifest blob in the same repository lists every path the snapshot did
not take and why — ignored, over the size limit, a nested repository, a special file, holding a configured secret,
unreadable — with its type, size and mtime. A rewind deletes a path only when a tree says it did not exist and the
manifest does not say it was left out, so a file Cairn never held is never destroyed.

The store obeys SPEC §5 like the log: git runs under umask 077 (directories 0700, files 0600 or stricter); a file over
the size limit or holding a secret is never written into it (checked before it is added, not removed after); the
objects of a snapshot are fsync'd, their directories too, before the snapshot returns, so the event naming its tree
never reaches the disk before the tree does.

Git is run with an environment built from nothing (PATH, a private HOME, no system or global config, no hooks, no
credential helper, no signing, no prompts), so a user's git setup changes nothing and is changed by nothing. Every call
has a time budget: a workspace too large to snapshot in it turns snapshots off for the session (the caller says so).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgspec

from cairn.persistence.locks import ensure_private_dir, fsync_dir

MAX_FILE = 10 * 1024 * 1024  # bytes; larger files are left out of snapshots and listed
# more new files than this in one snapshot (a workspace's first): git writes them without an fsync each, and one
# syncfs of the store's file system makes them durable together (10,000 fsyncs took 27 s here, one syncfs a fraction)
BULK = 256
SYNC_DIRS = 8  # more object directories than this to sync after a snapshot: one syncfs instead (P12: −9%)
DEFAULT_BUDGET = 10.0  # seconds a snapshot may take before snapshots are turned off for the session

# why a path is not in a snapshot's tree (the manifest's `reason`)
IGNORED = "ignored by .gitignore"
TOO_LARGE = "over the size limit"
NESTED = "a nested repository"
SPECIAL = "a special file"
SECRET = "holds a configured secret"
UNREADABLE = "unreadable"
REPLACED = "a directory now"  # a tracked file replaced by a directory: dropped from the index, not listed

# git modes of the entries a tree holds
REGULAR, EXECUTABLE, SYMLINK, GITLINK = "100644", "100755", "120000", "160000"


class SnapshotUnavailable(Exception):
    """Snapshots cannot be taken here (no git, a git error, over the time budget); the message says which."""


class LeftOut(msgspec.Struct, array_like=True, gc=False):
    """One path a snapshot did not take: `path` (a directory ends in "/"), why, its type, size, mtime (ns) and
    permission bits (a chmod changes no mtime)."""

    path: str
    reason: str
    kind: str  # file, dir, link, special
    size: int
    mtime_ns: int
    mode: int = 0


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(list[LeftOut])


@dataclass
class Snapshot:
    tree: str
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): files the operator should hear of
    manifest: str | None = None  # blob id of the full list of what the tree left out


def git_path() -> str | None:
    return shutil.which("git")


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob of `data` (so a file on disk is compared with a tree without running git)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def state_of(path: Path) -> tuple[str, str] | None:
    """(git mode, blob id) of what `path` holds now, never following a symbolic link; None when nothing is there.
    Raises OSError for what a tree cannot hold (a directory, a special file, unreadable)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return SYMLINK, git_blob_id(os.fsencode(os.readlink(path)))
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{path.name} is a directory now") if stat.S_ISDIR(st.st_mode) else \
            OSError(f"{path.name} is a special file now")
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
        data = f.read()
    return (EXECUTABLE if st.st_mode & stat.S_IXUSR else REGULAR), git_blob_id(data)


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "special"


class ShadowRepo:
    """The shadow repository of one workspace: `home/snapshots/<sha of the workspace path>.git`."""

    def __init__(self, home: Path, workspace: Path, session_id: str = "shared", budget: float = DEFAULT_BUDGET,
                 max_file: int = MAX_FILE, holds_secret: Callable[[bytes], bool] | None = None) -> None:
        self.workspace = Path(workspace).resolve()
        key = hashlib.sha256(str(self.workspace).encode("utf-8", "surrogateescape")).hexdigest()[:20]
        self.git_dir = Path(os.path.abspath(home)) / "snapshots" / f"{key}.git"  # git runs in the workspace
        # each session its own index (sessions of one workspace share the objects, never a lock); the session is
        # locked by its one writer, so a lock file left on its index is what a SIGKILL mid-snapshot left: stale
        self.index = self.git_dir / f"index-{session_id}"
        self._stale_checked = False
        self.budget, self.max_file = budget, max_file
        self.git = git_path()
        self._last_tree: str | None = None
        self._last_manifest: str | None = None
        self.holds_secret = holds_secret  # the session's check: such content is never stored (SPEC §5)
        self._manifests: dict[str, list[LeftOut]] = {}
        self._bulk = False  # this snapshot writes many objects: one syncfs instead of an fsync per object
        self._trees: dict[str, dict[str, tuple[str, str]]] = {}
        self._syncfs: bool | None = None  # does syncfs reach the disk where the store lives (not on FUSE)

    # -- running git ------------------------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.git_dir), "LANG": "C", "LC_ALL": "C",
            "GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.workspace),
            "GIT_INDEX_FILE": str(self.index),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "cairn", "GIT_AUTHOR_EMAIL": "cairn@localhost",
            "GIT_COMMITTER_NAME": "cairn", "GIT_COMMITTER_EMAIL": "cairn@localhost",
        }

    def _command(self, args: tuple[str, ...]) -> list[str]:
        if self.git is None:
            raise SnapshotUnavailable("git is not installed (not on PATH): rewind uses the file tools' before-images only")
        return [self.git, "-c", "core.hooksPath=" + os.devnull, "-c", "credential.helper=",
                "-c", "commit.gpgSign=false", "-c", "core.autocrlf=false", "-c", "core.fsmonitor=false",
                "-c", "core.quotePath=false", "-c", "gc.auto=0", "-c", "core.untrackedCache=true",
                "-c", "core.fsync=" + ("none" if self._bulk else "loose-object"), "-c", "core.fsyncMethod=fsync",
                "-c", "core.symlinks=true", *args]

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(self._command(args), env=self._env(), cwd=self.workspace, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, umask=0o077)
        except OSError as e:
            raise SnapshotUnavailable(f"git could not be run: {e.strerror or e}") from None

    def _finish(self, proc: subprocess.Popen[bytes], name: str, stdin: bytes | None = None,
                budget: float | None = None) -> bytes:
        try:
            out, err = proc.communicate(stdin, timeout=budget or self.budget)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise SnapshotUnavailable(
                f"a workspace snapshot took over {budget or self.budget:g} s (the workspace is too large): "
                "snapshots are off for this session") from None
        if proc.returncode != 0:
            first = (err.decode("utf-8", "replace").strip().splitlines() or ["(no message)"])[0]
            raise SnapshotUnavailable(f"git {name} failed: {first[:200]}")
        return out

    def run(self, *args: str, stdin: bytes | None = None, budget: float | None = None) -> bytes:
        return self._finish(self._spawn(*args), args[0], stdin, budget)

    def ensure(self) -> None:
        """Create the shadow repository (private, bare of hooks) on first use; keep its directories private."""
        if not (self.git_dir / "HEAD").exists():
            ensure_private_dir(self.git_dir.parent)
            self.run("init", "--quiet")  # at GIT_DIR (the environment names it), its work tree the workspace
            hooks = self.git_dir / "hooks"
            if hooks.is_dir():
                shutil.rmtree(hooks, ignore_errors=True)
            (self.git_dir / "info").mkdir(mode=0o700, exist_ok=True)
            _sync_tree(self.git_dir)  # git syncs objects, not what init made: a power cut must not take the repository
            fsync_dir(self.git_dir.parent)
        for directory in (self.git_dir.parent, self.git_dir):  # 0700 whatever the umask was when they were made
            with contextlib.suppress(OSError):
                if stat.S_IMODE(os.stat(directory).st_mode) != 0o700:
                    os.chmod(directory, 0o700)

    # -- snapshots --------------------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The workspace now, as a tree id in the shadow repository, with the manifest of what it left out."""
        self.ensure()
        if not self._stale_checked:
            self._stale_checked = True
            Path(f"{self.index}.lock").unlink(missing_ok=True)
            if not _index_whole(self.index):  # git never syncs an index: a power cut can leave it short or empty
                self.index.unlink(missing_ok=True)
            if not self.index.exists():  # start from another session's index: its file stats spare re-hashing
                others = sorted(self.git_dir.glob("index-*[!k]"), key=lambda p: p.stat().st_mtime, reverse=True)
                others = [other for other in others if _index_whole(other)]
                if others:
                    with contextlib.suppress(OSError):
                        shutil.copyfile(others[0], self.index)
                        os.chmod(self.index, 0o600)
        started = time.time_ns()
        # what changed since the index last looked (new, modified, deleted) and what is ignored, side by side
        changed = self._spawn("ls-files", "-z", "--others", "--modified", "--deleted", "--exclude-standard")
        ignored = self._spawn("ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
        candidates = _paths(self._finish(changed, "ls-files"))
        left: list[LeftOut] = [self._entry(p, IGNORED) for p in _paths(self._finish(ignored, "ls-files"))]
        take, drop = [], []
        for path in dict.fromkeys(candidates):
            why = self._why_left_out(path)
            if why is None:
                take.append(path)
            else:
                if why != REPLACED:
                    left.append(self._entry(path, why))
                if not path.endswith("/"):
                    drop.append(path)  # out of the index too, if an earlier snapshot took it
        self._bulk = len(take) > BULK and self._syncfs_works()
        try:
            if drop:  # first: a file that became a directory leaves the index before what the directory holds comes in
                self._update_index("--force-remove", paths=drop)
            if take:  # --replace: a directory that became a file (or the reverse) replaces the entries in its way
                self._update_index("--add", "--remove", "--replace", paths=take)
            tree = self._last_tree
            if take or drop or tree is None:
                tree = self.run("write-tree").decode().strip()
            if self._bulk:
                _syncfs(self.git_dir / "objects")
        finally:
            self._bulk = False
        left.sort(key=lambda e: e.path)
        manifest = self._write_manifest(left)
        if take or drop or (tree, manifest) != (self._last_tree, self._last_manifest):
            self._sync_objects(started)  # (nothing written, and both already synced by this process: no fsync, P14)
        self._last_tree, self._last_manifest = tree, manifest
        told = [(e.path, e.reason) for e in left if e.reason in (TOO_LARGE, SECRET, UNREADABLE, SPECIAL)]
        return Snapshot(tree, told, manifest)

    def _why_left_out(self, path: str) -> str | None:
        """Why a changed path stays out of the tree (None: it goes in). Size and secrets are checked before git sees
        the file, so nothing over the limit or holding a secret is ever written into the store."""
        if path.endswith("/"):
            return NESTED  # git lists a directory holding its own repository as one entry, and never looks inside
        full = self.workspace / path
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            return None  # deleted (or a parent is a file now): out of the index
        except OSError:
            return UNREADABLE
        if stat.S_ISLNK(st.st_mode):
            return None
        if stat.S_ISDIR(st.st_mode):
            # a tracked file that became a directory: out of the index (what it holds is listed on its own)
            return NESTED if (full / ".git").exists() else REPLACED
        if not stat.S_ISREG(st.st_mode):
            return SPECIAL
        if st.st_size > self.max_file:
            return TOO_LARGE
        if self.holds_secret is not None:
            try:
                with open(full, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
                    data = f.read(self.max_file + 1)
            except OSError:
                return UNREADABLE
            if self.holds_secret(data):
                return SECRET
        elif not os.access(full, os.R_OK):
            return UNREADABLE
        return None

    def _entry(self, path: str, reason: str) -> LeftOut:
        try:
            st = os.lstat(self.workspace / path.rstrip("/"))
            return LeftOut(path, reason, _kind(st), st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
        except OSError:
            return LeftOut(path, reason, "gone", 0, 0)

    def _update_index(self, *flags: str, paths: list[str]) -> None:
        data = b"\0".join(p.encode("utf-8", "surrogateescape") for p in paths) + b"\0"
        self.run("update-index", "-z", *flags, "--stdin", stdin=data)

    def _write_manifest(self, left: list[LeftOut]) -> str:
        """The manifest as a blob of the shadow repository (a loose object, fsync'd), its id returned."""
        data = _manifest_encoder.encode(left)
        blob = git_blob_id(data)
        if blob == self._last_manifest:
            return blob
        self._manifests[blob] = left
        folder = self.git_dir / "objects" / blob[:2]
        target = folder / blob[2:]
        if target.exists():
            return blob
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f"tmp-{os.getpid()}-{blob[2:10]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, zlib.compress(b"blob %d\0" % len(data) + data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        return blob

    def _sync_objects(self, since_ns: int) -> None:
        """fsync the object directories that gained a file since `since_ns` (git fsyncs each object file, not the
        directory entry that names it): a power cut never leaves the log naming a tree that is not on disk."""
        objects = self.git_dir / "objects"
        dirs = [objects]
        with os.scandir(objects) as found:
            for entry in found:
                with contextlib.suppress(OSError):
                    if len(entry.name) == 2 and entry.stat(follow_symlinks=False).st_mtime_ns >= since_ns - 10_000_000:
                        dirs.append(Path(entry.path))
        if len(dirs) > SYNC_DIRS and self._syncfs_works():  # one syncfs costs less than many directory fsyncs
            _syncfs(objects)
            return
        for directory in dirs:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _syncfs_works(self) -> bool:
        if self._syncfs is None:
            self._syncfs = not file_system_type(self.git_dir).startswith("fuse")
        return self._syncfs

    # -- reading snapshots back -------------------------------------------------------------------------------------

    def manifest(self, blob: str) -> list[LeftOut]:
        if blob not in self._manifests:
            self._manifests[blob] = _manifest_decoder.decode(self.run("cat-file", "blob", blob))
        return self._manifests[blob]

    def entries(self, tree: str) -> dict[str, tuple[str, str]]:
        """path → (mode, blob id) of every entry of `tree` (nested repositories as mode 160000)."""
        if tree not in self._trees:
            found = {}
            for line in self.run("ls-tree", "-r", "-z", "--full-tree", tree).decode("utf-8", "surrogateescape").split("\0"):
                if "\t" in line:
                    meta, path = line.split("\t", 1)
                    mode, _, blob = meta.split()
                    found[path] = (mode, blob)
            self._trees[tree] = found
        return self._trees[tree]

    def blob(self, blob: str) -> bytes:
        return self.run("cat-file", "blob", blob)

    def changed_between(self, old: str, new: str) -> list[str]:
        """Paths that differ between two trees."""
        if old == new:
            return []
        out = self.run("diff-tree", "-r", "-z", "--name-only", "--no-renames", old, new)
        return sorted(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p)

    def keep_only(self, trees: set[str]) -> None:
        """Keep the trees and manifests still needed (as refs) and drop everything else (`cairn rm`)."""
        if not (self.git_dir / "HEAD").exists():
            return
        refs = self.run("for-each-ref", "--format=%(refname)", "refs/cairn/").decode().split()
        lines = [f"delete {ref}" for ref in refs] + [f"create refs/cairn/{t} {t}" for t in sorted(trees)]
        if lines:
            self.run("update-ref", "--stdin", stdin=("\n".join(lines) + "\n").encode())
        self.run("gc", "--quiet", "--prune=now", budget=120)


def _syncfs(directory: Path) -> None:
    """Flush everything written to the file system holding `directory` (Linux syncfs; elsewhere, sync)."""
    import ctypes
    import ctypes.util

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def file_system_type(path: Path) -> str:
    """The type of the file system holding `path` ("ext4", "fuse.sshfs", …; "" when unknown), from the mount table.
    Linux does not pass syncfs on to a FUSE server, so there only per-file fsyncs make a write durable."""
    try:
        device = os.stat(path).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if "-" in fields and fields[2] == f"{os.major(device)}:{os.minor(device)}":
                    return fields[fields.index("-") + 1]
    except (OSError, IndexError, ValueError):
        pass
    return ""


def _index_whole(index: Path) -> bool:
    """Whether a git index file is complete: its signature, and the SHA-1 of everything before its last 20 bytes
    matching them (all zeros when git skipped the hash). A missing index counts as whole (git starts afresh)."""
    try:
        data = index.read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if len(data) < 32 or not data.startswith(b"DIRC"):
        return False
    trailer = data[-20:]
    return trailer == bytes(20) or hashlib.sha1(data[:-20]).digest() == trailer


def _sync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (deepest first), then `root` itself."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(Path(folder))


def _paths(out: bytes) -> list[str]:
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
