"""The built-in tools against real files in tmp_path and real subprocesses (SPEC §8)."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import anyio
import pytest
from waiting import alive, wait_dead

from cairn.app.providers.base import ToolSchema
from cairn.app.tools.base import OUTPUT_LIMIT, BadArguments, Tool, ToolContext, ToolFailure
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.app.tools.workspace import require_str, resolve_in_workspace

pytestmark = pytest.mark.anyio

NOTICE_ROOM = 300  # a truncation notice is a short line


async def _no_dispatch(name, args):
    raise AssertionError("these tools never dispatch nested calls")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside.txt"
    secret.write_text("secret\n")
    return secret


def ctx_for(ws: Path, call_id: str = "call_test_1") -> ToolContext:
    return ToolContext(workspace=ws, call_id=call_id, turn=1, step=1, parent_call_id=None, dispatch=_no_dispatch)


REGISTRY = ToolRegistry.default()


async def call(ws: Path, name: str, **args) -> str:
    tool = REGISTRY.get(name)
    assert tool is not None
    return await tool.body(args, ctx_for(ws))


# --- registry ---------------------------------------------------------------------------------------------------------


def test_registry_has_the_seven_spec_tools_with_their_safety():
    safety = {t.name: t.safety for t in builtin_tools()}
    assert safety == {
        "list_dir": "read_only",
        "read_file": "read_only",
        "search_text": "read_only",
        "find_files": "read_only",
        "write_file": "idempotent",
        "edit_file": "side_effecting",
        "run_command": "side_effecting",
    }
    schemas = REGISTRY.schemas()
    assert [s.name for s in schemas] == list(safety)
    for schema in schemas:
        assert isinstance(schema, ToolSchema)
        assert schema.description
        assert schema.parameters["type"] == "object"
        assert set(schema.parameters.get("required", [])) <= set(schema.parameters["properties"])


def test_registry_register_get_and_duplicates():
    async def body(args, ctx):
        return "ok"

    extra = Tool(name="nested", description="d", parameters={"type": "object", "properties": {}}, safety="read_only",
                 body=body)
    registry = ToolRegistry(builtin_tools())
    registry.register(extra)
    assert registry.get("nested") is extra
    assert registry.get("nope") is None
    assert "nested" in registry and len(registry.names()) == 8
    assert ToolRegistry()  # empty but truthy, so `tools or default` keeps a deliberately empty registry
    with pytest.raises(ValueError):
        registry.register(extra)


# --- workspace helpers ------------------------------------------------------------------------------------------------


def test_resolve_in_workspace(ws: Path, outside: Path):
    (ws / "sub").mkdir()
    assert resolve_in_workspace(ws, "sub/../a.txt") == ws / "a.txt"
    assert resolve_in_workspace(ws, str(ws / "new" / "file")) == ws / "new" / "file"
    assert resolve_in_workspace(ws, ".") == ws
    (ws / "out").symlink_to(outside.parent)
    for bad in ["../x", str(outside), "/etc/passwd", "out/outside.txt", "out/new.txt", "sub/../../x"]:
        with pytest.raises(BadArguments, match="outside the workspace"):
            resolve_in_workspace(ws, bad)
    with pytest.raises(BadArguments):
        resolve_in_workspace(ws, "")


def test_require_str():
    assert require_str({"path": "a"}, "path") == "a"
    with pytest.raises(BadArguments, match="missing required argument 'path'"):
        require_str({}, "path")
    with pytest.raises(BadArguments, match="must be a string"):
        require_str({"path": 3}, "path")
    with pytest.raises(BadArguments, match="must not be empty"):
        require_str({"path": ""}, "path")
    assert require_str({"content": ""}, "content", allow_empty=True) == ""


# --- confinement, for every path-taking tool --------------------------------------------------------------------------

CONFINED_CALLS = [
    ("read_file", {}),
    ("write_file", {"content": "x"}),
    ("edit_file", {"old": "secret", "new": "pwned"}),
    ("list_dir", {}),
    ("search_text", {"pattern": "secret"}),
]


@pytest.mark.parametrize("name,extra", CONFINED_CALLS, ids=[c[0] for c in CONFINED_CALLS])
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "etc_passwd", "symlink_out"])
async def test_paths_outside_the_workspace_are_refused(ws: Path, outside: Path, name: str, extra: dict, kind: str):
    (ws / "link").symlink_to(outside)
    (ws / "linkdir").symlink_to(outside.parent)
    path = {
        "dotdot": "../outside.txt",
        "absolute": str(outside),
        "etc_passwd": "/etc/passwd",
        "symlink_out": "link" if name != "list_dir" else "linkdir",
    }[kind]
    with pytest.raises(BadArguments, match="outside the workspace"):
        await call(ws, name, path=path, **extra)
    assert outside.read_text() == "secret\n"


async def test_search_does_not_follow_a_symlinked_file_out_of_the_workspace(ws: Path, outside: Path):
    (ws / "link.txt").symlink_to(outside)
    (ws / "inside.txt").write_text("secret inside\n")
    out = await call(ws, "search_text", pattern="secret")
    assert out == "inside.txt:1: secret inside"


# --- list_dir ---------------------------------------------------------------------------------------------------------


async def test_list_dir(ws: Path):
    (ws / "b.txt").write_text("hello")
    (ws / "a.txt").write_text("")
    (ws / "zdir").mkdir()
    (ws / "adir").mkdir()
    (ws / "adir" / "inner.py").write_text("x = 1\n")
    assert await call(ws, "list_dir") == "adir/\nzdir/\na.txt  0 bytes\nb.txt  5 bytes"
    assert await call(ws, "list_dir", path="adir") == "inner.py  6 bytes"
    (ws / "empty").mkdir()
    assert "empty directory" in await call(ws, "list_dir", path="empty")
    with pytest.raises(ToolFailure, match="no such directory"):
        await call(ws, "list_dir", path="missing")
    with pytest.raises(ToolFailure, match="not a directory"):
        await call(ws, "list_dir", path="b.txt")


# --- read_file --------------------------------------------------------------------------------------------------------


async def test_read_file_whole_and_ranges(ws: Path):
    (ws / "f.txt").write_text("one\ntwo\nthree\nfour\n")
    assert await call(ws, "read_file", path="f.txt") == "one\ntwo\nthree\nfour\n"
    ranged = await call(ws, "read_file", path="f.txt", offset=2, limit=2)
    assert ranged.startswith("two\nthree\n")
    assert "offset=4" in ranged
    assert await call(ws, "read_file", path="f.txt", offset=3) == "three\nfour\n"
    assert "has 4 lines" in await call(ws, "read_file", path="f.txt", offset=9)
    (ws / "empty.txt").write_text("")
    assert "empty" in await call(ws, "read_file", path="empty.txt")
    with pytest.raises(BadArguments):
        await call(ws, "read_file", path="f.txt", offset=0)


async def test_read_file_refuses_binary_and_undecodable(ws: Path):
    (ws / "bin").write_bytes(b"\x7fELF\x00\x01\x02")
    (ws / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ToolFailure, match="binary"):
        await call(ws, "read_file", path="bin")
    with pytest.raises(ToolFailure, match="not valid UTF-8"):
        await call(ws, "read_file", path="latin1.txt")
    with pytest.raises(ToolFailure, match="no such file"):
        await call(ws, "read_file", path="missing.txt")
    with pytest.raises(ToolFailure, match="directory"):
        await call(ws, "read_file", path=".")
    with pytest.raises(BadArguments, match="missing required argument 'path'"):
        await call(ws, "read_file")


async def test_read_file_truncates_large_files_visibly(ws: Path):
    line = "x" * 99 + "\n"
    (ws / "big.txt").write_text(line * 10_000)  # ~1 MB
    out = await call(ws, "read_file", path="big.txt")
    assert len(out) <= OUTPUT_LIMIT + NOTICE_ROOM
    assert out.startswith(line)
    assert "[output truncated at line" in out and "1000000 bytes" in out
    (ws / "oneline.txt").write_text("y" * 1_000_000)
    out = await call(ws, "read_file", path="oneline.txt")
    assert len(out) <= OUTPUT_LIMIT + NOTICE_ROOM and "longer than" in out


# --- search_text ------------------------------------------------------------------------------------------------------


async def test_search_text(ws: Path):
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("def alpha():\n    return 1\n\ndef beta():\n    pass\n")
    (ws / "notes.md").write_text("alpha and beta\n")
    for skipped in [".git", ".venv", "node_modules"]:
        (ws / skipped).mkdir()
        (ws / skipped / "hit.txt").write_text("def alpha():\n")
    (ws / "blob.bin").write_bytes(b"def alpha\x00")
    assert await call(ws, "search_text", pattern=r"^def \w+") == "src/a.py:1: def alpha():\nsrc/a.py:4: def beta():"
    assert await call(ws, "search_text", pattern="alpha", path="src") == "src/a.py:1: def alpha():"
    assert await call(ws, "search_text", pattern="ALPHA", glob="*.md", ignore_case=True) == "notes.md:1: alpha and beta"
    assert "no matches" in await call(ws, "search_text", pattern="gamma")
    literal = await call(ws, "search_text", pattern="alpha(")  # invalid regex: searched literally
    assert literal.splitlines()[0] == "src/a.py:1: def alpha():"
    assert "literal text" in literal


async def test_search_text_bounds_the_number_of_matches(ws: Path):
    (ws / "many.txt").write_text("match\n" * 1000)
    out = await call(ws, "search_text", pattern="match")
    assert out.count("many.txt:") == 200
    assert "800 more matches not shown" in out


# --- write_file -------------------------------------------------------------------------------------------------------


async def test_write_file_creates_parents_and_is_idempotent(ws: Path):
    out = await call(ws, "write_file", path="deep/er/f.txt", content="héllo\n")
    assert out == "wrote 7 bytes to deep/er/f.txt"
    target = ws / "deep" / "er" / "f.txt"
    assert target.read_text() == "héllo\n"
    first = (target.read_bytes(), sorted(os.listdir(target.parent)))
    await call(ws, "write_file", path="deep/er/f.txt", content="héllo\n")
    assert (target.read_bytes(), sorted(os.listdir(target.parent))) == first == (b"h\xc3\xa9llo\n", ["f.txt"])
    await call(ws, "write_file", path="deep/er/f.txt", content="")
    assert target.read_bytes() == b""


async def test_write_file_keeps_mode_and_writes_through_inner_symlinks(ws: Path):
    script = ws / "run.sh"
    script.write_text("old")
    script.chmod(0o750)
    (ws / "alias.sh").symlink_to(script)
    await call(ws, "write_file", path="alias.sh", content="new")
    assert script.read_text() == "new" and (ws / "alias.sh").is_symlink()
    assert script.stat().st_mode & 0o777 == 0o750
    assert not [p for p in os.listdir(ws) if p.endswith(".cairn-tmp")]
    with pytest.raises(ToolFailure, match="directory"):
        await call(ws, "write_file", path=".", content="x")


# --- edit_file --------------------------------------------------------------------------------------------------------


async def test_edit_file(ws: Path):
    (ws / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    assert await call(ws, "edit_file", path="f.py", old="b = 2", new="b = 20") == "replaced 1 occurrence in f.py at line 2"
    assert (ws / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"
    await call(ws, "edit_file", path="f.py", old="c = 3\n", new="")
    assert (ws / "f.py").read_text() == "a = 1\nb = 20\n"


async def test_edit_file_not_found_and_ambiguous(ws: Path):
    original = "x = 1\nx = 1\ny = 2\n"
    (ws / "f.py").write_text(original)
    with pytest.raises(ToolFailure, match="not found"):
        await call(ws, "edit_file", path="f.py", old="z = 3", new="z = 4")
    with pytest.raises(ToolFailure, match="occurs 2 times"):
        await call(ws, "edit_file", path="f.py", old="x = 1", new="x = 2")
    (ws / "aaa.txt").write_text("aaa")
    with pytest.raises(ToolFailure, match="occurs 2 times"):  # overlapping occurrences are ambiguous too
        await call(ws, "edit_file", path="aaa.txt", old="aa", new="b")
    assert (ws / "f.py").read_text() == original
    with pytest.raises(ToolFailure, match="no such file"):
        await call(ws, "edit_file", path="missing.py", old="a", new="b")
    with pytest.raises(BadArguments, match="must not be empty"):
        await call(ws, "edit_file", path="f.py", old="", new="b")


# --- run_command ------------------------------------------------------------------------------------------------------


async def test_run_command_output_exit_code_and_call_id(ws: Path):
    (ws / "here.txt").write_text("")
    out = await ToolRegistry.default().get("run_command").body(
        {"command": "echo id=$CAIRN_CALL_ID; ls; echo oops >&2"}, ctx_for(ws, call_id="call_abc")
    )
    assert out == "id=call_abc\nhere.txt\noops\n[exit code 0]"
    assert await call(ws, "run_command", command="printf partial; exit 3") == "partial\n[exit code 3]"
    assert await call(ws, "run_command", command="cat") == "[exit code 0]"  # stdin is /dev/null, not a hang
    assert "[exit code 127]" in await call(ws, "run_command", command="definitely-not-a-command-xyz")


async def test_run_command_bad_arguments_and_start_failure(ws: Path):
    with pytest.raises(BadArguments, match="missing required argument 'command'"):
        await call(ws, "run_command")
    with pytest.raises(BadArguments, match="at most 600"):
        await call(ws, "run_command", command="true", timeout=601)
    with pytest.raises(ToolFailure, match="could not start"):
        await call(ws / "gone", "run_command", command="true")


async def test_run_command_truncates_50_mb_with_bounded_memory(ws: Path):
    tracemalloc.start()
    try:
        out = await call(ws, "run_command", command="head -c 50000000 /dev/zero | tr '\\0' a")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) <= OUTPUT_LIMIT + NOTICE_ROOM
    assert out.startswith("a" * 1000)
    assert f"[output truncated: {50_000_000 - OUTPUT_LIMIT} more bytes not shown]" in out
    assert out.endswith("[exit code 0]")
    assert peak < 5_000_000, peak


async def test_run_command_timeout_kills_the_process_group(ws: Path):
    with anyio.fail_after(20):  # well before the 30 s the commands would take: the timeout ended them
        with pytest.raises(ToolFailure, match="timed out after 1 s") as info:
            await call(ws, "run_command", command="sleep 30 & echo bg=$!; sleep 30", timeout=1)
    message = str(info.value)
    assert "bg=" in message  # the partial output is part of the failure
    pid = int(message.split("bg=")[1].split()[0])
    assert wait_dead(pid)


async def test_cancellation_kills_the_process_group(ws: Path):
    pidfile = ws / "pids"
    with anyio.fail_after(20):  # well before the 30 s the command would take: the cancel ended it
        with anyio.move_on_after(1) as scope:
            await call(ws, "run_command", command=f"sleep 30 & echo $! > {pidfile}; echo $$ >> {pidfile}; wait")
    assert scope.cancelled_caught
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        assert wait_dead(pid), f"process {pid} outlived the cancelled call"


async def test_background_process_holding_output_does_not_hang_the_call(ws: Path):
    with anyio.fail_after(20):  # well before the 30 s the background process holds the output pipe
        out = await call(ws, "run_command", command="sleep 30 & echo bg=$!")
    pid = int(out.split("bg=")[1].split()[0])
    assert alive(pid)  # left running, by design: it only lost its output pipe
    os.kill(pid, 9)
    assert out.startswith(f"bg={pid}\n[exit code 0]")
    assert "background processes" in out
