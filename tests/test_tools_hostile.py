"""The built-in tools against hostile names, special files, patterns, symlink races and a killed Cairn (SPEC §8 rev 2).

Real files, FIFOs, symlinks, threads and child processes throughout; the tool bodies are called directly, as in
tests/test_tools.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest
from waiting import alive, wait_dead, wait_sync

from cairn.app.tools import files
from cairn.app.tools.base import BadArguments, ToolContext, ToolFailure
from cairn.app.tools.registry import ToolRegistry

pytestmark = pytest.mark.anyio

REGISTRY = ToolRegistry.default()


async def _no_dispatch(name, args):
    raise AssertionError("these tools never dispatch nested calls")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def ctx_for(ws: Path, progress=lambda pid, started: None) -> ToolContext:
    return ToolContext(workspace=ws, call_id="call_hostile", turn=1, step=1, parent_call_id=None,
                       dispatch=_no_dispatch, progress=progress)


async def call(ws: Path, name: str, **args) -> str:
    return await REGISTRY.get(name).body(args, ctx_for(ws))


def wait_for_line(path: Path) -> str:
    """The file's first line once it has been written in full (the writer ends it with a newline)."""
    return wait_sync(lambda: path.read_text().endswith("\n") and path.read_text(), f"{path} to be written").strip()


def make_bytes_name(directory: Path, name: bytes) -> bytes:
    return os.path.join(os.fsencode(directory), name)


# --- file names that are not UTF-8 ------------------------------------------------------------------------------------


async def test_list_dir_shows_non_utf8_names_with_replacement_characters(ws: Path):
    with open(make_bytes_name(ws, b"caf\xe9.txt"), "wb") as f:
        f.write(b"abc")
    os.mkdir(make_bytes_name(ws, b"d\xff\xfe"))
    out = await call(ws, "list_dir")
    assert out == "d\ufffd\ufffd/\ncaf\ufffd.txt  3 bytes"
    out.encode("utf-8")  # no lone surrogate left for the log, the terminal or the provider


async def test_search_text_shows_non_utf8_names_with_replacement_characters(ws: Path):
    os.mkdir(make_bytes_name(ws, b"d\xff"))
    with open(make_bytes_name(ws, b"d\xff/n\xfe.txt"), "wb") as f:
        f.write(b"a needle here\nand caf\xe9 too\n")
    out = await call(ws, "search_text", pattern="needle|caf")
    assert out == "d\ufffd/n\ufffd.txt:1: a needle here\nd\ufffd/n\ufffd.txt:2: and caf\ufffd too"
    out.encode("utf-8")


async def test_lone_surrogates_from_the_model_never_crash_a_tool(ws: Path):
    assert await call(ws, "write_file", path="s.txt", content="a\ud800b") == "wrote 5 bytes to s.txt"
    assert (ws / "s.txt").read_text() == "a\ufffdb"
    with pytest.raises(BadArguments, match="cannot be part of a file name"):
        await call(ws, "read_file", path="x\ud800.txt")


# --- FIFOs and other non-regular files --------------------------------------------------------------------------------


@pytest.fixture
def fifo(ws: Path):
    path = ws / "pipe"
    os.mkfifo(path)
    yield path
    # Should a tool have opened it after all, give it a writer so its thread can end rather than hang the test run.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


@pytest.mark.parametrize("name,extra", [
    ("read_file", {}),
    ("write_file", {"content": "x"}),
    ("edit_file", {"old": "a", "new": "b"}),
    ("search_text", {"pattern": "x"}),
])
async def test_a_fifo_is_refused_at_once(ws: Path, fifo: Path, name: str, extra: dict):
    with anyio.fail_after(10):  # opening it would wait for a writer that never comes
        with pytest.raises(ToolFailure, match="pipe is a named pipe \\(FIFO\\); only regular files"):
            await call(ws, name, path="pipe", **extra)
    assert fifo.exists() and not fifo.is_file()  # write_file did not replace it with a regular file


async def test_search_and_list_skip_a_fifo_among_regular_files(ws: Path, fifo: Path):
    (ws / "a.txt").write_text("x marks\n")
    with anyio.fail_after(10):  # reading the FIFO would wait for a writer that never comes
        assert await call(ws, "search_text", pattern="x") == "a.txt:1: x marks"
        assert await call(ws, "list_dir") == "a.txt  8 bytes\npipe  (a named pipe (FIFO))"


# --- regular expressions with a time budget ---------------------------------------------------------------------------


