"""Two machines sharing one PostgreSQL database, for the tests and bench/p13_takeover.py: two network namespaces made
with `ip netns` play two hosts, each running the real `cairn` under its own host name (a UTS namespace) with its own
CAIRN_HOME, so the only thing they share is the database.

Each namespace gets a veth pair with point-to-point addresses in a private /24 made up here (checked unused on this
machine, and covered by an `unreachable` route so nothing addressed to it can ever leave through a real interface).
The shared server listens on 127.0.0.1 only, which a namespace cannot reach, so a small TCP forwarder on the host side
carries each namespace's connections to it (`Host.url`). A forwarder is not a router, though: the server's end of a
connection is the forwarder's, which never vanishes. To cut a host off for real (no FIN or RST reaches the server,
`Host.cut`), `direct_server` starts a private server listening on the host-side veth addresses themselves
(`Host.direct_url`). Everything is torn down in a `finally`. `two_hosts` skips only when `ip netns add` is not
permitted (an unprivileged container); any other failure is a failure.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from pg_helpers import PG_URL, PrivateServer, connect_to, schema_url

CAIRN = str(Path(sys.executable).parent / "cairn")
DIRECT_PORT = 5432  # on the hosts' link addresses only, which nothing else on this machine has


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check:
        assert proc.returncode == 0, f"ip {' '.join(args)}: {proc.stderr.strip()}"
    return proc


class Forwarder:
    """Accepts on given host-side addresses and pipes each connection to the real server, byte for byte, one thread
    per direction. Either side closing closes both, as a router would pass a FIN or a RST on: a host torn down drops
    its database connections, and with them its advisory locks."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listeners: list[socket.socket] = []
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False

    def listen(self, address: str) -> int:
        listener = socket.create_server((address, 0))
        self.listeners.append(listener)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener.getsockname()[1]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return
            up = self._connect_upstream()
            if up is None:
                down.close()
                continue
            # a peer that vanishes without a FIN is noticed within seconds (the server would do the same on its side)
            down.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in ((socket.TCP_KEEPIDLE, 2), (socket.TCP_KEEPINTVL, 1), (socket.TCP_KEEPCNT, 3)):
                down.setsockopt(socket.IPPROTO_TCP, option, value)
            with self.lock:
                if self.closed:
                    down.close(), up.close()
                    return
                self.sockets += [down, up]
            threading.Thread(target=self._pipe, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down), daemon=True).start()

    def _connect_upstream(self) -> socket.socket | None:
        """A connection to the real server, tried a few times: on a loaded machine one attempt failing (a full accept
        queue, a refused SYN) must not look to the client like the server closing on it — a router would not answer
        before the server did either. Each failure is printed, so a test that still fails shows why."""
        for attempt in range(5):
            try:
                up = socket.create_connection(self.target, timeout=10)
                up.settimeout(None)
                return up
            except OSError as e:
                print(f"pg_hosts forwarder: connecting to {self.target} failed (attempt {attempt + 1}): {e!r}",
                      file=sys.stderr, flush=True)
                time.sleep(0.2 * (attempt + 1))
        return None

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            sockets, self.sockets = self.sockets, []
        for s in self.listeners + sockets:
            try:
                s.close()
            except OSError:
                pass


@dataclass
class Host:
    """One namespace playing one machine: `name` is its host name, `url` reaches the database through the forwarder;
    `gateway` is the host-side address of its link, `inside` the namespace's end of it."""

    name: str
    netns: str
    url: str
    home: Path
    workspace: Path
    gateway: str = ""
    inside: str = ""

    def command(self, *args: str) -> list[str]:
        # `ip netns exec` and `unshare` exec rather than fork, and so does the shell: the pid is cairn's own
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.name, CAIRN, *args]

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8", "CAIRN_HOME": str(self.home),
                "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": self.url, "CAIRN_DEMO_DELAY_MS": "0",
                "CAIRN_SNAPSHOTS": "off", "CAIRN_PROJECT_CONTEXT": os.environ.get("CAIRN_PROJECT_CONTEXT", "on"),
                **extra}  # (tests/conftest.py turns project context off)

    def cairn(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), env=self.env(), cwd=self.workspace, capture_output=True, text=True,
                              timeout=90)

    def pids(self) -> list[int]:
        return [int(p) for p in ip("netns", "pids", self.netns, check=False).stdout.split()]

    def cut(self) -> None:
        """Cut the host off: its end of the link goes down, so nothing it sends leaves and nothing reaches it, and no
        FIN or RST is sent for its connections (its processes and sockets live on, as on a laptop that lost WiFi)."""
        ip("-n", self.netns, "link", "set", self.inside, "down")

    def restore(self) -> None:
        """Bring its link back (the kernel puts the link's peer route back with it)."""
        ip("-n", self.netns, "link", "set", self.inside, "up")

    def direct_url(self) -> str:
        """The database of `direct_server`, reached straight over this host's link (no forwarder in between)."""
        return f"postgresql://postgres@{self.gateway}:{DIRECT_PORT}/postgres"


