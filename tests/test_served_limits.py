"""Servers as they really are (SPEC §7 rev 3, issue 26), end to end through `cairn run`, `cairn config` and the TUI:
a server's own word on its context size (llama.cpp `/props`, `/v1/models` metadata, Ollama `/api/show`), `max_tokens`
kept inside it, llama.cpp's context refusal, text form asked for by a profile and after a crash, a stall in the TUI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from openai_server import OpenAIServer, RecordedRequest, error, text, tool_calls
from tui_helpers import wait_for

from cairn.app.providers import served_limits
from cairn.app.providers.served_limits import (
    window_from_models,
    window_from_ollama_show,
    window_from_props,
)

CAIRN = str(Path(sys.executable).with_name("cairn"))
KEY = "sk-served-limits"

# Real bodies (trimmed to the fields that matter), as the servers send them.
LLAMA_CPP_PROPS = {"default_generation_settings": {"n_ctx": 8192, "params": {"n_predict": -1}}, "total_slots": 1,
                   "model_path": "/models/gemma-3-270m-it-Q4_K_M.gguf", "chat_template": "{{ bos_token }}…"}
VLLM_MODELS = {"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "vllm",
                                           "root": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32768}]}
LLAMA_CPP_MODELS = {"object": "list", "data": [{"id": "gemma-3-270m-it-Q4_K_M.gguf", "object": "model",
                                                "owned_by": "llamacpp", "meta": {"vocab_type": 1, "n_vocab": 262144,
                                                                                 "n_ctx_train": 32768, "n_embd": 640}}]}
OLLAMA_SHOW_NUM_CTX = {"modelfile": "FROM gemma3:270m", "parameters": "num_ctx                        8192\n"
                       "stop                           \"<end_of_turn>\"", "model_info": {"gemma3.context_length": 32768}}
OLLAMA_SHOW_PLAIN = {"modelfile": "FROM qwen2.5", "model_info": {"general.architecture": "qwen2",
                                                                  "qwen2.context_length": 32768}}
LLAMA_CPP_CONTEXT_ERROR = {"error": {"code": 400, "message": "request (19579 tokens) exceeds the available context size "
                                     "(8192 tokens), try increasing it", "type": "exceed_context_size_error",
                                     "n_prompt_tokens": 19579, "n_ctx": 8192}}


@pytest.mark.parametrize("read, payload, expected", [
    (window_from_props, LLAMA_CPP_PROPS, 8192),
    (lambda p: window_from_models(p, "Qwen/Qwen2.5-7B-Instruct"), VLLM_MODELS, 32768),
    (lambda p: window_from_models(p, "gemma-3-270m-it-Q4_K_M.gguf"), LLAMA_CPP_MODELS, 32768),
    (window_from_ollama_show, OLLAMA_SHOW_NUM_CTX, 8192),
    (window_from_ollama_show, OLLAMA_SHOW_PLAIN, served_limits.OLLAMA_DEFAULT_CTX),
    (window_from_props, {"default_generation_settings": {"n_ctx": True}}, None),
    (window_from_props, {"default_generation_settings": {"n_ctx": "8192"}}, None),
    (window_from_props, [1, 2], None),
    (lambda p: window_from_models(p, "other"), {"data": [{"id": "a", "max_model_len": 4096},
                                                         {"id": "b", "max_model_len": 8192}]}, None),
    (window_from_ollama_show, {"parameters": "num_ctx 1e309"}, None),
])
def test_each_servers_own_words_for_its_window_are_read_and_nonsense_is_not(read, payload, expected):
    assert read(payload) == expected


def env_for(tmp_path: Path, server: OpenAIServer, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": KEY, "CAIRN_PROVIDER": "openai",
            "CAIRN_MODEL": "gemma-3-270m-it-Q4_K_M.gguf", **extra}


def cairn(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([CAIRN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["props", "models", "ollama"])
def test_cairn_config_shows_the_window_the_server_says_and_where_it_came_from(tmp_path, kind):
    options = {"props": {"props": LLAMA_CPP_PROPS}, "models": {"models": LLAMA_CPP_MODELS["data"]},
               "ollama": {"ollama_show": OLLAMA_SHOW_NUM_CTX}}[kind]
    where = {"props": "server (GET /props)", "models": "server (GET /v1/models)", "ollama": "server (POST /api/show)"}
    with OpenAIServer(**options) as server:
        shown = cairn(["config", "--json"], env_for(tmp_path, server), tmp_path)
        told = cairn(["config"], env_for(tmp_path, server, CAIRN_CONTEXT_WINDOW="4096"), tmp_path)
    assert shown.returncode == 0, shown.stderr
    window = json.loads(shown.stdout)["context_window"]
    assert window == {"value": 8192 if kind != "models" else 32768, "source": where[kind]}
    line = next(x for x in told.stdout.splitlines() if x.startswith("context_window"))
    assert line.split()[1] == "4096" and line.endswith("env CAIRN_CONTEXT_WINDOW")  # explicit settings win


def test_a_hosted_endpoint_is_not_asked_and_the_model_family_window_is_shown(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
           "CAIRN_PROVIDER": "openai", "CAIRN_API_KEY": KEY, "CAIRN_MODEL": "gpt-4o-mini",
           "HTTPS_PROXY": "http://127.0.0.1:9"}  # a probe would fail
    shown = cairn(["config", "--json"], env, tmp_path)
    assert json.loads(shown.stdout)["context_window"] == {"value": 128000, "source": "default (model family)"}


def test_the_default_max_tokens_stays_inside_the_served_window_and_an_explicit_one_wins(tmp_path):
    (tmp_path / "ws").mkdir()
    with OpenAIServer(default=text("fine"), props={"default_generation_settings": {"n_ctx": 4096}}) as server:
        env = env_for(tmp_path, server)
        default = cairn(["run", "hello"], env, tmp_path / "ws")
        explicit = cairn(["run", "--max-tokens", "3000", "hello"], env, tmp_path / "ws")
        sent = [r.body["max_tokens"] for r in server.requests]
    assert default.returncode == 0 and explicit.returncode == 0, (default.stderr, explicit.stderr)
    assert sent == [1024, 3000]  # a quarter of n_ctx 4096 instead of 8192; the flag is sent as given



@pytest.mark.parametrize("n_ctx, expected, why", [
    (4096, 1024, "default: a quarter of the 4,096-token context window (at most 8,192)"),
    (512, 256, "default: the floor, as a quarter of the 512-token context window is less"),
    (131072, 8192, "default (within a quarter of the 131,072-token context window)"),
])
def test_cairn_config_shows_the_max_tokens_a_request_sends_and_why(tmp_path, n_ctx, expected, why):
    """Issue 44: `cairn config` once said 8192 while 1024 was sent; now it shows what the next request sends."""
    (tmp_path / "ws").mkdir()
    with OpenAIServer(default=text("fine"), props={"default_generation_settings": {"n_ctx": n_ctx}}) as server:
        env = env_for(tmp_path, server)
        shown = cairn(["config", "--json"], env, tmp_path / "ws")
        told = cairn(["config"], env, tmp_path / "ws")
        flag = cairn(["config", "--json", "--max-tokens", "3000"], env, tmp_path / "ws")
        ran = cairn(["run", "hello"], env, tmp_path / "ws")
        sent = [r.body["max_tokens"] for r in server.requests if r.body]
    assert shown.returncode == 0 and ran.returncode == 0, (shown.stderr, ran.stderr)
    assert json.loads(shown.stdout)["max_tokens"] == {"value": expected, "source": why}
    assert sent == [expected]  # what config said is what the request carried
    line = next(x for x in told.stdout.splitlines() if x.startswith("max_tokens"))
    assert line.split()[1] == str(expected) and line.endswith(why)
    assert json.loads(flag.stdout)["max_tokens"] == {"value": 3000, "source": "flag --max-tokens"}

class LlamaCppServer:
    """A llama.cpp server with a small context: requests over `n_ctx` get its exact `exceed_context_size_error`
    (summary requests too), others an answer; `/props` says `n_ctx` (the test server answers it)."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.refused = 0
        self.summaries = 0
        self.answered = 0

    def __call__(self, req: RecordedRequest):
        tokens = len(json.dumps(req.body.get("messages", []))) // 4
        if tokens > self.n_ctx:
            self.refused += 1
            body = json.loads(json.dumps(LLAMA_CPP_CONTEXT_ERROR))
            body["error"].update(n_prompt_tokens=tokens, n_ctx=self.n_ctx,
                                 message=f"request ({tokens} tokens) exceeds the available context size "
                                         f"({self.n_ctx} tokens), try increasing it")
            return error(400, body=body)
        if "summar" in json.dumps(req.body["messages"][0]).lower():
            self.summaries += 1
            return text(f"Summary {self.summaries}: many long parts were written.")
        self.answered += 1
        return text(f"answer {self.answered}. " + "More words. " * 30)