async def test_the_reported_catastrophic_pattern_is_fast_now(ws: Path, monkeypatch):
    monkeypatch.setattr(files, "SEARCH_TIME_BUDGET", 1.0)
    (ws / "a.txt").write_text("a" * 28 + "!\n")
    # an answer, not the time budget's error: the search ended by itself inside a 1 s budget (it took 20.8 s with re)
    assert "no matches" in await call(ws, "search_text", pattern="(a+)+$")


async def test_a_catastrophic_regex_ends_as_tool_error_within_the_budget(ws: Path, monkeypatch):
    monkeypatch.setattr(files, "SEARCH_TIME_BUDGET", 1.0)
    assert 1 <= files.SEARCH_TIME_BUDGET <= 10  # "seconds, not minutes" for the real constant too
    (ws / "a.txt").write_text("a" * 40 + "!\n")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await anyio.sleep(0.05)
            ticks += 1

    with anyio.fail_after(30):  # unbounded, this pattern backtracks for hours
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            with pytest.raises(ToolFailure) as info:
                await call(ws, "search_text", pattern="(a|a)+$")
            tg.cancel_scope.cancel()
    assert type(info.value) is ToolFailure and info.value.code == "TOOL_ERROR"
    assert "1 s time budget" in str(info.value)  # it was the budget that ended it
    assert ticks >= 5  # the event loop kept running while the pattern backtracked


async def test_a_search_stuck_in_a_pattern_is_cancelled_at_once(ws: Path):
    (ws / "a.txt").write_text("a" * 40 + "!\n")
    # cancelled, the call returns before the search's own budget could end it: the worker thread is abandoned (its
    # budget ends it later)
    with anyio.fail_after(files.SEARCH_TIME_BUDGET - 1):
        with anyio.move_on_after(0.2) as scope:
            await call(ws, "search_text", pattern="(a|a)+$")
    assert scope.cancelled_caught


# --- confinement: symlinks and the swap race --------------------------------------------------------------------------


async def test_symlinks_inside_are_followed_safely_and_links_out_refused(ws: Path, tmp_path: Path):
    (ws / "real").mkdir()
    (ws / "real" / "a.txt").write_text("inside\n")
    (ws / "rel").symlink_to("real")
    (ws / "abs").symlink_to(ws / "real")
    (ws / "chain").symlink_to("rel")
    assert await call(ws, "read_file", path="rel/a.txt") == "inside\n"
    assert await call(ws, "read_file", path="chain/a.txt") == "inside\n"
    assert await call(ws, "write_file", path="abs/b.txt", content="hi") == "wrote 2 bytes to real/b.txt"
    assert (ws / "real" / "b.txt").read_text() == "hi"
    (tmp_path / "out").mkdir()
    (ws / "real" / "up").symlink_to("../../out")  # relative, escaping through ..
    (ws / "via").symlink_to("real/up")  # a link inside that leads to a link out
    (ws / "loop").symlink_to("loop")
    for path in ["real/up/x.txt", "via/x.txt", "rel/up/x.txt"]:
        with pytest.raises(BadArguments, match="outside the workspace"):
            await call(ws, "write_file", path=path, content="x")
    with pytest.raises(ToolFailure, match="too many levels of symbolic links"):
        await call(ws, "read_file", path="loop")
    assert list((tmp_path / "out").iterdir()) == []


async def test_symlink_swap_race_never_writes_outside(ws: Path, tmp_path: Path):
    """A thread flips `flip` between a real directory and a symlink to outside while write_file runs again and again."""
    outside = tmp_path / "outside"
    outside.mkdir()
    flip = ws / "flip"
    stop = threading.Event()
    flips = 0

    def flipper():
        nonlocal flips
        while not stop.is_set():
            for step in (lambda: os.mkdir(flip), lambda: os.rename(flip, ws / f"moved{flips}"),
                         lambda: os.symlink(outside, flip), lambda: os.unlink(flip)):
                try:
                    step()
                except OSError:
                    pass
            flips += 1

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    outcomes = {"written": 0, "refused": 0}
    try:
        for i in range(300):
            path = "flip/f.txt" if i % 2 else "flip/deeper/g.txt"
            try:
                await call(ws, "write_file", path=path, content=f"write {i}")
                outcomes["written"] += 1
            except ToolFailure:  # BadArguments (outside) included
                outcomes["refused"] += 1
    finally:
        stop.set()
        thread.join()
    assert list(outside.iterdir()) == []
    assert flips > 100 and outcomes["written"] > 0 and outcomes["refused"] > 0, (flips, outcomes)


