"""Workspace snapshots in a shadow git repository (SPEC §9 rev 3, "Workspace snapshots").

At each turn's start, before each side-effecting `run_command` and at each turn's end, Cairn records the whole workspace
as a git tree (what `git add -A` would take, `.gitignore` honoured, files over the size limit left out and listed) in a
repository of its own under `CAIRN_HOME/snapshots/` — its `GIT_DIR` and index outside the workspace, never the user's
repository, config, hooks or credentials. A rewind then puts the workspace back to a turn's start tree, commands'
changes included.

Git is run with an environment built from nothing (PATH, a private HOME, no system or global config, no hooks, no
credential helper, no signing, no prompts), so a user's git setup changes nothing and is changed by nothing. Every call
has a time budget: a workspace too large to snapshot in it turns snapshots off for the session (the caller says so),
never a hang.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE = 10 * 1024 * 1024  # bytes; larger files are left out of snapshots and listed
DEFAULT_BUDGET = 10.0  # seconds a snapshot may take before snapshots are turned off for the session
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class SnapshotUnavailable(Exception):
    """Snapshots cannot be taken here (no git, a git error, over the time budget); the message says which."""


@dataclass
class Snapshot:
    tree: str
    left_out: list[str] = field(default_factory=list)  # files over the size limit, not in the tree


def git_path() -> str | None:
    return shutil.which("git")


class ShadowRepo:
    """The shadow repository of one workspace: `home/snapshots/<sha of the workspace path>.git`."""

    def __init__(self, home: Path, workspace: Path, session_id: str = "shared", budget: float = DEFAULT_BUDGET,
                 max_file: int = MAX_FILE) -> None:
        self.workspace = Path(workspace).resolve()
        key = hashlib.sha256(str(self.workspace).encode("utf-8", "surrogateescape")).hexdigest()[:20]
        self.git_dir = Path(home) / "snapshots" / f"{key}.git"
        # each session its own index (sessions of one workspace share the objects, never a lock); the session is
        # locked by its one writer, so a lock file left on its index is what a SIGKILL mid-snapshot left: stale
        self.index = self.git_dir / f"index-{session_id}"
        self._stale_checked = False
        self.budget, self.max_file = budget, max_file
        self.git = git_path()
        self._last_tree: str | None = None

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

    def run(self, *args: str, stdin: bytes | None = None, budget: float | None = None) -> bytes:
        if self.git is None:
            raise SnapshotUnavailable("git is not installed (not on PATH): rewind uses the file tools' before-images only")
        command = [self.git, "-c", "core.hooksPath=" + os.devnull, "-c", "credential.helper=",
                   "-c", "commit.gpgSign=false", "-c", "core.autocrlf=false", "-c", "core.fsmonitor=false",
                   "-c", "core.quotePath=false", "-c", "gc.auto=0", "-c", "core.untrackedCache=true", *args]
        try:
            done = subprocess.run(command, env=self._env(), cwd=self.workspace, input=stdin, capture_output=True,
                                  timeout=budget or self.budget)
        except subprocess.TimeoutExpired:
            raise SnapshotUnavailable(
                f"a workspace snapshot took over {budget or self.budget:g} s (the workspace is too large): "
                "snapshots are off for this session") from None
        except OSError as e:
            raise SnapshotUnavailable(f"git could not be run: {e.strerror or e}") from None
        if done.returncode != 0:
            first = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["(no message)"])[0]
            raise SnapshotUnavailable(f"git {args[0]} failed: {first[:200]}")
        return done.stdout

    def ensure(self) -> None:
        """Create the shadow repository (private, bare of hooks) on first use."""
        if (self.git_dir / "HEAD").exists():
            return
        self.git_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run("init", "--quiet")  # at GIT_DIR (the environment names it), its work tree the workspace
        hooks = self.git_dir / "hooks"
        if hooks.is_dir():
            shutil.rmtree(hooks, ignore_errors=True)
        (self.git_dir / "info").mkdir(exist_ok=True)

    # -- snapshots --------------------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The workspace now, as a tree id in the shadow repository."""
        self.ensure()
        if not self._stale_checked:
            self._stale_checked = True
            Path(f"{self.index}.lock").unlink(missing_ok=True)
            if not self.index.exists():  # start from another session's index: its file stats spare re-hashing
                others = sorted(self.git_dir.glob("index-*[!k]"), key=lambda p: p.stat().st_mtime, reverse=True)
                if others:
                    with contextlib.suppress(OSError):
                        shutil.copyfile(others[0], self.index)
        # --verbose names what the index took in ("add 'path'", "remove 'path'"): nothing named and a tree already
        # known means the workspace is as it was, so no write-tree (a command mid-turn waits only for `git add`)
        said = self.run("add", "-A", "--verbose", "--ignore-errors", "--", ".").decode("utf-8", "surrogateescape")
        if not said.strip() and self._last_tree is not None:
            return Snapshot(self._last_tree)
        added = [line[5:-1] for line in said.splitlines() if line.startswith("add '") and line.endswith("'")]
        left_out = self._leave_out_large(added)
        tree = self.run("write-tree").decode().strip()
        self._last_tree = tree
        return Snapshot(tree, left_out)

    def _leave_out_large(self, changed: list[str]) -> list[str]:
        """Files over the size limit among those just added: out of the index, and excluded from now on (the shadow
        repository's own info/exclude)."""
        large = []
        for path in changed:
            try:
                if (self.workspace / path).stat().st_size > self.max_file:
                    large.append(path)
            except OSError:
                continue
        if large:
            self.run("rm", "--cached", "--quiet", "--ignore-unmatch", "--pathspec-from-file=-", "--pathspec-file-nul",
                     stdin=b"\0".join(p.encode("utf-8", "surrogateescape") for p in large))
            exclude = self.git_dir / "info" / "exclude"
            with open(exclude, "a", encoding="utf-8", errors="surrogateescape") as f:
                for path in large:
                    f.write("/" + path.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")
                            .replace("[", "\\[") + "\n")
        return large

    def changed_between(self, old: str, new: str) -> list[str]:
        """Paths that differ between two trees."""
        out = self.run("diff-tree", "-r", "-z", "--name-only", "--no-renames", old, new)
        return sorted(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p)

    def restore(self, tree: str) -> None:
        """Put the workspace back to `tree`: changed files rewritten, files added since removed; files the snapshots
        never held (ignored, over the size limit) are left alone."""
        self.snapshot()  # the index holds the workspace now, so read-tree knows what to remove
        self.run("read-tree", "-u", "--reset", tree)
        self._last_tree = tree

    def keep_only(self, trees: set[str]) -> None:
        """Keep the trees still needed (as refs) and drop everything else (`cairn rm`)."""
        if not (self.git_dir / "HEAD").exists():
            return
        refs = self.run("for-each-ref", "--format=%(refname)", "refs/cairn/").decode().split()
        lines = [f"delete {ref}" for ref in refs] + [f"create refs/cairn/{t} {t}" for t in sorted(trees)]
        if lines:
            self.run("update-ref", "--stdin", stdin=("\n".join(lines) + "\n").encode())
        self.run("gc", "--quiet", "--prune=now", budget=120)