def free_subnet() -> str:
    """`10.X.Y` of a /24 no address or route of this machine touches."""
    used = ip("-4", "addr").stdout + ip("-4", "route").stdout
    for _ in range(100):
        prefix = f"10.{random.randint(100, 254)}.{random.randint(0, 255)}"
        if f" {prefix}." not in used:
            return prefix
    raise AssertionError("no unused private /24 found")


@contextmanager
def two_hosts(root: Path, schema: str) -> Iterator[tuple[Host, Host]]:
    tag = secrets.token_hex(3)
    probe = ip("netns", "add", f"cairn-{tag}-a", check=False)
    if probe.returncode != 0:
        if "not permitted" in probe.stderr.lower() or "permission denied" in probe.stderr.lower():
            pytest.skip(f"`ip netns add` is not permitted here ({probe.stderr.strip()}): no second host to test from")
        raise AssertionError(f"ip netns add: {probe.stderr.strip()}")
    made: list[str] = [f"cairn-{tag}-a"]
    links: list[str] = []
    route: str | None = None
    forwarder = Forwarder(("127.0.0.1", urlsplit(PG_URL).port or 5432))
    try:
        ip("netns", "add", f"cairn-{tag}-b")
        made.append(f"cairn-{tag}-b")
        prefix = free_subnet()
        route = f"{prefix}.0/24"
        ip("route", "add", "unreachable", route)
        hosts = []
        for n, (letter, name) in enumerate((("a", "hostA"), ("b", "hostB"))):
            netns, outside, inside = f"cairn-{tag}-{letter}", f"cv{tag}{letter}", f"cn{tag}{letter}"
            near, far = f"{prefix}.{2 * n + 1}", f"{prefix}.{2 * n + 2}"
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            links.append(outside)
            ip("link", "set", inside, "netns", netns)
            ip("addr", "add", near, "peer", f"{far}/32", "dev", outside)
            ip("link", "set", outside, "up")
            for args in (("addr", "add", far, "peer", f"{near}/32", "dev", inside), ("link", "set", inside, "up"),
                         ("link", "set", "lo", "up")):
                ip("-n", netns, *args)
            port = forwarder.listen(near)
            base = urlsplit(PG_URL)
            url = schema_url(schema, f"postgresql://{base.username or 'postgres'}@{near}:{port}{base.path}")
            home, workspace = root / name / "home", root / name / "project"
            workspace.mkdir(parents=True)
            hosts.append(Host(name, netns, url, home, workspace, near, inside))
        yield hosts[0], hosts[1]
    finally:
        for netns in made:
            for pid in Host("", netns, "", root, root).pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", netns, check=False)  # takes its end of the veth, and so the pair, with it
        for link in links:
            ip("link", "del", link, check=False)  # already gone unless the namespace never got its end
        if route:
            ip("route", "del", "unreachable", route, check=False)
        forwarder.close()


def holders_on(url: str, host: str) -> list[int]:
    """Backends holding an advisory lock for a process on `host` (the lock connection's application_name)."""
    with connect_to(url) as conn:
        rows = conn.execute(
            "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s", (f"cairn {host} %",),
        ).fetchall()
    return [r[0] for r in rows]


def stored(url: str, session_id: str) -> tuple[str, list[str]]:
    with connect_to(url) as conn:
        cwd = conn.execute("SELECT cwd FROM sessions WHERE id = %s", (session_id,)).fetchone()[0]
        types = [r[0] for r in conn.execute("SELECT type FROM events WHERE session_id = %s ORDER BY seq",
                                            (session_id,)).fetchall()]
    return cwd, types


@contextmanager
def direct_server(*hosts: Host) -> Iterator[PrivateServer]:
    """A private server (never the shared one) listening on the hosts' gateway addresses, and accepting connections
    from their links (trust, like the test servers): each host's connections end at the server itself, so a cut host
    is one the server has to notice (its TCP keepalives) rather than the forwarder."""
    server = PrivateServer({"listen_addresses": ",".join(h.gateway for h in hosts)})
    try:
        with open(server.data / "pg_hba.conf", "a") as hba:
            for h in hosts:
                hba.write(f"host all all {h.gateway.rsplit('.', 1)[0]}.0/24 trust\n")
        server.start()
        yield server
    finally:
        server.stop()


# -- a long tool call to cut a host off in (tests/test_postgres_takeover.py, bench/p13_takeover.py) --------------------


def script(path: Path, *responses: dict) -> Path:
    path.write_text(json.dumps({"responses": list(responses)}))
    return path


def long_call(started: Path, go: Path) -> dict:
    """A model answer calling `run_command` with a body that runs until the test says so (a file appears)."""
    command = f"echo started > {started}; while [ ! -e {go} ]; do sleep 0.1; done; echo finished"
    return {"text": "", "tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}
