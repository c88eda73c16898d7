"""A real terminal for the tests that drive the TUI as a person would: tmux where it is installed (CI's machines), else
a pseudo-terminal whose output a Python terminal emulator (`pyte`, in the test extra) turns into a screen.

Both sit behind one small interface (`Terminal`): start a command at a size, send keys or text, read the screen as
text, resize, close the terminal (the program gets SIGHUP, as when a window is closed), and close everything.
`CAIRN_TEST_TERMINAL=tmux|pty` chooses one; unset, tmux when it is on PATH, else the pty.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import shutil
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Protocol

WIDTH, HEIGHT = 140, 36
WAIT = 20.0  # seconds: generous for a loaded CI machine; the normal case is a second or two


class Terminal(Protocol):
    def start(self, name: str, cwd: Path, command: str) -> int:
        """A terminal called `name` running the shell command `command` (exec'd: the returned pid is the program's);
        once the program exits, its last screen stays readable."""

    def send_keys(self, name: str, *keys: str) -> None:
        """Each of `keys` is a key name as tmux spells it (`Enter`, `Tab`, `Escape`, `C-q`, `Up`, …) or else text."""

    def send_text(self, name: str, text: str) -> None:
        """`text` typed literally, character by character as one write (`send-keys -l`)."""

    def screen(self, name: str) -> str:
        """The visible screen, one line per row, trailing blanks of each row removed."""

    def running(self, name: str) -> bool:
        """Whether the program started in `name` still runs."""

    def resize(self, name: str, width: int, height: int) -> None: ...

    def close_terminal(self, name: str) -> None:
        """The terminal goes away (a closed window): the program in it gets SIGHUP."""

    def close(self) -> None:
        """Every terminal goes away; what was started in them is gone or going."""

    def wait_screen(self, name: str, *needles: str, timeout: float = WAIT) -> str: ...


def terminal(env: dict[str, str], width: int = WIDTH, height: int = HEIGHT) -> Terminal:
    """The terminal these tests use: `CAIRN_TEST_TERMINAL` (`tmux` or `pty`), else tmux if installed, else the pty.
    `env` is the environment of every program started in it."""
    kind = os.environ.get("CAIRN_TEST_TERMINAL") or ("tmux" if shutil.which("tmux") else "pty")
    if kind == "tmux":
        return Tmux(env, width, height)
    if kind == "pty":
        return PtyTerminal(env, width, height)
    raise AssertionError(f"CAIRN_TEST_TERMINAL={kind!r}: expected `tmux` or `pty`")


SHELLS = {"sh", "bash", "dash", "zsh", ""}


def exec_done(pid: int, timeout: float = WAIT) -> int:
    """`pid` once the shell that started it has exec'd the command (its argv[0] is no longer a shell; mid-exec it
    reads empty): until then /proc shows the shell, not the program the caller asked about. A process gone returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except (FileNotFoundError, ProcessLookupError):
            return pid
        if os.path.basename(argv0).decode(errors="replace") not in SHELLS:
            return pid
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not exec its command within {timeout:.0f} s")


class _Waiting:
    def wait_screen(self, name: str, *needles: str, timeout: float = WAIT) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen(name)  # type: ignore[attr-defined]
            if all(n in text for n in needles):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {needles} on screen {name}; it shows:\n{text}")
            time.sleep(0.05)


class Tmux(_Waiting):
    """One private tmux server (its own socket), so parallel or leftover runs never collide."""

    def __init__(self, env: dict[str, str], width: int = WIDTH, height: int = HEIGHT) -> None:
        assert shutil.which("tmux"), "this terminal needs tmux (apt-get install tmux, or CAIRN_TEST_TERMINAL=pty)"
        self.socket = f"cairn-test-{secrets.token_hex(4)}"
        self.env = env
        self.width, self.height = width, height

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, f"tmux {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def start(self, name: str, cwd: Path, command: str) -> int:
        self("new-session", "-d", "-s", name, "-x", str(self.width), "-y", str(self.height), "-c", str(cwd),
             f"exec {command}")
        self("set-option", "-t", name, "remain-on-exit", "on")  # a crash stays readable on screen
        return exec_done(self.pid(name))

    def pid(self, name: str) -> int:
        return int(self("display-message", "-p", "-t", name, "#{pane_pid}").strip())

    def send_keys(self, name: str, *keys: str) -> None:
        self("send-keys", "-t", name, *keys)

    def send_text(self, name: str, text: str) -> None:
        self("send-keys", "-t", name, "-l", text)

    def screen(self, name: str) -> str:
        return self("capture-pane", "-p", "-t", name)

    def running(self, name: str) -> bool:
        return self("display-message", "-p", "-t", name, "#{pane_dead}").strip() != "1"

    def resize(self, name: str, width: int, height: int) -> None:
        self("resize-window", "-t", name, "-x", str(width), "-y", str(height))

    def close_terminal(self, name: str) -> None:
        self("kill-session", "-t", name)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=10)


