"""Copy (SPEC §11: copy): Ctrl+G and `/copy` put the last answer on the clipboard through OSC 52, `c` / `y` on a
focused code block that block, whole. Checked on the bytes the real TUI writes to a pseudo-terminal, through a real
tmux (`show-buffer`) where tmux is installed, and with the pilot for the focus and the keys."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import write_script
from terminal_driver import WAIT, Tmux, _Pane
from tui_helpers import completed_turn, make_world, running, screen_text, submit, wait_for, write_log

from cairn.app.screens.copy import TERMINAL_HINT, clipboard_text, last_answer, notice
from cairn.persistence.events import AssistantMessage
from cairn.widgets.answer_code import FOCUS_MARK
from cairn.widgets.answer_text import AssistantText
from cairn.widgets.prompt_input import PromptInput

CAIRN = str(Path(sys.executable).parent / "cairn")
LONG_CODE = "\n".join(f"print('line {n:03d}, cut into pieces')" for n in range(40))  # (> 1000 chars: 2 pieces)
ANSWER = ("Two ways:\n\n```sh\nls -la | grep '^d'\n```\n\nor, in Python:\n\n```python\n" + LONG_CODE
          + "\n```\n\nEither works.\n")
OSC52 = re.compile(rb"\x1b\]52;c;([A-Za-z0-9+/=]*)(?:\x07|\x1b\\)")


# -- what is copied, and what the notice says -------------------------------------------------------------------------

def test_the_last_answer_is_the_latest_message_with_text():
    events = [AssistantMessage(turn=1, step=1, text="first", tool_calls=[], interrupted=False),
              AssistantMessage(turn=2, step=1, text="second", tool_calls=[], interrupted=False),
              AssistantMessage(turn=2, step=2, text="  ", tool_calls=[], interrupted=False)]
    assert last_answer(events) == "second"
    assert last_answer([]) is None


def test_control_characters_never_reach_the_clipboard_but_tabs_and_lines_do():
    assert clipboard_text("a\x1b]0;pwned\x07b\r\n\tc\x9bd") == "a]0;pwnedb\n\tcd"


def test_the_notice_gives_the_tmux_fix_when_tmux_would_keep_the_copy_and_the_terminal_hint_once():
    said, warning = notice("the last answer", 1234, "external", first=True)
    assert warning and "1,234 characters" in said and "tmux set -g set-clipboard on" in said
    said, warning = notice("the last answer", 5, "on", first=True)
    assert not warning and "set-clipboard" not in said and TERMINAL_HINT not in said
    said, warning = notice("the code block", 5, None, first=True)
    assert not warning and TERMINAL_HINT in said
    said, warning = notice("the code block", 5, None, first=False)
    assert said == "Copied the code block (5 characters) to the clipboard through the terminal (OSC 52)."


# -- the pilot: keys, focus, what lands on the clipboard --------------------------------------------------------------

def toasts(app: object) -> list[str]:
    return [n.message for n in app._notifications]  # type: ignore[attr-defined]


def code_of(text: str, info: str) -> str:
    return text.split(f"```{info}\n", 1)[1].split("```", 1)[0]


@pytest.mark.anyio
async def test_a_focused_code_block_is_marked_and_c_or_y_copies_exactly_that_block(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "code", completed_turn(1, "list directories", ANSWER))
    app = world.resume_app("code")
    async with running(app, (80, 24)) as pilot:
        answers = await wait_for(pilot, lambda: app.chat and list(app.chat.query(AssistantText)), "the answer")
        answer = answers[0]
        assert answer.can_focus and answer.pieces[-1].prefix_lines == 1  # the long block is cut over two pieces
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the prompt focused")
        await pilot.press("tab", "tab")  # (the transcript itself, then the answer: the only other Tab stops)
        await wait_for(pilot, lambda: app.focused is answer, "the answer focused")
        marked = [answer.render_line(y).text for y in range(answer.size.height)]
        assert [line.strip() for line in marked if FOCUS_MARK in line] == [f"{FOCUS_MARK}ls -la | grep '^d'"]
        await pilot.press("c")
        await wait_for(pilot, lambda: app.clipboard == "ls -la | grep '^d'\n", "the first block copied")
        await wait_for(pilot, lambda: any("Copied the code block (19 characters)" in m for m in toasts(app)), "toast")
        await pilot.press("tab")  # the next block of the same answer
        assert app.focused is answer and answer.code_at == 1
        await pilot.press("y")
        await wait_for(pilot, lambda: app.clipboard == code_of(ANSWER, "python"), "the long block copied whole")
        marked = [answer.render_line(y).text for y in range(answer.size.height)]
        assert sum(FOCUS_MARK in line for line in marked) == 40  # every line of it, across the pieces
        await pilot.press("tab")  # past the last block: on to the next widget (the prompt)
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the prompt focused again")
        assert not any(FOCUS_MARK in answer.render_line(y).text for y in range(answer.size.height))
        await pilot.press("ctrl+q")


@pytest.mark.anyio
async def test_ctrl_g_and_slash_copy_copy_the_last_answer(tmp_path):
    world = make_world(tmp_path, [{"text": "The **second** answer."}])
    write_log(world.store, "two", completed_turn(1, "first question", ANSWER))
    app = world.resume_app("two")
    async with running(app, (80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat and app.chat.query(AssistantText), "the answer")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: app.clipboard == ANSWER, "the answer copied")
        await submit(pilot, "second question")
        await wait_for(pilot, lambda: "second answer" in screen_text(app), "the second answer")
        await submit(pilot, "/copy")
        await wait_for(pilot, lambda: app.clipboard == "The **second** answer.", "the second answer copied")
        await pilot.press("ctrl+q")


@pytest.mark.anyio
async def test_copy_before_any_answer_says_there_is_none(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app, (80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat and app.chat.is_mounted, "the chat")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: "No answer to copy yet." in toasts(app), "the notice")
        assert app.clipboard == ""
        await pilot.press("ctrl+q")


# -- the real terminal: OSC 52 on the pty, and tmux's buffer ----------------------------------------------------------

class RawPane(_Pane):
    """The pty terminal of tests/terminal_driver.py, waited on with the raw bytes the program wrote as well."""

    def wait(self, what: str, found, timeout: float = WAIT):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                result = found(bytes(self.raw), "\n".join(line.rstrip() for line in self.screen.display))
            if result:
                return result
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.text()}")


def environment(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
            "TERM": "xterm-256color", "CAIRN_HOME": str(tmp_path / "home"), "CAIRN_SNAPSHOTS": "off"}


def test_ctrl_g_writes_the_answer_as_osc_52_to_the_terminal(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "script.json", [{"text": ANSWER}])
    pane = RawPane(ws, f"{CAIRN} --provider script --script {script}", environment(tmp_path), 100, 30)
    try:
        pane.wait("the chat", lambda raw, screen: "New session" in screen)
        pane._write(b"show me\r")
        pane.wait("the answer", lambda raw, screen: "Either works." in screen)
        pane._write(b"\x07")  # Ctrl+G
        payload = pane.wait("OSC 52", lambda raw, screen: OSC52.search(raw))
        assert base64.b64decode(payload.group(1)).decode() == ANSWER
        pane.wait("the notice", lambda raw, screen: "Copied the last answer" in screen)
        pane._write(b"\x11")  # Ctrl+Q
        pane.proc.wait(timeout=WAIT)
    finally:
        pane.close()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the pty test covers the bytes")
def test_in_tmux_the_copy_lands_in_tmux_buffer_with_set_clipboard_on_and_the_fix_is_said_when_off(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "script.json", [{"text": ANSWER}])
    term = Tmux(environment(tmp_path), 120, 36)
    try:
        term.start("copy", ws, f"{CAIRN} --provider script --script {script}")
        term("set-option", "-g", "set-clipboard", "off")
        term.wait_screen("copy", "New session")
        term.send_keys("copy", "show me", "Enter")
        term.wait_screen("copy", "Either works.")
        term.send_keys("copy", "C-g")
        screen = term.wait_screen("copy", "set-clipboard on")  # off: the copy is kept from the clipboard, and said
        assert "tmux set -g set-clipboard on" in " ".join(screen.split())
        assert subprocess.run(["tmux", "-L", term.socket, "show-buffer"], env=term.env,
                              capture_output=True).returncode != 0  # (no buffer: tmux ignored it)
        term("set-option", "-g", "set-clipboard", "on")
        term.send_keys("copy", "C-g")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            done = subprocess.run(["tmux", "-L", term.socket, "show-buffer"], env=term.env, capture_output=True)
            if done.returncode == 0 and done.stdout:
                break
            threading.Event().wait(0.05)
        assert done.stdout.decode() == ANSWER
        term.send_keys("copy", "C-q")
    finally:
        term.close()


@pytest.mark.anyio
async def test_a_streamed_answer_becomes_a_tab_stop_when_it_ends_and_a_fence_lookalike_is_none(tmp_path):
    streamed = "Run it:\n\n```\nmake test\n```\n"
    world = make_world(tmp_path, [{"text": streamed}])
    write_log(world.store, "s", completed_turn(1, "inline", "Write ```x``` inline, not a fence."))
    app = world.resume_app("s")
    async with running(app, (80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat and app.chat.query(AssistantText), "the first answer")
        await submit(pilot, "how do I test?")
        await wait_for(pilot, lambda: len(app.chat.query(AssistantText)) == 2 and app.chat.query(AssistantText)[1]
                       .finished, "the streamed answer finished")
        lookalike, answer = list(app.chat.query(AssistantText))
        await pilot.press("shift+tab")  # from the prompt back to the newest answer
        await wait_for(pilot, lambda: app.focused is answer, "the streamed answer focused")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.clipboard == "make test\n", "its block copied")
        lookalike.focus()  # a line that only looks like a fence: focused, it passes the focus on and stops being a stop
        await wait_for(pilot, lambda: app.focused is not lookalike and not lookalike.can_focus, "passed on")
        await pilot.press("ctrl+q")
