"""Two machines sharing one PostgreSQL database (issue 18): two network namespaces play two hosts, each running the real
`cairn` under its own host name with its own CAIRN_HOME, so the only thing they share is the database (tests/pg_hosts.py
makes them: veth pairs, a forwarder to the shared server, UTS namespaces). The test skips only when `ip netns add` is
not permitted (an unprivileged container); any other failure is a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from crash_harness import failpoint_line, wait_until
from pg_helpers import fresh_schema
from pg_hosts import holders_on, ip, stored, two_hosts

pytestmark = pytest.mark.slow

WAIT = 30.0  # seconds; generous for a loaded 2-core machine


def test_two_hosts_one_writer_and_a_session_resumed_on_the_other_after_the_first_is_gone(tmp_path):
    """hostA's `cairn run` stops live in a turn; hostB's writer is refused (exit 3, naming hostA and its pid), while
    hostB can list and read the session with hostA's cwd. hostA is then torn down (its processes killed, its namespace
    and link deleted): its connections drop, the server releases the lock, and hostB resumes the session, repairing
    the interrupted turn and adding its own."""
    with fresh_schema("hosts") as (schema, url), two_hosts(tmp_path, schema) as (a, b):
        marker = tmp_path / "marker"
        marker.write_text("")
        err = (tmp_path / "a.err").open("w")
        child = subprocess.Popen(
            a.command("run", "--session-id", "shared", "--provider", "demo", "hello from A"), cwd=a.workspace,
            env=a.env(CAIRN_FAILPOINT="prompt-accepted", CAIRN_FAILPOINT_MARKER=str(marker)),
            stdout=subprocess.DEVNULL, stderr=err,
        )
        err.close()
        try:
            wait_until(lambda: marker.read_text() == failpoint_line("prompt-accepted", "shared", child.pid) or
                       child.poll() is not None, "hostA to hold the session", timeout=WAIT)
            assert child.poll() is None, (tmp_path / "a.err").read_text()
            assert holders_on(url, "hostA"), "hostA's lock connection is not named after hostA"

            refused = b.cairn("run", "--resume", "shared", "--provider", "demo", "hello from B")
            assert refused.returncode == 3, refused.stderr
            assert f"live in process {child.pid} on host hostA" in refused.stderr, refused.stderr
            assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr and refused.stdout == ""
            listed = b.cairn("sessions", "--all")
            assert listed.returncode == 0, listed.stderr
            assert "shared" in listed.stdout and "live" in listed.stdout and str(a.workspace) in listed.stdout
            shown = b.cairn("show", "shared")
            assert shown.returncode == 0 and "hello from A" in shown.stdout, shown.stderr
            cwd, before = stored(url, "shared")
            assert cwd == str(a.workspace) and before[:3] == ["turn/start", "step/start", "user/message"]
            assert "turn/end" not in before  # the refused writer repaired nothing

            # hostA goes away: every process in it killed, then the namespace with its end of the link
            for pid in a.pids():
                os.kill(pid, signal.SIGKILL)
            assert child.wait(timeout=WAIT) == -signal.SIGKILL
            ip("netns", "del", a.netns)
            link = f"cv{a.netns.split('-')[1]}a"  # the kernel frees a deleted namespace, and its links, a moment later
            wait_until(lambda: ip("link", "show", link, check=False).returncode != 0, "hostA's link to go with it",
                       timeout=WAIT)
            wait_until(lambda: not holders_on(url, "hostA"), "the server to drop hostA's lock", timeout=WAIT)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()

        resumed = b.cairn("run", "--resume", "shared", "--provider", "demo", "hello from B")
        assert resumed.returncode == 0, resumed.stderr
        cwd, after = stored(url, "shared")
        assert cwd == str(a.workspace)  # the session keeps the cwd it had where it was made
        assert after[: len(before)] == before
        repaired, added = after[len(before):len(before) + 2], after[len(before) + 2:]
        assert repaired == ["step/end", "turn/end"], after
        assert added[0] == "turn/start" and added[-1] == "turn/end" and "user/message" in added, after
        assert not holders_on(url, "hostB")  # and hostB let go when it finished
