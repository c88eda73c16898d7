"""P13 takeover: how long after a host is cut off another host can resume its session (SPEC §13 rev 4, issue 43).

Two hosts in network namespaces (tests/pg_hosts.py), connected straight to a private PostgreSQL server listening on their
links. In each trial hostA's `cairn run` is inside a long `run_command` when its end of the link goes down (no FIN, no
RST: the server learns of it only through the TCP keepalives Cairn sets); hostB runs `cairn run --resume` in a loop
until it succeeds. Measured from the cut: when the server dropped hostA's lock (pg_locks, polled every 50 ms) and when
hostB's resume had finished. Then hostA's link comes back and its tool ends: it must be fenced (exit 3).

The baseline is the bound Cairn's keepalive settings give (idle + interval x count, postgres_connections); the target
is 30 s. Needs root (`ip netns`). Usage: python bench/p13_takeover.py [--trials N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit, header, median, temp_dir  # noqa: E402  (loads the checkout's cairn package)
from crash_harness import wait_until  # noqa: E402
from pg_helpers import PrivateServer, stored_rows  # noqa: E402
from pg_hosts import Host, direct_server, holders_on, long_call, script, two_hosts  # noqa: E402

from cairn.persistence.postgres_connections import KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL  # noqa: E402

TARGET_S = 30.0


def trial(n: int, root: Path, a: Host, b: Host, server: PrivateServer) -> dict:
    """One cut of hostA mid-tool, hostB's resume loop, hostA back and fenced."""
    session = f"p13-{n}"
    started, go = root / f"started-{n}", root / f"go-{n}"
    first = script(root / f"a-{n}.json", long_call(started, go), {"text": "hostA's answer"})
    second = script(root / f"b-{n}.json", {"text": "hostB's answer"})
    with open(root / f"a-{n}.err", "w") as err:
        child = subprocess.Popen(a.command("run", "--session-id", session, "--provider", "script", "--script",
                                           str(first), "--yes", "run the long command"),
                                 cwd=a.workspace, env=a.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=err)
    try:
        wait_until(lambda: started.exists() and "tool/call" in [k for _, k, _ in stored_rows(server.url, session)],
                   "hostA's tool to start", timeout=60)
        released: list[float] = []

        def watch(cut_at: float) -> None:
            while not released and time.monotonic() - cut_at < 120:
                if not holders_on(server.url, "hostA"):
                    released.append(time.monotonic() - cut_at)
                time.sleep(0.05)

        a.cut()
        cut_at = time.monotonic()
        watcher = threading.Thread(target=watch, args=(cut_at,), daemon=True)
        watcher.start()
        attempts = 0
        while True:
            attempts += 1
            done = b.cairn("run", "--resume", session, "--provider", "script", "--script", str(second), "carry on")
            if done.returncode == 0:
                resumed = time.monotonic() - cut_at
                break
            assert done.returncode == 3 and "on host hostA" in done.stderr, done.stderr
            assert time.monotonic() - cut_at < 120, "hostB could not resume within 120 s"
        watcher.join()
        a.restore()
        go.write_text("")
        code = child.wait(timeout=120)
        lines = [line for line in (root / f"a-{n}.err").read_text().splitlines() if "taken over" in line]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return {"lock_released_s": released[0] if released else float("nan"), "resumed_s": resumed,
            "attempts": attempts, "fenced_exit": code, "fenced_line": lines[-1] if lines else ""}


LISTENER = ("import sys, time\n"
            "from cairn.persistence.postgres import PostgresBackend\n"
            "conn = PostgresBackend(sys.argv[1]).connect('follow')\n"
            "conn.execute('LISTEN p13_busy')\n"
            "print(conn.info.backend_pid, flush=True)\n"
            "time.sleep(600)\n")


def busy_trial(a: Host, server: PrivateServer) -> float:
    """The other case: a cut host whose connection has data in flight. hostA holds a Cairn connection LISTENing (as a
    follower does) when it is cut, and notifications keep coming: the server's unacknowledged data stops its
    keepalives, and only `tcp_user_timeout` ends the connection. Seconds from the cut until its backend is gone."""
    import psycopg

    child = subprocess.Popen(["ip", "netns", "exec", a.netns, sys.executable, "-c", LISTENER, a.url],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        backend = int(child.stdout.readline())
        with psycopg.connect(server.url, autocommit=True) as conn:
            a.cut()
            cut_at = time.monotonic()
            while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone():
                conn.execute("SELECT pg_notify('p13_busy', repeat('x', 7000))")
                assert time.monotonic() - cut_at < 300, "the server kept a cut-off host's busy connection for 300 s"
                time.sleep(0.2)
            gone = time.monotonic() - cut_at
        a.restore()
        return gone
    finally:
        child.kill()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    trials = parser.parse_args().trials
    bound = float(KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT)
    with temp_dir("p13-takeover") as root:
        header("P13 takeover after a host is cut off (network namespace link down)", root)
        print(f"   keepalives: idle {KEEPALIVE_IDLE} s, interval {KEEPALIVE_INTERVAL} s, count {KEEPALIVE_COUNT}; "
              f"bound {bound:g} s; target {TARGET_S:g} s")
        results = []
        with two_hosts(root, "public") as (a, b), direct_server(a, b) as server:
            a, b = replace(a, url=a.direct_url()), replace(b, url=b.direct_url())
            for n in range(trials):
                result = trial(n, root, a, b, server)
                results.append(result)
                print(f"   trial {n}: lock released after {result['lock_released_s']:.1f} s, hostB resumed after "
                      f"{result['resumed_s']:.1f} s ({result['attempts']} attempts); hostA fenced with exit "
                      f"{result['fenced_exit']}: {result['fenced_line'][:100]}")
            busy = busy_trial(a, server)
            print(f"   busy connection (notifications in flight when cut): dropped by the server after {busy:.1f} s")
    resumed = [r["resumed_s"] for r in results]
    released = [r["lock_released_s"] for r in results]
    fenced = all(r["fenced_exit"] == 3 for r in results)
    print(f"   takeover: median {median(resumed):.1f} s, max {max(resumed):.1f} s (lock released: median "
          f"{median(released):.1f} s, max {max(released):.1f} s); every cut-off writer fenced: {fenced}")
    ok = max(resumed) <= TARGET_S and busy <= TARGET_S and fenced
    emit("p13_takeover", max(resumed), "s", bound, TARGET_S, ok,
         median_s=median(resumed), max_s=max(resumed), lock_released_median_s=median(released),
         lock_released_max_s=max(released), trials=len(results), fenced=fenced, busy_dropped_s=busy)


if __name__ == "__main__":
    main()