# -- a pseudo-terminal read by pyte ----------------------------------------------------------------------------------

_NAMED = {"Enter": "\r", "Tab": "\t", "BTab": "\x1b[Z", "Escape": "\x1b", "Space": " ", "BSpace": "\x7f",
          "Up": "\x1b[A", "Down": "\x1b[B", "Right": "\x1b[C", "Left": "\x1b[D", "Home": "\x1b[H", "End": "\x1b[F",
          "IC": "\x1b[2~", "DC": "\x1b[3~", "PPage": "\x1b[5~", "PageUp": "\x1b[5~", "NPage": "\x1b[6~",
          "PageDown": "\x1b[6~"}


def key_bytes(key: str) -> bytes:
    """What a terminal sends for a tmux key name; anything that is not one is text."""
    if key in _NAMED:
        return _NAMED[key].encode()
    if len(key) == 3 and key[:2] == "C-" and key[2].isalpha():
        return bytes([ord(key[2].lower()) - 96])
    if len(key) == 3 and key[:2] == "M-":
        return b"\x1b" + key[2].encode()
    return key.encode()


def _set_size(fd: int, width: int, height: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


def _take_terminal() -> None:  # in the child, after setsid(): its stdin (the pty) becomes its controlling terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Pane:
    def __init__(self, cwd: Path, command: str, env: dict[str, str], width: int, height: int) -> None:
        import pyte

        class Screen(pyte.Screen):
            def write_process_input(screen, data: str) -> None:  # answers to the program's queries (DA, DSR)
                self._write(data.encode())

        self.screen = Screen(width, height)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.master, slave = os.openpty()
        _set_size(slave, width, height)
        env = {"TERM": "xterm-256color", **env}
        try:
            self.proc = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], cwd=cwd, env=env, stdin=slave,
                                         stdout=slave, stderr=slave, start_new_session=True,
                                         preexec_fn=_take_terminal)
        finally:
            os.close(slave)
        self.hung_up = False
        self.raw = bytearray()  # every byte the program wrote (escape sequences a screen does not keep: OSC 52)
        self._stop = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"pty reader {self.proc.pid}")
        self.reader.start()

    def _write(self, data: bytes) -> None:
        if not self.hung_up:
            os.write(self.master, data)

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                return
            if not data:
                return
            with self.lock:
                self.raw += data
                self.stream.feed(data)

    def text(self) -> str:
        with self.lock:
            return "\n".join(line.rstrip() for line in self.screen.display)

    def resize(self, width: int, height: int) -> None:
        with self.lock:
            self.screen.resize(height, width)
        _set_size(self.master, width, height)  # the kernel sends SIGWINCH to the terminal's foreground group

    def hang_up(self) -> None:
        """Close the terminal's master side: the kernel hangs the terminal up and sends SIGHUP to the program (the
        session leader), as a closed window or `tmux kill-session` does."""
        if self.hung_up:
            return
        self._stop.set()
        self.reader.join(timeout=5)
        self.hung_up = True
        os.close(self.master)

    def close(self) -> None:
        self.hang_up()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class PtyTerminal(_Waiting):
    """Each named terminal is a pseudo-terminal of its own at the given size; a thread per terminal feeds what the
    program writes to a `pyte` screen. The program is its session's leader with the pty as controlling terminal."""

    def __init__(self, env: dict[str, str], width: int = WIDTH, height: int = HEIGHT) -> None:
        self.env = env
        self.width, self.height = width, height
        self.panes: dict[str, _Pane] = {}

    def start(self, name: str, cwd: Path, command: str) -> int:
        assert name not in self.panes, f"a terminal {name!r} is already open"
        pane = self.panes[name] = _Pane(cwd, command, self.env, self.width, self.height)
        return exec_done(pane.proc.pid)

    def send_keys(self, name: str, *keys: str) -> None:
        self.panes[name]._write(b"".join(key_bytes(k) for k in keys))

    def send_text(self, name: str, text: str) -> None:
        self.panes[name]._write(text.encode())

    def screen(self, name: str) -> str:
        return self.panes[name].text()

    def running(self, name: str) -> bool:
        return self.panes[name].proc.poll() is None

    def resize(self, name: str, width: int, height: int) -> None:
        self.panes[name].resize(width, height)

    def close_terminal(self, name: str) -> None:
        self.panes[name].hang_up()

    def close(self) -> None:
        for pane in self.panes.values():
            try:
                pane.close()
            except OSError:
                pass
        self.panes.clear()

