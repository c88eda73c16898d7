"""One promise on every backend (SPEC rev 3 §5): the same suite over JSONL, SQLite and PostgreSQL, through the real CLI.

The lock: while a writer lives, deleting or replacing its lock file, or coming from another host name, lets no second
writer in and `cairn rm` deletes nothing (exit 3, one line naming the live process); the check rests on what the live
writer holds (JSONL: a flock on the session file; SQLite: a byte of the database file; PostgreSQL: an advisory lock).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_contract import CHILD, ROOT, complete_turn, write_session
from test_hostile_storage import assert_one_line

from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

CAIRN = str(Path(sys.executable).parent / "cairn")
OTHER_HOST = ["unshare", "--uts", "sh", "-c", 'hostname other-host && exec "$0" "$@"']


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend_name(request):
    if request.param == "postgres":
        request.getfixturevalue("pg_database_url")  # CAIRN_DATABASE_URL: a private schema, inherited by children
    return request.param


def cairn(home: Path, backend: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CAIRN_HOME": str(home), "LANG": "C.UTF-8",
           "CAIRN_PROVIDER": "demo", "CAIRN_DEMO_DELAY_MS": "0", "CAIRN_BACKEND": backend}
    if "CAIRN_DATABASE_URL" in os.environ:
        env["CAIRN_DATABASE_URL"] = os.environ["CAIRN_DATABASE_URL"]
    return subprocess.run([*prefix, CAIRN, *args], env=env, cwd=str(home.parent), capture_output=True, text=True,
                          timeout=60)


def wait_for_marker(marker: Path, child: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 30
    while marker.read_text() != "locked\n":
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the holder never took the session"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["lock file deleted", "lock file replaced", "another host name"])
async def test_a_live_writer_keeps_its_session_whatever_happens_to_its_lock_file(tmp_path, backend_name, how):
    home = tmp_path / "home"
    await write_session(SessionStore(home, backend_name), "s", complete_turn(1, "hello"))
    marker = tmp_path / "marker"
    marker.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", CHILD, str(home), backend_name, "s", str(marker)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_marker(marker, holder)
        lock = home / "locks" / "s.lock"
        prefix: tuple[str, ...] = ()
        if how == "lock file deleted":
            lock.unlink()
        elif how == "lock file replaced":
            lock.unlink()
            lock.write_text("1\n")  # a new inode that no one holds, naming another process
        else:
            lock.unlink()
            prefix = tuple(OTHER_HOST)

        resumed = cairn(home, backend_name, "run", "--resume", "s", "second writer", prefix=prefix)
        assert_one_line(resumed, 3, "'s'", str(holder.pid))
        removed = cairn(home, backend_name, "rm", "s", prefix=prefix)
        assert_one_line(removed, 3, "'s'")
        listed = [json.loads(line) for line in cairn(home, backend_name, "sessions", "--all", "--json").stdout.splitlines()]
        assert [(row["id"], row["status"]) for row in listed] == [("s", "live")]
        shown = cairn(home, backend_name, "show", "s", "--json")
        assert shown.returncode == 0 and len(shown.stdout.splitlines()) == 8  # nothing deleted, nothing repaired
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=20)
        holder.stderr.close()

    resumed = cairn(home, backend_name, "run", "--resume", "s", "now it is free")  # the holder is gone: resumable
    assert resumed.returncode == 0, resumed.stderr
    assert cairn(home, backend_name, "rm", "s").returncode == 0
    assert cairn(home, backend_name, "sessions", "--all", "--json").stdout == ""