def grow_session(tmp_path: Path, ws: Path, parts: int) -> str:
    """A session of `parts` long turns written against a server with a large window (no /props)."""
    with OpenAIServer(default=text("ok. " + "Long reply words. " * 150)) as big:
        env = env_for(tmp_path, big, CAIRN_CONTEXT_WINDOW="1000000")
        for i in range(parts):
            args = ["--session-id", "big"] if i == 0 else ["--resume", "big"]
            proc = cairn(["run", *args, f"Part {i}. " + "Words. " * 300], env, ws)
            assert proc.returncode == 0, proc.stderr
    return "big"


def test_a_session_larger_than_the_served_window_continues_with_no_window_configured(tmp_path):
    """Issue 26: n_ctx comes from /props; the session is about five times the window; Cairn compacts (in pieces) and
    continues, and no request the server gets is over its window after the first refusal at most."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sid = grow_session(tmp_path, ws, 8)
    model = LlamaCppServer(n_ctx=2048)
    with OpenAIServer(default=model, props={"default_generation_settings": {"n_ctx": 2048}}) as server:
        env = env_for(tmp_path, server)
        first = cairn(["run", "--resume", sid, "and now, briefly?"], env, ws)
        second = cairn(["run", "--resume", sid, "one more?"], env, ws)
        shown = cairn(["show", sid, "--json"], env, ws)
    assert first.returncode == 0 and first.stdout.startswith("answer 1"), first.stderr
    assert second.returncode == 0 and second.stdout.startswith("answer 2"), second.stderr
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["type"] for e in events].count("context/compaction") >= 1
    assert model.summaries >= 2  # the history was longer than one summary request can carry: pieces
    assert model.refused == 0  # the window came from /props before anything was sent


def test_llama_cpps_context_refusal_starts_one_compaction_and_the_turn_continues(tmp_path):
    """The window is configured too large; only llama.cpp's 400 tells Cairn, which compacts once and retries."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sid = grow_session(tmp_path, ws, 8)
    model = LlamaCppServer(n_ctx=4096)
    with OpenAIServer(default=model) as server:
        proc = cairn(["run", "--resume", sid, "go on"], env_for(tmp_path, server, CAIRN_CONTEXT_WINDOW="1000000"), ws)
    assert proc.returncode == 0 and proc.stdout.startswith("answer 1"), proc.stderr
    assert model.refused >= 1 and model.summaries >= 1


