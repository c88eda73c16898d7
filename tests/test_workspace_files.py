"""The workspace file listing (app/tools/workspace_files.py) on hostile trees: symlink loops, 100k files, names that are
not UTF-8, `.gitignore` in a git repository and outside one, links out of the workspace, special files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cairn.app.tools.workspace_files import list_files

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git_init(path: Path) -> None:
    subprocess.run(["git", "init", "--quiet", str(path)], check=True, env={"PATH": os.environ["PATH"],
                   "HOME": str(path), "GIT_CONFIG_NOSYSTEM": "1"})


def test_symlink_loop_is_listed_not_followed(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("x")
    os.symlink("..", tmp_path / "a" / "up")  # a/up -> the root: following it would never end
    os.symlink("loop", tmp_path / "loop")  # a link to itself
    listing = list_files(tmp_path)
    assert listing.paths == ["a/f.txt", "a/up", "loop"]
    assert not listing.truncated and listing.reason is None


def test_outside_symlink_is_listed_but_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "secret.txt").write_text("s")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(outside, ws / "elsewhere")
    (ws / "mine.txt").write_text("m")
    assert list_files(ws).paths == ["elsewhere", "mine.txt"]


def test_special_files_are_left_out(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    assert list_files(tmp_path).paths == ["file"]


def make_many(root: Path, count: int) -> None:
    for d in range(count // 1000):
        sub = root / f"d{d:03d}"
        sub.mkdir()
        for i in range(1000):
            os.close(os.open(sub / f"f{i:04d}", os.O_CREAT | os.O_WRONLY, 0o644))


def test_100k_files_are_cut_at_the_limit(tmp_path: Path) -> None:
    make_many(tmp_path, 101_000)
    listing = list_files(tmp_path, time_budget=120)
    assert listing.truncated and listing.reason == "over 100,000 files"
    assert len(listing.paths) == 100_000
    assert listing.paths == sorted(listing.paths)


def test_100k_files_exactly_fit(tmp_path: Path) -> None:
    make_many(tmp_path, 100_000)
    listing = list_files(tmp_path, time_budget=120)
    assert not listing.truncated and listing.reason is None and len(listing.paths) == 100_000


def test_time_limit_cuts_the_walk(tmp_path: Path) -> None:
    make_many(tmp_path, 5_000)
    listing = list_files(tmp_path, time_budget=0)
    assert listing.truncated and listing.reason == "time limit"
    assert len(listing.paths) < 5_000


@needs_git
def test_100k_files_in_a_git_repository(tmp_path: Path) -> None:
    git_init(tmp_path)
    make_many(tmp_path, 101_000)
    listing = list_files(tmp_path, time_budget=120)
    assert listing.truncated and listing.reason == "over 100,000 files" and len(listing.paths) == 100_000


def test_non_utf8_names_are_shown_with_replacement(tmp_path: Path) -> None:
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"d\xff"))
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"d\xff", b"in.txt"), os.O_CREAT | os.O_WRONLY, 0o644))
    listing = list_files(tmp_path)
    assert listing.paths == ["caf\ufffd.txt", "d\ufffd/in.txt"]
    for path in listing.paths:
        path.encode("utf-8")  # no lone surrogates: the log and the terminal can take it


@needs_git
def test_non_utf8_names_in_a_git_repository(tmp_path: Path) -> None:
    git_init(tmp_path)
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), os.O_CREAT | os.O_WRONLY, 0o644))
    assert list_files(tmp_path).paths == ["caf\ufffd.txt"]


@needs_git
def test_gitignore_is_respected_in_a_git_repository(tmp_path: Path) -> None:
    git_init(tmp_path)
    (tmp_path / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out.bin").write_text("x")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x")
    (tmp_path / "src" / "debug.log").write_text("x")
    (tmp_path / "keep.log").write_text("x")  # git's own negation works in a repository
    (tmp_path / "nested").mkdir()
    git_init(tmp_path / "nested")  # an untracked nested repository: not a file
    (tmp_path / "nested" / "inner.txt").write_text("x")
    assert list_files(tmp_path).paths == [".gitignore", "keep.log", "src/a.py"]
    # from a subdirectory of the work tree: relative to it
    assert list_files(tmp_path / "src").paths == ["a.py"]


@needs_git
def test_hostile_repository_config_runs_nothing(tmp_path: Path) -> None:
    git_init(tmp_path)
    marker = tmp_path.parent / "ran"
    with open(tmp_path / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = touch {marker}\n\tpager = touch {marker}\n")
    (tmp_path / "a.txt").write_text("x")
    assert list_files(tmp_path).paths == ["a.txt"]
    assert not marker.exists()


def test_root_gitignore_subset_outside_git(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("# comment\n\nnode_modules/\n*.pyc\n/top.txt\ndocs/*.tmp\n")
    for rel in ["node_modules/x.js", "a/node_modules/y.js", "a/b.pyc", "a/b.py", "top.txt", "a/top.txt",
                "docs/x.tmp", "docs/x.md", ".git/config"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert list_files(tmp_path).paths == [".gitignore", "a/b.py", "a/top.txt", "docs/x.md"]
