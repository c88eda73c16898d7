"""`@path` mentions (issue 42, app/agent/mentions.py): parsing, attachments recorded in `user/message` and sent to the
model, the size limits, refused mentions, `cairn run "… @file"`, and a crash and resume after an attachment."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from openai_server import OpenAIServer, hang, text

from cairn.app.agent.mentions import MAX_FILE_TEXT, attach, find_mentions, user_content
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config
from cairn.persistence.events import Attachment, UserMessage

from cli_world import CAIRN
from waiting import wait_sync


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- parsing ------------------------------------------------------------------------------------------------------------


def test_mentions_start_a_word_and_run_to_whitespace():
    assert find_mentions("@a.py look at @src/b.py\tand\n@c") == ["a.py", "src/b.py", "c"]


def test_quoted_mentions_take_spaces():
    assert find_mentions('read @"my notes.md" and @"x y/z.txt".') == ["my notes.md", "x y/z.txt"]


def test_trailing_punctuation_is_dropped_unless_the_file_has_it(tmp_path):
    assert find_mentions("see @notes.md. and (@x) and @a.py, @b.py) @c.py!?") == ["notes.md", "a.py", "b.py", "c.py"]
    (tmp_path / "v1.").write_text("x")
    (tmp_path / "notes.md").write_text("x")
    assert find_mentions("see @v1. and @notes.md.", tmp_path) == ["v1.", "notes.md"]


def test_email_addresses_and_lone_at_signs_are_not_mentions():
    """An `@` inside a word is never a mention: e-mail addresses, `user@host`, `x@2x.png` stay text."""
    assert find_mentions("mail bob@example.com or a@b.com, ssh me@host, icon@2x.png, @ alone, @@") == []


# -- attaching ----------------------------------------------------------------------------------------------------------


def test_attach_reads_hash_size_and_text(tmp_path):
    data = "héllo\n".encode() + b"\xff bad byte\n"
    (tmp_path / "notes.md").write_bytes(data)
    attached = attach(tmp_path, "read @notes.md and @./notes.md again")
    assert attached.notices == []
    assert attached.attachments == [Attachment(path="notes.md", sha256=sha(data), size=len(data),
                                               text="héllo\n\ufffd bad byte\n", truncated=False)]


def test_a_file_over_the_limit_is_cut_and_the_prompt_limit_holds(tmp_path):
    big = ("é" * 60_000).encode()  # 120,000 bytes: the 100 KB cut falls between the two bytes of a character
    (tmp_path / "a.txt").write_bytes(big)
    (tmp_path / "b.txt").write_bytes(b"b" * 150_000)
    (tmp_path / "c.txt").write_bytes(b"c" * 10)
    first, second, third = attach(tmp_path, "@a.txt @b.txt @c.txt").attachments
    assert first.truncated and first.size == len(big) and first.sha256 == sha(big)
    assert first.text == "é" * (MAX_FILE_TEXT // 2)  # whole characters only, no replacement character
    assert second.truncated and second.text == "b" * MAX_FILE_TEXT and second.sha256 == sha(b"b" * 150_000)
    assert third.truncated and third.text == "" and third.size == 10  # the prompt's 200 KB were used up


def test_refused_mentions_leave_the_text_and_say_why(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    (ws / "dir").mkdir()
    (ws / "bin.dat").write_bytes(b"\x7fELF\x00\x01")
    os.mkfifo(ws / "pipe")
    os.symlink(tmp_path / "outside.txt", ws / "link.txt")
    attached = attach(ws, "@../outside.txt @/etc/hostname @link.txt @dir @missing.md @bin.dat @pipe @missing.md")
    assert attached.attachments == []
    assert attached.notices == [
        "@mention '../outside.txt' not attached: it is outside the workspace",
        "@mention '/etc/hostname' not attached: it is outside the workspace",
        "@mention 'link.txt' not attached: it is outside the workspace",
        "@mention 'dir' not attached: it is a directory",
        "@mention 'missing.md' not attached: no such file in the workspace",
        "@mention 'bin.dat' not attached: it is a binary file",
        "@mention 'pipe' not attached: pipe is a named pipe (FIFO); only regular files are read or written",
    ]


def test_user_content_puts_each_file_after_the_prompt():
    a = Attachment(path='a "b".md', sha256="0" * 64, size=3, text="abc", truncated=True)
    assert user_content("look @x", [a]) == (
        'look @x\n\n<file path="a &quot;b&quot;.md" sha256="' + "0" * 64 + '" size="3" truncated="true">\nabc\n</file>')
    assert user_content("plain", []) == "plain"


# -- through the loop ---------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_loop_records_the_attachment_and_sends_its_text(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("the notes\n")
    reported: list[str] = []
    with OpenAIServer([text("seen")]) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="m", base_url=server.base_url,
                                workspace=str(ws), env={"CAIRN_API_KEY": "sk-x", "CAIRN_SNAPSHOTS": "off"})
        async with open_agent(config, report=reported.append) as agent:
            result = await agent.run("summarise @notes.md and @gone.md")
            events = agent.session.events
    assert result.reason == "completed"
    (message,) = [e for e in events if isinstance(e, UserMessage)]
    assert message.text == "summarise @notes.md and @gone.md"
    assert [(a.path, a.sha256, a.size, a.text) for a in message.attachments] == [
        ("notes.md", sha(b"the notes\n"), 10, "the notes\n")]
    assert [line for line in reported if "not attached" in line] == [
        "@mention 'gone.md' not attached: no such file in the workspace"]
    sent = server.requests[0].body["messages"][-1]
    digest = sha(b"the notes\n")
    assert sent["role"] == "user" and sent["content"] == (
        "summarise @notes.md and @gone.md\n\n"
        f'<file path="notes.md" sha256="{digest}" size="10" truncated="false">\nthe notes\n\n</file>')


@pytest.mark.anyio
async def test_a_configured_secret_in_an_attached_file_is_scrubbed(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    key = "sk-mention-SECRET-4f1e"
    (ws / ".env.txt").write_text(f"API_KEY={key}\n")
    with OpenAIServer([text("ok")]) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="m", base_url=server.base_url,
                                workspace=str(ws), env={"CAIRN_API_KEY": key, "CAIRN_SNAPSHOTS": "off"})
        async with open_agent(config) as agent:
            await agent.run("check @.env.txt")
            (message,) = [e for e in agent.session.events if isinstance(e, UserMessage)]
    assert message.attachments[0].text == "API_KEY=***\n"
    assert message.attachments[0].sha256 == sha(f"API_KEY={key}\n".encode())  # the hash is of the file as it is
    assert key not in json.dumps(server.requests[0].body["messages"])
    assert key not in "".join(p.read_text() for p in (tmp_path / "home").rglob("*.jsonl"))


# -- headless -----------------------------------------------------------------------------------------------------------


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "LANG": "C.UTF-8", "CAIRN_SNAPSHOTS": "off", **extra}


def test_cairn_run_attaches_a_mentioned_file(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "todo.txt").write_text("buy milk\n")
    with OpenAIServer([text("done")]) as server:
        env = cli_env(tmp_path, CAIRN_BASE_URL=server.base_url, CAIRN_API_KEY="sk-x", CAIRN_PROVIDER="openai",
                      CAIRN_MODEL="m")
        proc = subprocess.run([CAIRN, "run", "--json", "--session-id", "s", 'do @todo.txt, then @"no such.txt"'],
                              env=env, cwd=ws, capture_output=True, text=True, timeout=60)
        sent = server.requests[0].body["messages"][-1]["content"]
        shown = subprocess.run([CAIRN, "show", "s"], env=env, capture_output=True, text=True, timeout=60)
        exported = subprocess.run([CAIRN, "export", "s"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    (message,) = [e for e in lines if e.get("type") == "user/message"]
    assert message["attachments"] == [{"path": "todo.txt", "sha256": sha(b"buy milk\n"), "size": 9,
                                       "text": "buy milk\n", "truncated": False}]
    assert "\n\n<file path=\"todo.txt\"" in sent and "buy milk" in sent
    assert "@mention 'no such.txt' not attached: no such file in the workspace" in proc.stderr
    assert "> do @todo.txt, then @\"no such.txt\"\n  attached: todo.txt (9 B)\n" in shown.stdout
    assert "> do @todo.txt, then @\"no such.txt\"\n> _attached: todo.txt (9 B)_\n" in exported.stdout


def test_crash_after_an_attachment_then_resume_sends_the_recorded_text(tmp_path):
    """SIGKILL while the first request is answered; the file changes; the resumed session still tells the model what
    it was sent the first time (the log keeps the text), and the log loads."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "plan.md").write_text("version one\n")
    with OpenAIServer([hang(), text("resumed")]) as server:
        env = cli_env(tmp_path, CAIRN_BASE_URL=server.base_url, CAIRN_API_KEY="sk-x", CAIRN_PROVIDER="openai",
                      CAIRN_MODEL="m")
        child = subprocess.Popen([CAIRN, "run", "--session-id", "s", "follow @plan.md"], env=env, cwd=ws,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server.wait_for_requests(1, timeout=30)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
        (ws / "plan.md").write_text("version two, changed on disk\n")
        again = subprocess.run([CAIRN, "run", "--resume", "s", "go on"], env=env, cwd=ws, capture_output=True,
                               text=True, timeout=60)
        wait_sync(lambda: len(server.requests) >= 2, "the resumed request")
        resumed = server.requests[1].body["messages"]
        shown = subprocess.run([CAIRN, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    first_user = next(m for m in resumed if m["role"] == "user")
    assert "version one" in first_user["content"] and "version two" not in json.dumps(resumed)
    messages = [json.loads(line) for line in shown.stdout.splitlines() if '"user/message"' in line]
    assert [m["attachments"][0]["text"] for m in messages if m["attachments"]] == ["version one\n"]