LLAMA_CPP_TEMPLATE_ERROR = {"error": {"code": 400, "type": "invalid_request_error", "message": (
    "Unable to generate parser for this template. Automatic parser generation failed: \n------------\nWhile executing "
    "CallExpression at line 6, column 21 in source:\n...\nError: Jinja Exception: Conversation roles must alternate "
    "user/assistant/user/assistant/...")}}


class NoToolRole:
    """Gemma's template on llama.cpp: any tool message or assistant tool_calls is refused with the exact Jinja error;
    otherwise roles must strictly alternate, and each answer is numbered."""

    def __init__(self) -> None:
        self.refused = 0
        self.answered: list[list[dict]] = []

    def __call__(self, req: RecordedRequest):
        messages = req.body.get("messages", [])
        if any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
            self.refused += 1
            return error(400, body=LLAMA_CPP_TEMPLATE_ERROR)
        roles = [m["role"] for m in messages if m["role"] != "system"]
        if roles[0] != "user" or any(a == b for a, b in zip(roles, roles[1:])):
            return error(400, body=LLAMA_CPP_TEMPLATE_ERROR)
        self.answered.append(messages)
        return text(f"answer {len(self.answered)}")


def test_a_crashed_session_with_tool_history_continues_on_a_server_without_a_tool_role(tmp_path):
    """SIGKILL while `run_command` runs (OUTCOME_UNKNOWN), then two turns on a Gemma-template server: both answered,
    the recovery note reaches the model in the text."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = ws / "started.txt"
    calls = [{"id": "call_deploy", "name": "run_command", "arguments": {"command": f"echo yes > {marker}; sleep 60"}}]
    with OpenAIServer([tool_calls(calls)]) as tools_server:
        child = subprocess.Popen([CAIRN, "run", "--session-id", "s", "--yes", "deploy"],
                                 env=env_for(tmp_path, tools_server), cwd=ws,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text() == "yes\n") and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    gemma = NoToolRole()
    with OpenAIServer(default=gemma, strict=False) as server:
        env = env_for(tmp_path, server)
        first = cairn(["run", "--resume", "s", "did the deploy run?"], env, ws)
        second = cairn(["run", "--resume", "s", "and now?"], env, ws)
    assert first.returncode == 0 and first.stdout.strip() == "answer 1", first.stderr
    assert second.returncode == 0 and second.stdout.strip() == "answer 2", second.stderr
    assert gemma.refused == 1  # once; text form is kept for the rest of the session
    sent = json.dumps(gemma.answered[-1])
    assert "[I call the tool run_command as call_deploy" in sent and "OUTCOME_UNKNOWN" in sent


def test_a_profile_can_ask_for_text_form_from_the_first_request(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("x")
    gemma = NoToolRole()
    calls = [{"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}}]
    with OpenAIServer([tool_calls(calls)], default=gemma, strict=False) as server:
        config = tmp_path / "config.toml"
        config.write_text(f'default_profile = "gemma"\n[profiles.gemma]\nprovider = "openai"\n'
                          f'base_url = "{server.base_url}"\nmodel = "gemma3"\ntranscript = "text"\n')
        env = {**env_for(tmp_path, server), "CAIRN_CONFIG": str(config)}
        for name in ("CAIRN_BASE_URL", "CAIRN_MODEL", "CAIRN_PROVIDER"):
            env.pop(name)
        proc = cairn(["run", "what is here?"], env, ws)
        shown = cairn(["config"], env, ws)
    assert proc.returncode == 0 and proc.stdout.strip() == "answer 1", proc.stderr
    assert gemma.refused == 0  # never refused: text form from the start
    assert "[result of tool call call_ls]" in json.dumps(gemma.answered[0]) and "notes.txt" in json.dumps(gemma.answered)
    assert any(line.split()[:2] == ["transcript", "text"] for line in shown.stdout.splitlines())


def test_a_bad_transcript_setting_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[profiles.p]\nprovider = "openai"\ntranscript = "prose"\n')
    proc = cairn(["config"], {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_CONFIG": str(config)}, tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "transcript" in proc.stderr


# ------------------------------------------------------------------------------------------------------------ TUI


@pytest.mark.anyio
async def test_the_tui_shows_the_served_window_and_a_stall_and_esc_ends_the_wait(tmp_path):
    from cairn.app.config.resolver import resolve_config
    from cairn.app.tui import CairnApp
    from cairn.persistence.events import TurnEnd
    from cairn.persistence.store import SessionStore
    from cairn.widgets.prompt_input import PromptInput
    from cairn.widgets.status_bar import StatusBar

    ws = tmp_path / "ws"
    ws.mkdir()
    with OpenAIServer([text("late", hold_before=True)], props={"default_generation_settings": {"n_ctx": 8192}}) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="gemma", base_url=server.base_url,
                                workspace=str(ws), env={"CAIRN_API_KEY": KEY, "CAIRN_MAX_RETRIES": "0"})
        store = SessionStore(tmp_path / "home", "jsonl")
        app = CairnApp(config, store.create(cwd=str(ws), deferred=True), store)
        try:
            async with app.run_test(size=(160, 30)) as pilot:
                await wait_for(pilot, lambda: app.chat.agent is not None, "the agent")
                app.chat.agent.loop.wait_report_every = 0.1
                app.chat.query_one(PromptInput).insert("hello")
                await pilot.press("enter")
                bar = lambda: str(app.chat.query_one(StatusBar).render())  # noqa: E731
                await wait_for(pilot, lambda: "waiting for the server:" in bar(), "the waiting report")
                assert "ctx 8.2k (server)" in bar()
                await pilot.press("escape")
                ended = await wait_for(pilot, lambda: [e for e in app.session.events if isinstance(e, TurnEnd)],
                                       "the turn to end")
                await wait_for(pilot, lambda: "waiting for the server" not in bar(), "the report to go")
                await pilot.press("ctrl+q")
        finally:
            server.release()
            app.close_if_still_open()
    assert ended[0].reason == "cancelled"


@pytest.mark.parametrize("message, expected", [
    ("request (19579 tokens) exceeds the available context size (8192 tokens), try increasing it", 8192),
    ("This model's maximum context length is 32768 tokens. However, you requested 40000 tokens", 32768),
    ("prompt is too long: 210000 tokens > 200000 maximum", 200000),
    ("context_length_exceeded", None),
])
def test_a_length_refusal_that_names_the_window_is_believed_over_a_configured_guess(message, expected):
    from cairn.app.agent.compaction import window_named_in
    from cairn.app.providers.base import ProviderError

    assert window_named_in(ProviderError(message, "HTTP_400")) == expected
