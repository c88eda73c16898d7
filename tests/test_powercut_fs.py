"""The power-cut file system itself (tests/powercut_fs.py): what a cut keeps is exactly what fsync and fsyncdir made
durable (POSIX rules), keep_prefix never invents a byte, and SQLite, git and flock work on the mount."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from powercut_fs import FSTYPE, PowerCutFS, fsync_dir, mounted_at, require
from waiting import wait_sync


@pytest.fixture
def pcfs(tmp_path: Path) -> Iterator[PowerCutFS]:
    require()
    with PowerCutFS(tmp_path / "mnt", seed=7) as fs:
        yield fs


def write_file(path: Path, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_written_not_fsynced_content_is_gone_after_a_cut(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "kept", b"durable", fsync=True)
    write_file(root / "never-synced", b"lost", fsync=False)
    fsync_dir(root)
    with open(root / "kept", "ab") as f:
        f.write(b" + unsynced tail")
    write_file(root / "never-synced", b"still lost", fsync=False)

    counts = pcfs.cut()

    assert (root / "kept").read_bytes() == b"durable"
    assert (root / "never-synced").read_bytes() == b""  # durable name, content never fsync'd: empty
    assert counts["reverted_files"] == 2
    assert pcfs.stats()["unsynced_files"] == 0


def test_fsynced_content_of_a_file_whose_name_was_never_durable_is_gone(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "new", b"fsynced, but its directory never was", fsync=True)

    counts = pcfs.cut()

    assert not (root / "new").exists()
    assert os.listdir(root) == []
    assert counts["dropped_files"] == 1 and counts["dropped_names"] == 1


def test_after_fsync_of_file_and_directory_both_survive(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    (root / "sub").mkdir()
    fsync_dir(root)
    write_file(root / "sub" / "f", b"content", fsync=True)
    fsync_dir(root / "sub")
    before = pcfs.stats()

    counts = pcfs.cut()

    assert (root / "sub" / "f").read_bytes() == b"content"
    assert counts == {**counts, "dropped_files": 0, "dropped_dirs": 0, "dropped_names": 0, "reverted_files": 0}
    assert before["fsync"] >= 1 and before["fsyncdir"] == 2 and before["unsynced_files"] == 0


def test_rename_without_directory_fsync_is_undone_by_a_cut(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "config", b"old", fsync=True)
    fsync_dir(root)
    write_file(root / "config.tmp", b"new", fsync=True)
    os.replace(root / "config.tmp", root / "config")

    counts = pcfs.cut()

    assert sorted(os.listdir(root)) == ["config"]
    assert (root / "config").read_bytes() == b"old"  # the old name is back with its durable content
    assert counts["restored_names"] == 1


def test_rename_with_directory_fsync_survives_a_cut(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "config", b"old", fsync=True)
    fsync_dir(root)
    write_file(root / "config.tmp", b"new", fsync=True)
    os.replace(root / "config.tmp", root / "config")
    fsync_dir(root)

    pcfs.cut()

    assert sorted(os.listdir(root)) == ["config"]
    assert (root / "config").read_bytes() == b"new"


def test_unlink_without_directory_fsync_comes_back(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "victim", b"still here", fsync=True)
    fsync_dir(root)
    os.unlink(root / "victim")
    assert not (root / "victim").exists()

    counts = pcfs.cut()

    assert (root / "victim").read_bytes() == b"still here"
    assert counts["restored_names"] == 1


def test_makedirs_tree_with_only_the_leaf_fsynced_is_gone_entirely(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    leaf = root / "a" / "b" / "c"
    os.makedirs(leaf)
    write_file(leaf / "f", b"data", fsync=True)
    fsync_dir(leaf)  # the leaf's entries are durable, but nobody made "a" durable in the root

    counts = pcfs.cut()

    assert os.listdir(root) == []
    assert counts["dropped_dirs"] == 3 and counts["dropped_files"] == 1


def test_makedirs_tree_with_every_parent_fsynced_survives(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    leaf = root / "a" / "b" / "c"
    os.makedirs(leaf)
    write_file(leaf / "f", b"data", fsync=True)
    for directory in (leaf, leaf.parent, leaf.parent.parent, root):
        fsync_dir(directory)

    pcfs.cut()

    assert (leaf / "f").read_bytes() == b"data"


def test_sync_and_syncfs_make_nothing_durable(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "f", b"durable", fsync=True)
    fsync_dir(root)
    write_file(root / "f", b"only synced with sync(2)", fsync=False)
    os.sync()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        import ctypes

        assert ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0
    finally:
        os.close(fd)

    pcfs.cut()

    assert (root / "f").read_bytes() == b"durable"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_keep_prefix_keeps_a_prefix_of_unsynced_appends_and_never_unwritten_bytes(tmp_path: Path, seed: int) -> None:
    require()
    base = b"BASE:"
    with PowerCutFS(tmp_path / "mnt", seed=seed) as fs:
        path = fs.mountpoint / "log"
        write_file(path, base, fsync=True)
        fsync_dir(fs.mountpoint)
        kept_lengths = []
        for round_ in range(6):
            write_file(path, base, fsync=True)
            full = bytearray(base)
            with open(path, "ab", buffering=0) as f:
                for i in range(8):
                    chunk = bytes([ord("a") + (round_ + i) % 26]) * (1 + (i * 7 + round_) % 23)
                    f.write(chunk)
                    full += chunk

            counts = fs.cut(keep_prefix=True)

            got = path.read_bytes()
            assert got.startswith(base) and full.startswith(got), (seed, round_, got, bytes(full))
            assert counts["kept_prefix_bytes"] == len(got) - len(base)
            kept_lengths.append(len(got))
        assert any(n > len(base) for n in kept_lengths), kept_lengths  # it keeps something, not always all
        assert len(set(kept_lengths)) > 1, kept_lengths


@pytest.mark.parametrize("seed", [4, 5])
def test_keep_prefix_of_overwrites_is_an_in_order_prefix_with_at_most_the_last_write_torn(tmp_path: Path,
                                                                                         seed: int) -> None:
    require()
    rng = random.Random(seed)
    with PowerCutFS(tmp_path / "mnt", seed=seed) as fs:
        path = fs.mountpoint / "data"
        for round_ in range(5):
            base = b"." * 64
            write_file(path, base, fsync=True)
            fsync_dir(fs.mountpoint)
            writes = [(rng.randrange(0, 96), bytes([ord("A") + (k + round_) % 26]) * rng.randrange(1, 24))
                      for k in range(6)]
            fd = os.open(path, os.O_WRONLY)
            try:
                for offset, data in writes:
                    os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

            fs.cut(keep_prefix=True)

            candidates = set()
            state = bytearray(base)
            for offset, data in writes + [(0, b"")]:
                for part in range(len(data)):  # the next write torn after `part` bytes (0: not applied at all)
                    torn = bytearray(state)
                    if part:
                        torn[len(torn):offset] = bytes(max(0, offset - len(torn)))
                        torn[offset:offset + part] = data[:part]
                    candidates.add(bytes(torn))
                candidates.add(bytes(state))
                state[len(state):offset] = bytes(max(0, offset - len(state)))
                state[offset:offset + len(data)] = data
            assert path.read_bytes() in candidates, (seed, round_, writes)


@pytest.mark.parametrize("keep_prefix", [False, True])
def test_sqlite_wal_synchronous_full_committed_transactions_survive_a_cut(pcfs: PowerCutFS,
                                                                          keep_prefix: bool) -> None:
    db = pcfs.mountpoint / "state.db"
    child = textwrap.dedent("""
        import sqlite3, sys, time
        db = sys.argv[1]
        con = sqlite3.connect(db, isolation_level=None)
        assert con.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
        con.execute("pragma synchronous=full")
        con.execute("create table t(i integer primary key, v text)")  # the WAL's creation fsyncs the directory
        for i in range(40):
            con.execute("begin")
            con.execute("insert into t(v) values (?)", (f"row {i} " + "x" * 500,))
            con.execute("commit")
        con.execute("begin")
        con.execute("insert into t(v) values ('never committed')")
        print("committed", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "committed\n"
    finally:
        proc.kill()
        proc.wait()
    assert pcfs.stats()["fdatasync"] + pcfs.stats()["fsync"] >= 40

    pcfs.cut(keep_prefix=keep_prefix)

    con = sqlite3.connect(db)
    try:
        assert con.execute("pragma integrity_check").fetchall() == [("ok",)]
        rows = [v for (v,) in con.execute("select v from t order by i")]
    finally:
        con.close()
    assert [r.split(" x")[0] for r in rows] == [f"row {i}" for i in range(40)]


def test_git_init_add_and_write_tree_work_on_the_mount(pcfs: PowerCutFS, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {**os.environ, "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}

    def tree_of(repo: Path) -> str:
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
        (repo / "src").mkdir()
        (repo / "src" / "main.py").write_text("print('hello')\n")
        (repo / "README").write_text("readme\n")
        subprocess.run(["git", "-c", "core.fsync=loose-object", "add", "-A"], check=True, cwd=repo, env=env)
        done = subprocess.run(["git", "write-tree"], check=True, cwd=repo, env=env, capture_output=True, text=True)
        return done.stdout.strip()

    tree = tree_of(pcfs.mountpoint / "repo")

    assert tree == tree_of(tmp_path / "plain")
    listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", tree], check=True, cwd=pcfs.mountpoint / "repo",
                             env=env, capture_output=True, text=True).stdout.split()
    assert listing == ["README", "src/main.py"]
    stats = pcfs.stats()
    assert stats["fsync"] + stats["fdatasync"] >= 2  # core.fsync=loose-object: git fsync'd both blobs on the mount


@pytest.mark.parametrize("kind", ["flock", "lockf"])
def test_flock_works_between_two_processes_on_the_mount(pcfs: PowerCutFS, kind: str) -> None:
    path = pcfs.mountpoint / "lock"
    path.write_bytes(b"")
    child = textwrap.dedent(f"""
        import fcntl, sys
        f = open(sys.argv[1], "r+")
        fcntl.{kind}(f, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    lock = getattr(fcntl, kind)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        with open(path, "r+") as f:
            with pytest.raises(BlockingIOError):
                lock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert proc.stdin is not None
            proc.stdin.close()
            assert proc.wait(timeout=10) == 0
            lock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the holder
    finally:
        proc.kill()
        proc.wait()


def test_stop_leaves_no_mount(tmp_path: Path) -> None:
    require()
    fs = PowerCutFS(tmp_path / "mnt", seed=1).start()
    (fs.mountpoint / "f").write_bytes(b"x")
    fs.cut()
    pid = fs.pid
    assert pid is not None and FSTYPE in mounted_at(fs.mountpoint)

    fs.stop()
    fs.stop()  # idempotent

    assert str(fs.mountpoint) not in Path("/proc/mounts").read_text()
    assert fs.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_killed_daemon_leaves_no_mount(tmp_path: Path) -> None:
    require()
    fs = PowerCutFS(tmp_path / "mnt", seed=1).start()
    try:
        fs.cut()  # two mounts made over its life: the reaper knows both
        assert fs.pid is not None
        os.kill(fs.pid, signal.SIGKILL)

        wait_sync(lambda: str(fs.mountpoint) not in Path("/proc/mounts").read_text(), "the reaper's unmount")
    finally:
        fs.stop()


def test_a_file_unlinked_while_open_stays_usable_and_has_no_name_to_survive(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "f", b"data", fsync=True)
    fsync_dir(root)
    fd = os.open(root / "f", os.O_RDWR)
    try:
        os.unlink(root / "f")
        os.write(fd, b"DATA")
        os.fchmod(fd, 0o600)
        assert os.fstat(fd).st_nlink == 0 and os.fstat(fd).st_size == 4
        assert os.listdir(root) == []  # libfuse's .fuse_hidden name is the unlink it stands for
        fsync_dir(root)
    finally:
        os.close(fd)

    pcfs.cut()

    assert os.listdir(root) == []


def test_a_cut_with_a_process_still_inside_freezes_it_and_remounts_anyway(pcfs: PowerCutFS) -> None:
    root = pcfs.mountpoint
    write_file(root / "f", b"durable", fsync=True)
    fsync_dir(root)
    child = textwrap.dedent("""
        import os, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        print("open", flush=True)
        sys.stdin.readline()
        try:
            os.write(fd, b"after the cut")
            print("written", flush=True)
        except OSError as e:
            print(e.errno, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(root / "f")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline() == "open\n"

        pcfs.cut()

        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == f"{errno.EIO}\n"  # the power is gone for whoever was still inside
    finally:
        proc.kill()
        proc.wait()
    assert (root / "f").read_bytes() == b"durable"
    assert pcfs.stats()["stuck_threads"] == 1


def test_require_fails_instead_of_skipping_when_the_environment_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import powercut_fs

    monkeypatch.setattr(powercut_fs, "unavailable", lambda: "no /dev/fuse")
    monkeypatch.delenv("CAIRN_REQUIRE_POWERCUT", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no /dev/fuse"):
        powercut_fs.require()
    monkeypatch.setenv("CAIRN_REQUIRE_POWERCUT", "1")
    with pytest.raises(pytest.fail.Exception, match="no /dev/fuse"):
        powercut_fs.require()
