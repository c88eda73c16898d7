"""The workspace is as safe as the log (SPEC rev 4 §10, issue 38), through the real CLI, real git and real files: a
rewind reverses only what the rewound turns changed, leaves the operator's own work and everything Cairn never captured
alone, names what it leaves and why, can be dry-run and undone, and an interrupted one is finished only where nothing
changed since; the snapshot store keeps §5's rules (private under any umask, no secret, nothing over the limit, durable
objects)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cli_world import World, write

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")


def run(command: str) -> dict:
    return {"name": "run_command", "arguments": {"command": command}}


def state(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every path under `root` (outside .git): its kind, content (a link: its target) and permission bits."""
    found: dict[str, tuple[str, bytes | str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(full), 0)
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", full.read_bytes(), stat.S_IMODE(st.st_mode))
    return found


def snapshot_world(tmp_path: Path, backend: str = "jsonl") -> World:
    return World(tmp_path, backend, "auto")


# ------------------------------------------------------------------------------------------ only what Cairn captured


def test_a_rewind_never_deletes_ignored_files_a_turn_made_visible(tmp_path):
    """The issue's first finding: turn 2 removes .gitignore, so ignored.log and build/out.o enter the turn's end
    snapshot; the turn's start snapshot had left them out (ignored), so the rewind must not take them for new files."""
    world = snapshot_world(tmp_path)
    subprocess.run(["git", "init", "-q", str(world.ws)], check=True)
    (world.ws / ".gitignore").write_text("ignored.log\nbuild/\n")
    (world.ws / "README.md").write_text("readme\n")
    (world.ws / "ignored.log").write_text("precious log\n")
    (world.ws / "build").mkdir()
    (world.ws / "build" / "out.o").write_bytes(b"\x7fELF object")
    world.turn("hello")
    world.turn("tidy", run("rm .gitignore && echo more >> README.md"))
    proc = world.cairn("rewind", "s", "--turn", "2")
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / ".gitignore").read_text() == "ignored.log\nbuild/\n"
    assert (world.ws / "README.md").read_text() == "readme\n"
    assert (world.ws / "ignored.log").read_text() == "precious log\n"
    assert (world.ws / "build" / "out.o").read_bytes() == b"\x7fELF object"
    lines = proc.stdout.splitlines()
    for path in ("ignored.log", "build/out.o"):
        (line,) = [line for line in lines if line.startswith(f"not restored: {path}: ")]
        assert "not captured at the start of a command of turn 2: ignored by .gitignore" in line
    assert "ignored.log" not in proc.stdout.splitlines()[0]  # the "restored" line names only what went back


def test_a_rewind_leaves_the_operators_own_edits_between_turns_alone(tmp_path):
    """The issue's third finding: what the operator did by hand between turns is not Cairn's to revert."""
    world = snapshot_world(tmp_path)
    (world.ws / "g.txt").write_text("g\n")
    world.turn("write f", write("f.txt", "f\n"))
    with open(world.ws / "g.txt", "a") as f:
        f.write("the operator's line\n")
    (world.ws / "userfile.txt").write_text("mine\n")
    world.turn("say hello")
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert not (world.ws / "f.txt").exists()  # the turn made it: undone
    assert (world.ws / "g.txt").read_text() == "g\nthe operator's line\n"
    assert (world.ws / "userfile.txt").read_text() == "mine\n"
    for path in ("g.txt", "userfile.txt"):
        assert f"not restored: {path}: changed outside Cairn's turns" in proc.stdout


