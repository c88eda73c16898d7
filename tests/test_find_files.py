"""The find_files tool (SPEC §8) on real trees, hostile ones too: its globs, `.gitignore` in a git repository, symlink
loops, 100k files (bounded, completes, never holds the event loop, cancellable), names that are not UTF-8, and patterns
or paths that try to leave the workspace (BAD_ARGUMENTS)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from cairn.app.tools.base import BadArguments, ToolContext, ToolFailure
from cairn.app.tools.find_files import MAX_SHOWN, glob_regex
from cairn.app.tools.registry import ToolRegistry

pytestmark = pytest.mark.anyio

REGISTRY = ToolRegistry.default()
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


async def _no_dispatch(name, args):
    raise AssertionError("find_files never dispatches nested calls")


async def find(ws: Path, **args) -> str:
    tool = REGISTRY.get("find_files")
    assert tool is not None and tool.safety == "read_only"
    ctx = ToolContext(workspace=ws, call_id="call_find_1", turn=1, step=1, parent_call_id=None, dispatch=_no_dispatch)
    return await tool.body(args, ctx)


def tree(root: Path, *paths: str) -> Path:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(path)
    return root


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


# -- globs ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, yes, no", [
    ("*.py", ["a.py", "src/a.py", "src/deep/er/a.py"], ["a.pyc", "src/a.txt"]),  # no `/`: the name at any depth
    ("src/*.py", ["src/a.py"], ["src/x/a.py", "a.py"]),
    ("src/**/*.py", ["src/a.py", "src/x/y/a.py"], ["lib/a.py", "srcs/a.py"]),
    ("**/test_*.py", ["test_a.py", "t/test_b.py"], ["t/a_test.py"]),
    ("docs/*.{md,rst}", ["docs/a.md", "docs/b.rst"], ["docs/c.txt", "docs/x/a.md"]),
    ("[ab]?.txt", ["a1.txt", "x/b2.txt"], ["c1.txt", "a12.txt"]),
    ("build/", ["build/a", "build/x/y.o"], ["builder/a"]),
    ("./src/*.py", ["src/a.py"], []),
])
def test_a_glob_matches_workspace_relative_paths(pattern, yes, no):
    matcher = glob_regex(pattern)
    assert [p for p in yes if not matcher.match(p)] == []
    assert [p for p in no if matcher.match(p)] == []


async def test_find_files_lists_matching_files_sorted_relative_to_the_workspace(ws):
    tree(ws, "src/a.py", "src/pkg/b.py", "src/pkg/c.txt", "tests/test_a.py", "README.md")
    assert (await find(ws, pattern="*.py")).splitlines() == ["src/a.py", "src/pkg/b.py", "tests/test_a.py"]
    assert (await find(ws, pattern="src/*.py")).splitlines() == ["src/a.py"]
    assert (await find(ws, pattern="*.py", path="src/pkg")).splitlines() == ["src/pkg/b.py"]  # still workspace-relative
    assert await find(ws, pattern="*.rs") == "no files match '*.rs' in ."


@pytest.mark.parametrize("args", [
    {"pattern": "../*"}, {"pattern": "/etc/*"}, {"pattern": "src/../../x"}, {"pattern": "./../*"},
    {"pattern": "*", "path": "../"}, {"pattern": "*", "path": "/etc"}, {"pattern": ""}, {"pattern": 3},
])
async def test_a_pattern_or_path_leaving_the_workspace_is_bad_arguments(ws, args):
    tree(ws, "a.txt")
    with pytest.raises(BadArguments):
        await find(ws, **args)


async def test_a_missing_path_or_a_file_as_path_is_a_readable_error(ws):
    tree(ws, "a.txt")
    with pytest.raises(ToolFailure, match="no such directory: nope"):
        await find(ws, pattern="*", path="nope")
    with pytest.raises(ToolFailure, match="not a directory: a.txt"):
        await find(ws, pattern="*", path="a.txt")


# -- hostile trees ----------------------------------------------------------------------------------------------------

async def test_symlink_loops_are_listed_never_followed(ws, tmp_path):
    tree(ws, "a/f.txt")
    os.symlink("..", ws / "a" / "up")  # a/up -> the workspace: following it would never end
    os.symlink("loop", ws / "loop")  # a link to itself
    (tmp_path / "outside").mkdir()
    tree(tmp_path / "outside", "secret.txt")
    os.symlink(tmp_path / "outside", ws / "out")  # a link out of the workspace
    assert (await find(ws, pattern="*")).splitlines() == ["a/f.txt", "a/up", "loop", "out"]
    assert "secret" not in await find(ws, pattern="**")


async def test_names_that_are_not_utf8_are_shown_with_a_replacement_character(ws):
    name = os.path.join(os.fsencode(ws), b"caf\xe9.txt")
    with open(name, "wb") as f:
        f.write(b"x")
    out = await find(ws, pattern="caf*")
    assert out == "caf\ufffd.txt"
    out.encode("utf-8")  # (no lone surrogate: it goes to the log, the provider and the terminal as it is)


@needs_git
async def test_gitignore_is_respected_in_a_git_repository(ws):
    subprocess.run(["git", "init", "--quiet", str(ws)], check=True,
                   env={"PATH": os.environ["PATH"], "HOME": str(ws), "GIT_CONFIG_NOSYSTEM": "1"})
    tree(ws, ".gitignore", "src/a.py", "build/gen.py", "src/debug.log", "src/sub/.gitignore", "src/sub/keep.py",
         "src/sub/skip.py")
    (ws / ".gitignore").write_text("build/\n*.log\n")
    (ws / "src/sub/.gitignore").write_text("skip.py\n")  # a nested .gitignore counts too (git's own list)
    assert (await find(ws, pattern="*.py")).splitlines() == ["src/a.py", "src/sub/keep.py"]
    assert await find(ws, pattern="*.log") == "no files match '*.log' in ."
    assert (await find(ws, pattern="**", path="src")).splitlines() == ["src/a.py", "src/sub/.gitignore",
                                                                       "src/sub/keep.py"]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """101,000 files in 101 directories: past the listing's 100,000-file bound."""
    root = tmp_path_factory.mktemp("big").resolve()
    for d in range(101):
        sub = root / f"d{d:03d}"
        sub.mkdir()
        for i in range(1000):
            os.close(os.open(sub / f"f{i:04d}.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    return root


async def test_100k_files_complete_bounded_and_say_what_was_left_out(big):
    out = await find(big, pattern="*.txt")
    lines = out.splitlines()
    shown = [line for line in lines if line.startswith("d")]
    assert len(shown) == MAX_SHOWN and shown == sorted(shown)
    more = next(line for line in lines if line.startswith("… and "))
    assert more.endswith("more (narrow the pattern or the path)") and int(more.split()[2].replace(",", "")) > 0
    assert lines[-1].startswith("[the listing stopped early (")  # over 100,000 files, or its time budget
    assert len(out) < 32 * 1024


async def test_find_files_never_holds_the_event_loop_and_a_cancelled_call_returns_at_once(big):
    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await anyio.sleep(0.001)
            ticks += 1

    async def search() -> None:
        await find(big, pattern="*.txt")
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(search)
        group.start_soon(ticker)
    assert ticks > 0  # the loop ran other tasks while the listing was made

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(search)
            await anyio.sleep(0)  # the call is running in its thread
            scope.cancel()
    assert scope.cancelled_caught
