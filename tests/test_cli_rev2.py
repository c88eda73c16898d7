"""SPEC rev 2 through the real `cairn` command: validated settings, provider-free reading commands, missing keys,
resume keeping its provider and model, secrets, terminal-safe output, reasoning, usage, and binary prompts."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import write_script
from openai_server import OpenAIServer, cut_off, failing, text

from cairn.app.compose import close_unused
from cairn.app.config.resolver import ConfigError, resolve_config
from cairn.app.config.resumed import config_for_session
from cairn.persistence.store import SessionStore

CAIRN = str(Path(sys.executable).parent / "cairn")
KEY = "sk-rev2-SECRET-KEY-41c9"
ESC_TEXT = "red \x1b[31mALERT\x1b[0m clip \x1b]52;c;ZXZpbA==\x07 bell\x07 cr\rX"


@pytest.fixture
def env(tmp_path):
    (tmp_path / "ws").mkdir()
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CAIRN_HOME": str(tmp_path / "home"),
        "CAIRN_DEMO_DELAY_MS": "0",
        "LANG": "C.UTF-8",
    }


def cairn(env: dict, *args: str | bytes, stdin: bytes | None = None, **extra: str) -> subprocess.CompletedProcess:
    """Run the real command; output is decoded leniently so a stray byte cannot hide what a test looks for."""
    proc = subprocess.run([CAIRN, *args], env={**env, **extra}, cwd=Path(env["HOME"]) / "ws", capture_output=True,
                          timeout=60, input=stdin)
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """Exactly one error line (a turn that ran also has its `cairn: session … (backend, provider model)` line)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not re.match(r"cairn: session \S+ \(", line)]
    assert len(lines) == 1 and lines[0].startswith("cairn: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def show_json(env: dict, session_id: str) -> list[dict]:
    proc = cairn(env, "show", session_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def sessions_json(env: dict) -> list[dict]:
    proc = cairn(env, "sessions", "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def headers_of(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["provider"], e["model"]) for e in events if e["type"] == "request/header"]


def files_under(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


# -- 1, 2: parameters and validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, value", [
    ("CAIRN_TIMEOUT", "nan"),
    ("CAIRN_TIMEOUT", "-5"),
    ("CAIRN_DEMO_DELAY_MS", "-1"),
    ("CAIRN_MAX_TOKENS", "0"),
    ("CAIRN_MAX_TOKENS", "abc"),
    ("CAIRN_MAX_RETRIES", "-1"),
    ("CAIRN_TEMPERATURE", "inf"),
    ("CAIRN_BASE_URL", "ftp://example.com"),
])
def test_a_bad_variable_is_exit_2_with_one_line_naming_it(env, name, value):
    proc = cairn(env, "run", "hi", **{name: value})
    assert_one_line_error(proc, 2, name)
    assert not (Path(env["CAIRN_HOME"]) / "sessions").exists() or sessions_json(env) == []  # nothing was created


def test_a_bad_max_tokens_flag_is_exit_2_naming_the_flag(env):
    assert_one_line_error(cairn(env, "run", "--max-tokens", "-3", "hi"), 2, "--max-tokens")


def test_show_and_sessions_work_whatever_the_provider_configuration(env):
    assert cairn(env, "run", "--session-id", "fine", "hello").returncode == 0
    broken = {"CAIRN_PROVIDER": "script", "CAIRN_TIMEOUT": "nan", "CAIRN_MAX_TOKENS": "abc",
              "CAIRN_BASE_URL": "not a url"}
    for extra in (broken, {"CAIRN_PROVIDER": "psychic"}):
        show = cairn(env, "show", "fine", **extra)
        assert show.returncode == 0 and "hello" in show.stdout, show.stderr
        listing = cairn(env, "sessions", "--all", **extra)
        assert listing.returncode == 0 and "fine" in listing.stdout, listing.stderr
    assert_one_line_error(cairn(env, "run", "again", **broken), 2)  # a model run still checks them


def test_max_tokens_and_model_parameters_reach_the_request(env):
    with OpenAIServer([text("one"), text("two"), text("three")]) as server:
        base = {"CAIRN_BASE_URL": server.base_url, "CAIRN_PROVIDER": "openai"}
        assert cairn(env, "run", "hi", **base).returncode == 0
        assert cairn(env, "run", "--max-tokens", "123", "hi", **base, CAIRN_MAX_TOKENS="77").returncode == 0
        proc = cairn(env, "run", "hi", **base, CAIRN_MAX_TOKENS="77", CAIRN_TEMPERATURE="0.5", CAIRN_TOP_P="0.9",
                     CAIRN_REASONING_EFFORT="low")
        assert proc.returncode == 0, proc.stderr
        bodies = [r.body for r in server.requests]
    assert bodies[0]["max_tokens"] == 8192
    assert not {"temperature", "top_p", "reasoning_effort"} & set(bodies[0])  # unset parameters are not sent
    assert bodies[1]["max_tokens"] == 123  # the flag wins over the variable
    assert bodies[2]["max_tokens"] == 77
    assert (bodies[2]["temperature"], bodies[2]["top_p"], bodies[2]["reasoning_effort"]) == (0.5, 0.9, "low")


def test_max_retries_comes_from_the_environment(env):
    with OpenAIServer() as server:
        base = {"CAIRN_BASE_URL": server.base_url, "CAIRN_PROVIDER": "openai"}
        server.push(*failing(503, 1, text("after one retry"), retry_after=0))
        retried = cairn(env, "run", "hi", **base, CAIRN_MAX_RETRIES="1")
        server.push(*failing(503, 1, text("never reached"), retry_after=0))
        refused = cairn(env, "run", "hi", **base, CAIRN_MAX_RETRIES="0")
        statuses = len(server.requests)
    assert retried.returncode == 0 and retried.stdout == "after one retry\n", retried.stderr
    assert "retrying" in retried.stderr
    assert_one_line_error(refused, 1, "503")
    assert statuses == 3  # 2 for the retried run, 1 for the one allowed no retry


# -- 3: a missing key ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base_url", [None, "https://api.deepseek.com/v1"])
def test_openai_without_a_key_for_a_hosted_endpoint_is_a_configuration_error(env, base_url):
    extra = {"CAIRN_BASE_URL": base_url} if base_url else {}
    proc = cairn(env, "run", "--provider", "openai", "hi", **extra)
    assert_one_line_error(proc, 2, "CAIRN_API_KEY", "OPENAI_API_KEY")
    assert sessions_json(env) == []


def test_the_missing_key_error_never_shows_credentials_of_the_base_url(env):
    url = "https://bob:pw-SECRET-1@models.example.com/v1?api_key=QSECRET-2&region=eu"
    proc = cairn(env, "run", "--provider", "openai", "--base-url", url, "hi")
    assert_one_line_error(proc, 2, "CAIRN_API_KEY", "models.example.com")
    assert "SECRET" not in proc.stderr


def test_a_local_server_needs_no_key(env):
    with OpenAIServer([text("local answer")]) as server:
        proc = cairn(env, "run", "--provider", "openai", "hi", CAIRN_BASE_URL=server.base_url)
        request = server.requests[0]
    assert proc.returncode == 0 and proc.stdout == "local answer\n", proc.stderr
    assert request.header("authorization") is None


# -- 4: resume keeps provider and model ---------------------------------------------------------------------------------


def test_resume_continues_with_the_sessions_provider_and_model(env, tmp_path):
    script = write_script(tmp_path / "s.json", [{"text": "first"}, {"text": "second"}, {"text": "third"}])
    with_script = {"CAIRN_SCRIPT": str(script)}
    first = cairn(env, "run", "--provider", "script", "--model", "my-model", "--session-id", "kept", "one",
                  **with_script)
    assert first.returncode == 0, first.stderr
    again = cairn(env, "run", "--resume", "kept", "two", **with_script)  # no provider or model given
    assert again.returncode == 0, again.stderr
    assert "script my-model" in again.stderr
    override = cairn(env, "run", "--resume", "kept", "three", **with_script, CAIRN_MODEL="other-model")
    assert override.returncode == 0, override.stderr
    assert headers_of(show_json(env, "kept")) == [
        ("script", "my-model"), ("script", "my-model"), ("script", "other-model")]


def test_resuming_a_script_session_without_a_script_is_exit_2(env, tmp_path):
    script = write_script(tmp_path / "s.json", [{"text": "first"}])
    assert cairn(env, "run", "--provider", "script", "--script", str(script), "--session-id", "s", "one").returncode == 0
    before = show_json(env, "s")
    proc = cairn(env, "run", "--resume", "s", "two")
    assert_one_line_error(proc, 2, "script", "CAIRN_SCRIPT")
    assert show_json(env, "s") == before
    assert cairn(env, "run", "--resume", "s", "two").returncode == 2  # the lock was released: same answer again
    assert cairn(env, "run", "--resume", "s", "--provider", "demo", "two").returncode == 0  # an explicit choice wins


def test_the_tui_resume_path_takes_the_sessions_provider_and_opens_even_without_one(env, tmp_path):
    """`cairn resume` builds the app from `tui_config_for`; the app itself needs a terminal, so this checks the
    config it would get, on a real opened session. Without what the provider needs, the session still opens (the
    resume screen and verdicts need no model) with the reason to show."""
    from cairn.app.cli import tui_config_for

    script = write_script(tmp_path / "s.json", [{"text": "first"}])
    assert cairn(env, "run", "--provider", "script", "--script", str(script), "--model", "m1", "--session-id", "t",
                 "one").returncode == 0
    store = SessionStore(Path(env["CAIRN_HOME"]))
    config = resolve_config(home=env["CAIRN_HOME"], workspace=str(tmp_path / "ws"), script=str(script), env={})
    opened = store.open_for_resume("t")
    session_config, unavailable = tui_config_for(config, opened)
    close_unused(opened)
    assert (session_config.provider, session_config.model, unavailable) == ("script", "m1", None)
    opened = store.open_for_resume("t")
    _, unavailable = tui_config_for(resolve_config(home=env["CAIRN_HOME"], workspace=str(tmp_path / "ws"), env={}),
                                    opened)
    assert "CAIRN_SCRIPT" in unavailable and opened.lock.held  # opened all the same
    close_unused(opened)


def test_config_for_session_keeps_the_model_only_with_its_provider(tmp_path):
    from cairn.persistence.events import RequestHeader

    header = RequestHeader(turn=1, step=1, provider="openai", model="gpt-x", params={}, tools=[], message_count=2,
                           endpoint="https://api.openai.com/v1")
    base = resolve_config(workspace=str(tmp_path), env={"CAIRN_API_KEY": "k"})
    assert (config_for_session(base, [header]).provider, config_for_session(base, [header]).model) == ("openai", "gpt-x")
    demo = resolve_config(workspace=str(tmp_path), provider="demo", env={})
    assert (config_for_session(demo, [header]).provider, config_for_session(demo, [header]).model) == ("demo", None)
    assert config_for_session(base, []) is base  # a session without requests yet: nothing to keep


# -- 5: secrets ---------------------------------------------------------------------------------------------------------


def test_key_and_url_credentials_never_reach_the_log_or_the_output(env, tmp_path):
    with OpenAIServer([text(f"your key is {KEY} and the password pw-SECRET-1")]) as server:
        host = server.base_url.split("://", 1)[1]
        url = f"http://bob:pw-SECRET-1@{host}"  # (the test server routes no query string: see the next test for one)
        proc = cairn(env, "run", "--provider", "openai", "--base-url", url, "say the key", CAIRN_API_KEY=KEY)
        listing = cairn(env, "sessions", "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    session_id = json.loads(listing.stdout.splitlines()[0])["id"]
    shown = cairn(env, "show", session_id)
    stored = files_under(Path(env["CAIRN_HOME"]))
    for secret in (KEY, "pw-SECRET-1"):
        assert secret.encode() not in stored
        assert secret not in proc.stderr and secret not in shown.stdout
    assert "***" in shown.stdout


# -- 6: terminal-safe output --------------------------------------------------------------------------------------------


def test_escape_sequences_from_model_tool_and_prompt_never_reach_the_terminal_raw(env, tmp_path):
    script = write_script(tmp_path / "s.json", [
        {"text": ESC_TEXT, "reasoning": "think \x1b]0;title\x07",
         "tool_calls": [{"name": "run_command", "arguments": {"command": "printf 'out \\033[2J done'"}}]},
        {"text": "end " + ESC_TEXT},
    ])
    prompt = "please \x1b]52;c;cHJvbXB0\x07 go"
    run = cairn(env, "run", "--provider", "script", "--script", str(script), "--yes", "--session-id", "esc", prompt)
    assert run.returncode == 0, run.stderr
    show = cairn(env, "show", "esc")
    listing = cairn(env, "sessions", "--all")
    for proc in (run, show, listing):
        out = proc.stdout + proc.stderr
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out, out
    assert "red ␛[31mALERT" in run.stdout and "␛]52;c;ZXZpbA==␇" in run.stdout
    assert "␛[2J" in run.stderr  # the tool's output, made visible
    assert "please ␛]52" in show.stdout and "please ␛]52" in listing.stdout
    as_json = cairn(env, "run", "--json", "--resume", "esc", "--provider", "demo", "again \x1b[2J")
    assert "\x1b" not in as_json.stdout and "\\u001b" in as_json.stdout  # JSON escapes control characters itself


C1_TEXT = "csi \x9b2J osc \x9d0;title\x9c nel \x85 del \x7f title \x1b]0;pwned\x07 link \x1b]8;;http://x\x1b\\y\x1b]8;;\x1b\\"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_every_printer_neutralises_c0_and_c1_controls(env, tmp_path):
    """SPEC §6 rev 3: run, show, export (both formats), sessions and config, text and JSON, print no raw control."""
    script = write_script(tmp_path / "s.json", [
        {"text": C1_TEXT, "reasoning": "think " + C1_TEXT,
         "tool_calls": [{"name": "run_command", "arguments": {"command": "printf 'out \\233[2J \\302\\233 done'"}}]},
        {"text": "end " + C1_TEXT},
    ])
    prompt = "please " + C1_TEXT
    printed = {
        "run": cairn(env, "run", "--provider", "script", "--script", str(script), "--yes", "--session-id", "c1", prompt),
        "run --json": cairn(env, "run", "--json", "--resume", "c1", "--provider", "demo", "again " + C1_TEXT),
    }
    for name, args in {"show": ("show", "c1"), "show --json": ("show", "c1", "--json"),
                       "export": ("export", "c1"), "export json": ("export", "c1", "--format", "json"),
                       "sessions": ("sessions", "--all"), "sessions --json": ("sessions", "--all", "--json"),
                       "config": ("config",), "config --json": ("config", "--json")}.items():
        printed[name] = cairn(env, *args, CAIRN_MODEL="m" + C1_TEXT[:9])
    for name, proc in printed.items():
        assert proc.returncode == 0, (name, proc.stderr)
        for stream in (proc.stdout, proc.stderr):
            assert not RAW_CONTROL.search(stream), (name, RAW_CONTROL.search(stream), stream[:300])
        if name.endswith("json"):
            for line in proc.stdout.splitlines():
                json.loads(line)  # still JSON, the same values
    assert "\\u009b2J" in printed["show --json"].stdout and "\\u009b2J" in printed["export json"].stdout
    assert "csi \ufffd2J" in printed["export"].stdout and "title ␛]0;pwned␇" in printed["export"].stdout
    assert "please csi" in printed["sessions"].stdout


def test_safe_text_makes_controls_visible_and_keeps_newlines_and_tabs():
    from cairn.widgets.terminal_text import safe_text

    assert safe_text("a\tb\nc") == "a\tb\nc"
    assert safe_text("\x1b[1m\x00\x7f\x9b\r") == "␛[1m␀␡\ufffd␍"
    assert safe_text("bad \udcff half") == "bad \ufffd half"


# -- 7: cairn run output -----------------------------------------------------------------------------------------------


def test_run_json_starts_with_the_session_line(env, tmp_path):
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])
    proc = cairn(env, "run", "--json", "--provider", "script", "--script", str(script), "--model", "m",
                 "--session-id", "j", "hello")
    assert proc.returncode == 0, proc.stderr
    first, *events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert first == {"type": "session", "id": "j", "backend": "jsonl", "provider": "script", "model": "m"}
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events == show_json(env, "j")


def test_reasoning_goes_to_stderr_prefixed_and_the_answer_alone_to_stdout(env, tmp_path):
    script = write_script(tmp_path / "s.json", [{"reasoning": "Let me think.\nSecond thought.", "text": "Answer."}])
    proc = cairn(env, "run", "--provider", "script", "--script", str(script), "why?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Answer.\n"
    assert "thinking┆ Let me think.\nthinking┆ Second thought.\n" in proc.stderr
    assert "\x1b" not in proc.stderr  # not a terminal: no dimming


def test_reasoning_is_dimmed_when_stderr_is_a_terminal(env, tmp_path):
    script = write_script(tmp_path / "s.json", [{"reasoning": "pondering", "text": "Answer."}])
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([CAIRN, "run", "--provider", "script", "--script", str(script), "why?"],
                                env=env, cwd=tmp_path / "ws", stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks = []
        while select.select([master], [], [], 20)[0]:  # never wait forever on a child that hangs
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert stdout == b"Answer.\n"
    assert b"\x1b[2mthinking\xe2\x94\x86 pondering\x1b[0m" in b"".join(chunks)


def test_a_turn_cut_off_at_max_tokens_exits_1_naming_the_limit(env):
    with OpenAIServer([cut_off([{"id": "c1", "name": "write_file",
                                 "arguments": {"path": "x.txt", "content": "a long text"}}], keep=12)]) as server:
        proc = cairn(env, "run", "--provider", "openai", "--max-tokens", "50", "--yes", "write it",
                     CAIRN_BASE_URL=server.base_url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("cairn: ") and "50 tokens" in last and "--max-tokens" in last, proc.stderr
    assert "← TRUNCATED" in proc.stderr  # the call's result is reported like any other
    assert not (Path(env["HOME"]) / "ws" / "x.txt").exists()
    session_id = sessions_json(env)[0]["id"]
    result = next(e for e in show_json(env, session_id) if e["type"] == "tool/result")
    assert result["error_code"] == "TRUNCATED"


# -- 8: usage -----------------------------------------------------------------------------------------------------------


def test_show_prints_usage_per_answer_and_totals_and_sessions_json_sums_it(env, tmp_path):
    script = write_script(tmp_path / "s.json", [
        {"text": "Looking.", "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
         "usage": {"input_tokens": 1200, "output_tokens": 30, "cached_tokens": 1000}},
        {"text": "Done.", "usage": {"input_tokens": 1300, "output_tokens": 12}},
    ])
    assert cairn(env, "run", "--provider", "script", "--script", str(script), "--session-id", "u", "go").returncode == 0
    assert cairn(env, "run", "--session-id", "plain", "hello").returncode == 0  # demo: no usage reported
    shown = cairn(env, "show", "u").stdout
    assert "[tokens: in 1,200 · out 30 · cached 1,000]" in shown
    assert "[tokens: in 1,300 · out 12]" in shown
    assert shown.rstrip().endswith("── session tokens: in 2,500 · out 42 · cached 1,000 over 2 answers ──")
    rows = {row["id"]: row for row in sessions_json(env)}
    assert rows["u"]["usage"] == {"input_tokens": 2500, "output_tokens": 42}
    assert rows["plain"]["usage"] == {"input_tokens": None, "output_tokens": None}


# -- 9: binary prompts --------------------------------------------------------------------------------------------------


def test_a_binary_prompt_is_recorded_with_replacement_characters_and_the_turn_runs(env):
    proc = cairn(env, "run", "--session-id", "bin", b"bin \xff\xfe")
    assert proc.returncode == 0, proc.stderr
    piped = cairn(env, "run", "--resume", "bin", "-", stdin=b"piped \xc3(\n")
    assert piped.returncode == 0, piped.stderr
    events = show_json(env, "bin")
    prompts = [e["text"] for e in events if e["type"] == "user/message"]
    assert prompts == ["bin \ufffd\ufffd", "piped \ufffd(\n"]
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == ["completed", "completed"]
    assert "bin \ufffd\ufffd" in cairn(env, "show", "bin").stdout


# -- issue 24 (8): small refusals are one line ------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (("run",), "run: the following arguments are required: PROMPT"),
    (("frob",), "invalid choice: 'frob'"),
    (("--backend", "nosql", "sessions"), "argument --backend: invalid choice"),
    (("export", "s", "--format", "pdf"), "export: argument --format: invalid choice"),
    (("show",), "`cairn show --help`"),
])
def test_argument_errors_are_one_line_naming_the_help_to_read(env, args, needle):
    proc = cairn(env, *args)
    assert_one_line_error(proc, 2, needle)
    assert "usage:" not in proc.stderr


def test_an_empty_cairn_home_or_home_option_is_refused_not_read_as_the_default(env):
    for proc, needle in ((cairn(env, "sessions", CAIRN_HOME=""), "CAIRN_HOME is set but empty"),
                         (cairn(env, "run", "hello", CAIRN_HOME=" "), "CAIRN_HOME is set but empty"),
                         (cairn(env, "--home", "", "sessions"), "--home is empty")):
        assert_one_line_error(proc, 2, needle)


# -- issue 25 (2): the endpoint a session was sent to is kept on resume -------------------------------------------------


def test_a_local_url_session_resumed_with_no_url_named_goes_to_the_same_server(env, tmp_path):
    with OpenAIServer([text("first answer"), text("second answer")]) as server:
        first = cairn(env, "run", "--provider", "openai", "--base-url", server.base_url, "--session-id", "local",
                      "hello", CAIRN_API_KEY="sk-local-key")
        assert first.returncode == 0, first.stderr
        resumed = cairn(env, "run", "--provider", "openai", "--resume", "local", "again")  # no URL, no key named
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == "second answer" and len(server.requests) == 2
        url = server.base_url
    headers = [e for e in show_json(env, "local") if e["type"] == "request/header"]
    assert [h["endpoint"] for h in headers] == [url, url]
