"""The workspace's files as one bounded list: what `@path` completion and the `find_files` tool search.

`.gitignore` is respected. Inside a git work tree the list is git's own (`git ls-files --cached --others
--exclude-standard`): tracked files plus untracked ones not ignored, exactly what the operator's git shows. The
repository is the operator's and may be hostile, so git runs with an environment built from nothing (no system or global
config, no pager, no prompts, no optional locks) and with the settings that could start a program turned off on the
command line (`core.fsmonitor`, `core.hooksPath`); a repository git refuses (e.g. owned by another user) falls back to
the walk.

Elsewhere the tree is walked with `os.scandir`: `.git` directories are skipped, a symbolic link is listed but never
followed (so a link loop or a link out of the workspace costs nothing), special files (FIFOs, sockets, devices) are
left out and never opened. The root `.gitignore` is honoured in a simple subset: blank lines and `#` comments skipped,
`!` negations ignored (not supported), a trailing `/` matches directories only, a pattern holding a `/` matches the
path from the root (fnmatch, so `*` also crosses `/`), one without matches the name at any depth.

Both ways are bounded by a count and a time budget; a cut list says why (`reason`). Paths are workspace-relative,
POSIX-separated and sorted; a name that is not UTF-8 is shown with U+FFFD where its bad bytes were (SPEC §8).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILES = 100_000
TIME_BUDGET = 5.0  # seconds
OVER_COUNT = "over {:,} files"
TIME_LIMIT = "time limit"


@dataclass
class FileListing:
    paths: list[str] = field(default_factory=list)
    truncated: bool = False
    reason: str | None = None  # why the list is cut: OVER_COUNT or TIME_LIMIT


def list_files(root: Path, *, max_files: int = MAX_FILES, time_budget: float = TIME_BUDGET) -> FileListing:
    """Regular files and symbolic links under `root` (at most `max_files`, within `time_budget` seconds)."""
    deadline = time.monotonic() + time_budget
    listing = _from_git(root, max_files, deadline)
    return listing if listing is not None else _walk(root, max_files, deadline)


def _git_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.devnull, "LANG": "C", "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat", "PAGER": "cat"}


def _from_git(root: Path, max_files: int, deadline: float) -> FileListing | None:
    """git's list, or None when `root` is not in a git work tree (or git is missing or refuses the repository)."""
    git = shutil.which("git")
    if git is None:
        return None
    command = [git, "--no-pager", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=" + os.devnull,
               "-c", "core.untrackedCache=false", "-c", "core.quotePath=false",
               "ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    try:
        proc = subprocess.Popen(command, cwd=root, env=_git_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()  # what git wrote before it was stopped
        timed_out = True
    if proc.returncode != 0 and not timed_out:
        return None
    names = out.split(b"\0")
    if timed_out and names:
        names.pop()  # the last name may be cut in the middle
    base = os.fsencode(root)
    paths: set[str] = set()
    for name in names:
        if not name or name.endswith(b"/"):  # an untracked nested repository is listed as `dir/`
            continue
        if len(paths) % 1024 == 0 and time.monotonic() > deadline:
            timed_out = True
            break
        try:  # a tracked file deleted since, or a submodule (a directory): not listed
            mode = os.lstat(os.path.join(base, name)).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            paths.add(name.decode("utf-8", "replace"))
    return _finish(paths, max_files, TIME_LIMIT if timed_out else None)


def _finish(found: set[str] | list[str], max_files: int, reason: str | None) -> FileListing:
    paths = sorted(found)
    if len(paths) > max_files:
        return FileListing(paths[:max_files], True, reason or OVER_COUNT.format(max_files))
    return FileListing(paths, reason is not None, reason)


class _Ignore:
    """The supported subset of a root `.gitignore` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.patterns: list[tuple[str, bool, bool]] = []  # (pattern, anchored, directories only)
        try:
            text = (root / ".gitignore").read_text("utf-8", "replace")
        except OSError:
            return
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith(("#", "!")):
                continue
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            if line:
                self.patterns.append((line.lstrip("/"), anchored, dir_only))

    def ignored(self, rel: str, name: str, is_dir: bool) -> bool:
        for pattern, anchored, dir_only in self.patterns:
            if dir_only and not is_dir:
                continue
            if fnmatch.fnmatchcase(rel if anchored else name, pattern):
                return True
        return False


def _walk(root: Path, max_files: int, deadline: float) -> FileListing:
    ignore = _Ignore(root)
    found: list[str] = []
    pending: list[tuple[str, str]] = [(os.fspath(root), "")]  # (directory on disk, its path relative to root)
    reason: str | None = None
    while pending and reason is None:
        directory, prefix = pending.pop()
        if time.monotonic() > deadline:
            reason = TIME_LIMIT
            break
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # unreadable, or swapped for something else since it was listed
        with entries:
            for entry in entries:
                rel = prefix + entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    listed = entry.is_symlink() or entry.is_file(follow_symlinks=False)
                except OSError:
                    continue
                if (is_dir and entry.name == ".git") or ignore.ignored(rel, entry.name, is_dir):
                    continue
                if is_dir:
                    pending.append((entry.path, rel + "/"))
                elif listed:
                    found.append(rel)
                    if len(found) > max_files:  # one more than allowed: the list is known to be cut
                        reason = OVER_COUNT.format(max_files)
                        break
    return _finish([_shown(p) for p in found], max_files, reason)


def _shown(path: str) -> str:
    """A walked name as shown: surrogate-escaped bytes (not UTF-8) become U+FFFD, separators `/`."""
    text = os.fsencode(path).decode("utf-8", "replace")
    return text.replace(os.sep, "/") if os.sep != "/" else text