# --- run_command: progress, cancellation, and dying with Cairn --------------------------------------------------------


async def test_progress_is_called_with_the_real_pid_right_after_spawn(ws: Path):
    seen: list[tuple[int, int, bool]] = []
    marker = ws / "started"

    def progress(pid: int, started: int) -> None:
        seen.append((pid, started, marker.exists()))

    before = int(time.time() * 1000)
    args = {"command": "echo $$; sleep 0.2; touch started"}
    out = await REGISTRY.get("run_command").body(args, ctx_for(ws, progress))
    after = int(time.time() * 1000)
    assert len(seen) == 1
    pid, started, command_had_finished = seen[0]
    assert out == f"{pid}\n[exit code 0]"
    assert before <= started <= after
    assert not command_had_finished  # reported while it ran, not after


async def test_a_call_cancelled_while_spawning_still_reports_and_stops_the_command(ws: Path):
    seen: list[int] = []
    with anyio.move_on_after(0) as scope:  # the cancel is due at the very first checkpoint: inside the spawn
        await REGISTRY.get("run_command").body({"command": "sleep 30"}, ctx_for(ws, lambda pid, s: seen.append(pid)))
    assert scope.cancelled_caught
    assert len(seen) == 1
    assert wait_dead(seen[0])


async def test_cancelling_a_command_that_ignores_sigterm_does_not_hang(ws: Path):
    pidfile = ws / "pid"
    pidfile.write_text("")
    with anyio.fail_after(30):  # the command never ends by itself: returning at all is the SIGKILL after KILL_GRACE
        with anyio.move_on_after(0.5) as scope:
            await call(ws, "run_command", command=f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done")
    assert scope.cancelled_caught
    assert wait_dead(int(wait_for_line(pidfile)))


async def test_cancelling_a_command_sends_sigterm_first(ws: Path):
    done = ws / "cleaned"
    with anyio.move_on_after(0.5):
        await call(ws, "run_command", command=f"trap 'echo yes > {done}; exit 0' TERM; while :; do sleep 0.05; done")
    assert done.read_text() == "yes\n"


CAIRN_STAND_IN = textwrap.dedent("""
    import sys
    from pathlib import Path

    import anyio

    from cairn.app.tools.base import ToolContext
    from cairn.app.tools.command import run_command

    workspace, marker = Path(sys.argv[1]), Path(sys.argv[2])

    async def dispatch(name, args):
        raise AssertionError

    def progress(pid, started):
        marker.write_text(f"{pid}\\n")

    async def main():
        ctx = ToolContext(workspace=workspace, call_id="c1", turn=1, step=1, parent_call_id=None, dispatch=dispatch,
                          progress=progress)
        await run_command({"command": sys.argv[3]}, ctx)

    anyio.run(main)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("command", ["sleep 30", "sleep 30 & echo $! > bg; sleep 30"], ids=["exec", "shell_forks"])
async def test_the_command_and_its_children_die_when_cairn_is_sigkilled(ws: Path, tmp_path: Path, command: str):
    """`sleep 30` alone is exec'd by dash (the parent-death signal reaches it); in the second form the shell forks, and
    only the guardian can reach the background sleep."""
    marker = tmp_path / "pid"
    marker.write_text("")
    cairn = subprocess.Popen([sys.executable, "-c", CAIRN_STAND_IN, str(ws), str(marker), command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = []
    try:
        pids.append(int(wait_for_line(marker)))
        if "bg" in command:
            (ws / "bg").touch()
            pids.append(int(wait_for_line(ws / "bg")))
        assert all(alive(pid) for pid in pids)
    finally:
        os.kill(cairn.pid, signal.SIGKILL)
        cairn.wait()
    for pid in pids:
        assert wait_dead(pid), f"process {pid} outlived the SIGKILLed process that started it"


def group_is_empty(pgid: int) -> bool:
    """No live process left in the group (an orphan's zombie waits for this container's init, which can be slow)."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return False
    return True


async def test_a_finished_command_leaves_no_helper_running_and_bare_wait_does_not_hang(ws: Path):
    pids: list[int] = []
    ctx = ctx_for(ws, lambda pid, started: pids.append(pid))
    with anyio.fail_after(5):
        out = await REGISTRY.get("run_command").body({"command": "sleep 0.1 & wait; echo done"}, ctx)
    assert out == "done\n[exit code 0]"
    # the guardian goes away once told the command had finished
    wait_sync(lambda: group_is_empty(pids[0]), "no live process left in the command's group")