def test_a_path_changed_by_a_turn_and_then_by_hand_is_a_conflict_named_and_left_alone(tmp_path):
    world = snapshot_world(tmp_path)
    (world.ws / "notes.txt").write_text("v1\n")
    world.turn("edit notes", run("echo v2 > notes.txt"))
    (world.ws / "notes.txt").write_text("v3 by hand\n")
    world.turn("hello")
    before = state(world.ws)
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 3 and "notes.txt" in proc.stderr and "--force" in proc.stderr
    assert state(world.ws) == before  # nothing touched
    assert not any(e["type"] == "rewind/plan" for e in world.events())
    forced = world.cairn("rewind", "s", "--turn", "1", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (world.ws / "notes.txt").read_text() == "v1\n"


def test_a_change_a_turn_made_over_the_operators_earlier_edit_goes_back_to_that_edit(tmp_path):
    """Reversing a turn restores the path as the turn found it: the operator's edit made before it stays."""
    world = snapshot_world(tmp_path)
    (world.ws / "a.txt").write_text("original\n")
    world.turn("hello")
    (world.ws / "a.txt").write_text("operator\n")
    world.turn("overwrite", run("echo cairn > a.txt"))
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / "a.txt").read_text() == "operator\n"


def test_symlinks_are_restored_as_links_and_never_followed(tmp_path):
    world = snapshot_world(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    os.symlink("../outside.txt", world.ws / "link")
    (world.ws / "dir").mkdir()
    world.turn("replace the link, link out", run("rm link && echo plain > link && ln -s /etc dir/etc-link"))
    assert not (world.ws / "link").is_symlink()
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(world.ws / "link") == "../outside.txt"
    assert not os.path.lexists(world.ws / "dir" / "etc-link")
    assert outside.read_text() == "outside\n" and Path("/etc/passwd").exists()


def test_a_permission_change_is_reversed(tmp_path):
    world = snapshot_world(tmp_path)
    (world.ws / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(world.ws / "tool.sh", 0o644)
    world.turn("make it executable", run("chmod +x tool.sh"))
    assert os.stat(world.ws / "tool.sh").st_mode & 0o100
    assert world.cairn("rewind", "s", "--turn", "1").returncode == 0
    assert stat.S_IMODE(os.stat(world.ws / "tool.sh").st_mode) == 0o644


def test_a_nested_repository_a_command_changed_is_named_not_entered(tmp_path):
    world = snapshot_world(tmp_path)
    sub = world.ws / "sub"
    sub.mkdir()
    subprocess.run(["git", "init", "-q", str(sub)], check=True)
    (sub / "inner.txt").write_text("inner\n")
    world.turn("change the nested repo", run("echo changed > sub/inner.txt && echo top > top.txt"))
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert not (world.ws / "top.txt").exists()
    assert (sub / "inner.txt").read_text() == "changed\n"  # not Cairn's to touch: it never captured it
    assert "not restored: sub/: a nested repository" in proc.stdout


def test_non_utf8_names_and_big_files_are_handled(tmp_path):
    world = snapshot_world(tmp_path)
    odd = os.fsdecode(b"caf\xe9.txt")
    world.turn("make odd and big", run(f"printf odd > '{odd}' && head -c 12000000 /dev/zero > big.bin"))
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert not os.path.lexists(world.ws / odd)
    assert (world.ws / "big.bin").stat().st_size == 12000000  # left out at the turn's end: never deleted
    assert "not restored: big.bin" in proc.stdout


# ---------------------------------------------------------------------------------------------- dry run and undo


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    world = snapshot_world(tmp_path)
    (world.ws / "ignored.log").write_text("log\n")
    (world.ws / ".gitignore").write_text("ignored.log\n")
    world.turn("work", write("new.txt", "new\n"), run("rm .gitignore"))
    before, events = state(world.ws), world.events()
    proc = world.cairn("rewind", "s", "--turn", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "restore: .gitignore" in proc.stdout and "delete: new.txt (it did not exist then)" in proc.stdout
    assert "not restored: ignored.log" in proc.stdout
    assert state(world.ws) == before and world.events() == events


def test_undo_returns_the_exact_state_before_the_rewind_files_and_conversation(tmp_path):
    from cairn.app.agent.transcript import Transcript
    from cairn.persistence.events import event_decoder

    world = snapshot_world(tmp_path)
    (world.ws / "keep.txt").write_text("keep\n")
    world.turn("one", write("a.txt", "one\n"))
    world.turn("two", run("echo two > a.txt && rm keep.txt && mkdir d && echo x > d/x && chmod +x d/x"))
    (world.ws / "mine.txt").write_text("the operator's\n")
    before = state(world.ws)

    def conversation() -> list:
        events = [event_decoder.decode(json.dumps(e)) for e in world.events()]
        derived = Transcript(events)
        derived.extend(events)
        return derived.messages

    talk = conversation()
    assert world.cairn("rewind", "s", "--turn", "2").returncode == 0
    assert (world.ws / "a.txt").read_text() == "one\n" and (world.ws / "keep.txt").exists()
    assert conversation() != talk
    undo = world.cairn("rewind", "s", "--undo")
    assert undo.returncode == 0, undo.stderr
    assert "undid the last rewind" in undo.stdout
    assert state(world.ws) == before
    undone = conversation()
    assert [m["content"] for m in undone[: len(talk)]] == [m["content"] for m in talk]
    # an undo is a rewind too: undoing it again redoes the rewind
    assert world.cairn("rewind", "s", "--undo").returncode == 0
    assert (world.ws / "a.txt").read_text() == "one\n"


def test_undo_refuses_a_path_changed_since_the_rewind(tmp_path):
    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"))
    assert world.cairn("rewind", "s", "--turn", "1").returncode == 0
    (world.ws / "a.txt").write_text("new by hand\n")
    proc = world.cairn("rewind", "s", "--undo")
    assert proc.returncode == 3 and "a.txt" in proc.stderr
    assert (world.ws / "a.txt").read_text() == "new by hand\n"


def test_undo_without_snapshots_uses_before_images(tmp_path):
    world = World(tmp_path, "jsonl", "off")
    world.turn("one", write("a.txt", "one\n"))
    world.turn("two", write("a.txt", "two\n"))
    assert world.cairn("rewind", "s", "--turn", "2").returncode == 0
    assert (world.ws / "a.txt").read_text() == "one\n"
    proc = world.cairn("rewind", "s", "--undo")
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / "a.txt").read_text() == "two\n"


# ------------------------------------------------------------------------------------------- an interrupted rewind


def test_finish_refuses_a_path_changed_since_the_plan_and_touches_nothing_outside_it(tmp_path):
    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"), write("b.txt", "bee\n"))
    world.crash_at("rewind-planned", "rewind", "s", "--turn", "1")
    assert (world.ws / "a.txt").exists()  # stopped before the first file
    (world.ws / "b.txt").write_text("newer work\n")
    (world.ws / "later.txt").write_text("not in the plan\n")
    refused = world.cairn("rewind", "s", "--finish")
    assert refused.returncode == 3 and "b.txt" in refused.stderr
    assert (world.ws / "a.txt").read_text() == "one\n" and (world.ws / "b.txt").read_text() == "newer work\n"
    other = world.cairn("rewind", "s", "--turn", "1")
    assert other.returncode == 2 and "interrupted" in other.stderr and "--finish" in other.stderr
    forced = world.cairn("rewind", "s", "--finish", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (world.ws / "a.txt").exists() and not (world.ws / "b.txt").exists()
    assert (world.ws / "later.txt").read_text() == "not in the plan\n"


# -------------------------------------------------------------------------------------------- the snapshot store


def test_the_snapshot_store_is_private_under_umask_000(tmp_path):
    world = snapshot_world(tmp_path)
    (world.ws / "a.txt").write_text("a\n")
    proc = subprocess.run([str(Path(os.sys.executable).parent / "cairn"), "run", "--script",
                           world.script(run("echo b > b.txt")), "--yes", "--session-id", "s", "go"],
                          env=world.env(), cwd=world.ws, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.umask(0))
    assert proc.returncode == 0, proc.stderr
    store = world.home / "snapshots"
    assert any(store.rglob("*"))
    for path in [store, *store.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


def _objects(world: World) -> list[bytes]:
    (repo,) = (world.home / "snapshots").glob("*.git")
    env = {"GIT_DIR": str(repo), "PATH": os.environ["PATH"]}
    listed = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)"],
                            env=env, capture_output=True, check=True).stdout.decode().split("\n")
    blobs = [line.split()[0] for line in listed if line.endswith(" blob")]
    return [subprocess.run(["git", "cat-file", "blob", b], env=env, capture_output=True, check=True).stdout
            for b in blobs]


def test_a_file_over_the_limit_is_never_written_into_the_store(tmp_path):
    world = snapshot_world(tmp_path)
    world.turn("big", run("head -c 12000000 /dev/urandom > big.bin && echo small > small.txt"))
    sizes = [len(data) for data in _objects(world)]
    assert sizes and max(sizes) < 1_000_000
    shots = [e for e in world.events() if e["type"] == "workspace/snapshot"]
    assert shots[-1]["left_out"] == ["big.bin"] and shots[-1]["manifest"]


def test_a_file_holding_a_configured_secret_is_left_out_of_snapshots(tmp_path):
    from openai_server import OpenAIServer, text, tool_calls

    world = snapshot_world(tmp_path)
    key = "sk-live-0123456789abcdef"
    (world.ws / ".env").write_text(f"API_KEY={key}\n")
    calls = [{"id": "c1", "name": "run_command", "arguments": {"command": "echo hi > hi.txt"}}]
    with OpenAIServer([tool_calls(calls), text("done")]) as server:
        proc = world.cairn("run", "--session-id", "s", "--yes", "go", CAIRN_PROVIDER="openai",
                           CAIRN_BASE_URL=server.base_url, CAIRN_MODEL="m", CAIRN_API_KEY=key)
    assert proc.returncode == 0, proc.stderr
    assert not any(key.encode() in data for data in _objects(world))
    shots = [e for e in world.events() if e["type"] == "workspace/snapshot"]
    assert all(".env" in shot["left_out"] for shot in shots)
    rewound = world.cairn("rewind", "s", "--turn", "1")
    assert rewound.returncode == 0 and (world.ws / ".env").read_text() == f"API_KEY={key}\n"
    assert not (world.ws / "hi.txt").exists()


def test_snapshot_objects_and_their_directories_are_synced_before_the_snapshot_returns(tmp_path, monkeypatch):
    """The moment of the effect: by the time `snapshot()` returns, every object directory holding a file of the new
    tree (and the manifest) was fsync'd — or, when there are many, the store's file system was synced at once after
    git wrote them (git itself fsyncs each object file: core.fsync=loose-object)."""
    from cairn.app.agent import snapshots

    ws = tmp_path / "ws"
    ws.mkdir()
    synced: set[str] = set()
    real_fsync, real_syncfs = os.fsync, snapshots._syncfs

    def fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def syncfs(directory: Path) -> None:
        synced.add(f"syncfs {directory}")
        real_syncfs(directory)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(snapshots, "_syncfs", syncfs)
    repo = snapshots.ShadowRepo(tmp_path / "home", ws, "s")
    for files in (2, 20):  # few object directories: each fsync'd; many: one syncfs
        for n in range(files):
            (ws / f"f{files}-{n}.txt").write_text(f"file {files} {n}\n")
        synced.clear()
        shot = repo.snapshot()
        objects = [shot.tree, shot.manifest] + [blob for _, blob in repo.entries(shot.tree).values()]
        new = {str(repo.git_dir / "objects" / name[:2]) for name in objects}
        whole = f"syncfs {repo.git_dir / 'objects'}" in synced
        assert whole or (new | {str(repo.git_dir / "objects")}) <= synced, (files, new - synced)
        assert whole == (files == 20)


def test_rm_keeps_the_manifests_a_remaining_session_needs(tmp_path):
    world = snapshot_world(tmp_path)
    (world.ws / ".gitignore").write_text("keep.log\n")
    (world.ws / "keep.log").write_text("log\n")
    world.turn("one", run("rm .gitignore"), sid="gone")
    world.turn("two", run("echo x > x.txt"), sid="s")
    assert world.cairn("rm", "gone").returncode == 0
    shots = [e for e in world.events("s") if e["type"] == "workspace/snapshot"]
    (repo,) = (world.home / "snapshots").glob("*.git")
    for shot in shots:
        for name in (shot["tree"], shot["manifest"]):
            found = subprocess.run(["git", "cat-file", "-e", name], env={"GIT_DIR": str(repo), "PATH": os.environ["PATH"]})
            assert found.returncode == 0, name
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert not (world.ws / "x.txt").exists() and (world.ws / "keep.log").exists()


def test_an_interrupted_rewind_blocks_a_new_turn_and_every_face_says_so(tmp_path):
    """The issue's fourth finding: show, sessions and run --resume said nothing and a new turn ran; --finish then
    applied the stale plan over it. Now every face names the pending rewind and no turn starts until it is settled."""
    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"))
    world.crash_at("rewind-planned", "rewind", "s", "--turn", "1")
    before = world.events()
    shown = world.cairn("show", "s")
    assert shown.returncode == 0 and "rewind to before turn 1 was interrupted" in shown.stderr
    listed = json.loads(world.cairn("sessions", "--json").stdout.splitlines()[0])
    assert listed["rewind_pending"] is True
    assert "(rewind pending)" in world.cairn("sessions").stdout
    refused = world.cairn("run", "--script", world.script(write("new.txt", "x\n")), "--yes", "--resume", "s", "go")
    assert refused.returncode == 2 and "was interrupted" in refused.stderr and "--finish" in refused.stderr
    assert not (world.ws / "new.txt").exists()
    assert [e for e in world.events() if e["type"] == "turn/start"] == [e for e in before if e["type"] == "turn/start"]
    abandoned = world.cairn("rewind", "s", "--abandon")
    assert abandoned.returncode == 0 and (world.ws / "a.txt").read_text() == "one\n"
    assert json.loads(world.cairn("sessions", "--json").stdout.splitlines()[0])["rewind_pending"] is False
    world.turn("two", write("new.txt", "x\n"))


def test_the_python_api_undoes_a_rewind_and_refuses_a_turn_while_one_is_pending(tmp_path):
    import anyio

    from cairn import open_session
    from cairn.app.agent.loop import REWIND_PENDING

    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"))
    world.turn("two", write("a.txt", "two\n"))
    os.environ.pop("CAIRN_FAILPOINT", None)

    async def main() -> tuple[list[str], list[str]]:
        async with open_session(resume="s", home=str(world.home), provider="script",
                                script=world.script(), approve=True) as session:
            rewound = await session.rewind(2)
            assert (world.ws / "a.txt").read_text() == "one\n"
            undone = await session.rewind_undo()
            return rewound, undone

    rewound, undone = anyio.run(main)
    assert rewound[0].startswith("restored to before turn 2") and undone[0].startswith("undid the last rewind")
    assert (world.ws / "a.txt").read_text() == "two\n"
    world.crash_at("rewind-planned", "rewind", "s", "--turn", "2")

    async def blocked():
        async with open_session(resume="s", home=str(world.home), provider="script",
                                script=world.script(), approve=True) as session:
            return await session.run("go on")

    result = anyio.run(blocked)
    assert result.reason == "error" and result.error.code == REWIND_PENDING


def test_a_first_snapshot_of_many_files_is_made_durable_by_one_syncfs(tmp_path, monkeypatch):
    """Over BULK new files, git writes without an fsync each; the store's file system is synced once before
    `snapshot()` returns (and the object directories after it), so the tree is durable before any event names it."""
    from cairn.app.agent import snapshots

    ws = tmp_path / "ws"
    ws.mkdir()
    for n in range(snapshots.BULK + 10):
        (ws / f"f{n}.txt").write_text(f"file {n}\n")
    calls: list[Path] = []
    real = snapshots._syncfs
    monkeypatch.setattr(snapshots, "_syncfs", lambda d: (calls.append(d), real(d)))
    repo = snapshots.ShadowRepo(tmp_path / "home", ws, "s")
    first = repo.snapshot()
    assert calls and set(calls) == {repo.git_dir / "objects"}
    seen = len(calls)
    (ws / "f0.txt").write_text("changed\n")
    second = repo.snapshot()
    assert len(calls) == seen  # one file: git's own fsync per object and a few directory fsyncs, no syncfs
    assert first.tree != second.tree


def test_after_a_move_a_rewind_never_applies_the_old_places_snapshots(tmp_path):
    """SPEC §10: `--workspace DIR` on a resume moves the session; turns from before the move are not rewound into the
    new place (their snapshots and before-images describe the old one), and the old place is never touched."""
    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"))
    new = tmp_path / "moved"
    new.mkdir()
    (new / "theirs.txt").write_text("theirs\n")
    moved = world.cairn("run", "--script", world.script(write("b.txt", "bee\n")), "--yes", "--resume", "s",
                        "--workspace", str(new), "two")
    assert moved.returncode == 0, moved.stderr
    assert (new / "b.txt").exists() and not (world.ws / "b.txt").exists()
    before_old, before_new = state(world.ws), state(new)
    refused = world.cairn("rewind", "s", "--turn", "1")
    assert refused.returncode == 2 and "before the session's workspace moved" in refused.stderr
    assert state(world.ws) == before_old and state(new) == before_new
    proc = world.cairn("rewind", "s", "--turn", "2")
    assert proc.returncode == 0, proc.stderr
    assert not (new / "b.txt").exists() and (new / "theirs.txt").read_text() == "theirs\n"
    assert state(world.ws) == before_old  # the old place: untouched


@pytest.mark.parametrize("undo", [False, True], ids=["rewind", "undo"])
def test_the_plan_and_what_it_replaces_are_durable_when_the_first_file_is_touched(tmp_path, monkeypatch, undo):
    """The moment of the effect (GUIDE §7): every time the engine writes or deletes a workspace path, the durable seq
    already covers the `rewind/plan` (and the `rewind-start` snapshot holding what it replaces). A SIGKILL test cannot
    see this barrier; the durable seq can."""
    import anyio

    from cairn.app.agent import rewind as engine
    from cairn.app.agent.snapshots import ShadowRepo
    from cairn.persistence.blobs import blob_store_for
    from cairn.persistence.events import RewindPlan, WorkspaceSnapshot
    from cairn.persistence.session import LiveSession
    from cairn.persistence.store import SessionStore

    world = snapshot_world(tmp_path)
    world.turn("one", write("a.txt", "one\n"), run("echo b > b.txt"))
    if undo:
        assert world.cairn("rewind", "s", "--turn", "1").returncode == 0
    store = SessionStore(world.home, "jsonl")
    touched: list[int] = []
    real = engine.write_path

    async def main() -> list:
        blobs = blob_store_for(store.backend)
        try:
            async with LiveSession(store.open_for_resume("s")) as session:
                def spy(workspace, path, data, mode):
                    touched.append(session.coordinator.durable_seq)
                    real(workspace, path, data, mode)

                monkeypatch.setattr(engine, "write_path", spy)
                repo = ShadowRepo(world.home, world.ws, "s", holds_secret=session.holds_secret)
                if undo:
                    await engine.undo_rewind(session, world.ws, blobs, repo=repo)
                else:
                    await engine.rewind(session, world.ws, blobs, 1, "files", repo=repo)
                return list(session.events)
        finally:
            blobs.close()

    events = anyio.run(main)
    plan = [e for e in events if isinstance(e, RewindPlan)][-1]
    start = next(e for e in events if isinstance(e, WorkspaceSnapshot) and e.at == "rewind-start"
                 and e.call_id == plan.rewind_id)
    assert len(touched) == 2 and start.seq < plan.seq
    assert all(seq >= plan.seq for seq in touched), (touched, plan.seq)
