"""Issue 44: an override on resume never changes the host (SPEC §6 rev 3). Whatever changes the provider or the model of
a resumed session — a flag, a variable, or a profile chosen by either — the next request goes to the endpoint the
session was sent to, unless a host is named; a provider whose protocol cannot talk to that endpoint is exit 2 naming
what to pass. The full matrix (every provider pair × every way of overriding) at the config level, the key cases
through the real `cairn` against a real local server that speaks both protocols on one root, as LiteLLM does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from anthropic_server import AnthropicServer, _AnthropicHandler, message
from openai_server import _Handler, _HTTPServer, text

from cairn.app.config.checks import ConfigError
from cairn.app.config.resolver import resolve_config
from cairn.app.config.resumed import config_for_session, switched_endpoint
from cairn.persistence.events import RequestHeader

CAIRN = str(Path(sys.executable).parent / "cairn")
PROVIDERS = ("demo", "script", "openai", "anthropic")
SERVERS = ("openai", "anthropic")
WAYS = ("flag", "variable", "--profile", "CAIRN_PROFILE")
# one LiteLLM-like root, as each provider records it
LOCAL = {"openai": "http://127.0.0.1:4000/v1", "anthropic": "http://127.0.0.1:4000"}
KEYS = {"OPENAI_API_KEY": "sk-openai-switch-1", "ANTHROPIC_API_KEY": "sk-ant-switch-2"}


def header(provider: str, endpoint: str | None = None, model: str = "recorded-model") -> RequestHeader:
    return RequestHeader(seq=1, turn=1, step=1, provider=provider, model=model, params={}, tools=[], message_count=2,
                         endpoint=endpoint)


def recorded(provider: str) -> list[RequestHeader]:
    """A session whose last request used `provider` (at the local root when it has a server)."""
    return [header(provider, LOCAL.get(provider))]


def override(tmp_path: Path, way: str, provider: str | None = None, *, model: str | None = None,
             base_url: str | None = None, file_extra: str = ""):
    """The config a resume starts from when the operator overrides the provider / model / server `way`: with flags,
    with variables, or with a config-file profile `to` holding them, chosen by --profile or CAIRN_PROFILE."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    settings = {"provider": provider, "model": model, "base_url": base_url,
                "script": str(script) if provider == "script" else None}
    lines = [f'{name} = "{value}"' for name, value in settings.items() if value is not None]
    config_file = tmp_path / "config.toml"
    config_file.write_text(file_extra + "[profiles.to]\n" + "\n".join(lines) + "\n")
    env = {**KEYS, "CAIRN_CONFIG": str(config_file)}
    if way == "flag":
        return resolve_config(workspace=str(tmp_path), env=env, **settings)
    if way == "variable":
        names = {"provider": "CAIRN_PROVIDER", "model": "CAIRN_MODEL", "base_url": "CAIRN_BASE_URL",
                 "script": "CAIRN_SCRIPT"}
        env.update({names[k]: v for k, v in settings.items() if v is not None})
        return resolve_config(workspace=str(tmp_path), env=env)
    if way == "--profile":
        return resolve_config(workspace=str(tmp_path), env=env, profile="to")
    return resolve_config(workspace=str(tmp_path), env={**env, "CAIRN_PROFILE": "to"})


# -- the matrix: every provider pair × every way of overriding the provider -----------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("new", PROVIDERS)
@pytest.mark.parametrize("old", PROVIDERS)
def test_a_provider_override_keeps_the_recorded_host_or_needs_one_named(tmp_path, old, new, way):
    config = override(tmp_path, way, new)
    if new in SERVERS and old not in SERVERS:  # never sent to any server: every host is a new one
        with pytest.raises(ConfigError, match="never been sent to a server") as refused:
            config_for_session(config, recorded(old))
        assert "\n" not in str(refused.value)
        assert all(name in str(refused.value) for name in ("--base-url", "CAIRN_BASE_URL", "--profile"))
        return
    resumed = config_for_session(config, recorded(old))
    assert resumed.provider == new
    # demo and script send nothing anywhere; a server provider goes where the session went, in its own path form
    assert resumed.base_url == (LOCAL[new] if new in SERVERS else None)
    if new in SERVERS and old != new:
        assert resumed.api_key == KEYS[f"{new.upper()}_API_KEY"]  # the new provider's key, to the same host


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("provider", SERVERS)
def test_a_model_override_alone_keeps_the_recorded_endpoint(tmp_path, provider, way):
    # the profile names the same provider and another model; a flag or variable names only the model
    config = override(tmp_path, way, provider if way in ("--profile", "CAIRN_PROFILE") else None, model="other-m")
    resumed = config_for_session(config, recorded(provider))
    assert (resumed.provider, resumed.model, resumed.base_url) == (provider, "other-m", LOCAL[provider])
    assert resumed.sources["base_url"] == "the resumed session's last request"


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("old, new", [("openai", "anthropic"), ("anthropic", "openai"), ("demo", "openai"),
                                      ("script", "anthropic"), ("openai", "openai")])
def test_a_named_host_is_the_operators_choice(tmp_path, old, new, way):
    named = "http://127.0.0.1:5999" + ("/v1" if new == "openai" else "")
    resumed = config_for_session(override(tmp_path, way, new, base_url=named), recorded(old))
    assert (resumed.provider, resumed.base_url) == (new, named)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("old, endpoint, new", [
    ("openai", "https://api.openai.com/v1", "anthropic"),
    ("anthropic", "https://api.anthropic.com", "openai"),
    ("openai", "https://team.openai.azure.com/openai/deployments/gpt?api-version=2024-06-01", "anthropic"),
])
def test_a_provider_that_cannot_talk_to_the_recorded_host_is_refused_naming_what_to_pass(tmp_path, old, endpoint,
                                                                                         new, way):
    with pytest.raises(ConfigError) as refused:
        config_for_session(override(tmp_path, way, new), [header(old, endpoint)])
    line = str(refused.value)
    assert "\n" not in line and f"does not speak the {new} protocol" in line
    assert all(name in line for name in ("--base-url", "CAIRN_BASE_URL", "--profile NAME"))
    # the same vendor with a model override is still its own host
    kept = config_for_session(override(tmp_path, way, old if way in ("--profile", "CAIRN_PROFILE") else None,
                                       model="other-m"), [header(old, endpoint)])
    assert (kept.provider, kept.base_url) == (old, endpoint)


def test_a_profile_chosen_by_default_names_no_host(tmp_path):
    """The file's `default_profile` is not the operator naming a server: its base URL does not move the session."""
    extra = 'default_profile = "elsewhere"\n[profiles.elsewhere]\nprovider = "openai"\nbase_url = "http://10.9.9.9/v1"\n'
    resumed = config_for_session(override(tmp_path, "flag", "openai", file_extra=extra), recorded("anthropic"))
    assert resumed.base_url == LOCAL["openai"]
    switched_by_default = config_for_session(override(tmp_path, "flag", None, file_extra=extra), recorded("anthropic"))
    assert (switched_by_default.provider, switched_by_default.base_url) == ("anthropic", LOCAL["anthropic"])


@pytest.mark.parametrize("new", SERVERS)
def test_a_session_that_went_through_demo_returns_to_the_server_it_was_sent_to(tmp_path, new):
    history = [header("openai", "http://127.0.0.1:4000/v1"), header("demo"), header("script")]
    resumed = config_for_session(override(tmp_path, "variable", new), history)
    assert resumed.base_url == LOCAL[new]


def test_a_switch_from_a_session_whose_endpoint_was_not_recorded_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="did not record"):
        config_for_session(override(tmp_path, "variable", "anthropic"), [header("openai")])


@pytest.mark.parametrize("endpoint, old, new, expected", [
    ("http://h:4000/v1", "openai", "anthropic", "http://h:4000"),
    ("http://h:4000", "anthropic", "openai", "http://h:4000/v1"),
    ("http://h:4000/v1/chat/completions", "openai", "anthropic", "http://h:4000"),
    ("http://h:4000/v1/messages", "anthropic", "openai", "http://h:4000/v1"),
    ("http://h:4000/v1", "anthropic", "openai", "http://h:4000/v1"),
    ("https://llm.corp.example/litellm", "anthropic", "openai", "https://llm.corp.example/litellm/v1"),
    ("https://gw.example/openai/v1?team=a", "openai", "anthropic", "https://gw.example/openai?team=a"),
    ("http://[::1]:8080/v1/", "openai", "anthropic", "http://[::1]:8080"),
])
def test_the_kept_host_takes_the_new_providers_path_convention(endpoint, old, new, expected):
    assert switched_endpoint(endpoint, old, new) == expected


# -- through the real command, against one local server that speaks both protocols -----------------------------------


class _BothHandler(_AnthropicHandler):
    """POST …/v1/messages is answered as an Anthropic server does, the rest (…/chat/completions, the limit probes) as
    an OpenAI-compatible one."""

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/").endswith("/v1/messages"):
            super().do_POST()
        else:
            _Handler.do_POST(self)


class BothServer(AnthropicServer):
    """A real local server with both routes under one root, as LiteLLM, llama.cpp and vLLM have; one queue of answers
    (`text` for an OpenAI request, `message` for an Anthropic one)."""

    def start(self) -> "BothServer":
        import threading

        httpd = _HTTPServer((self._host, self._port), _BothHandler)
        httpd.owner = self  # type: ignore[assignment]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def posts(self) -> list[str]:
        return [r.path for r in self.requests if r.method == "POST"]


ANSWER = {"openai": lambda t: text(t), "anthropic": lambda t: message(t)}
ROUTE = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


@pytest.fixture
def env(tmp_path):
    (tmp_path / "ws").mkdir()
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"), "LANG": "C.UTF-8",
            "CAIRN_PROJECT_CONTEXT": "off", "CAIRN_DEMO_DELAY_MS": "0"}


def cairn(env: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAIRN, *args], env={**env, **extra}, cwd=Path(env["HOME"]) / "ws", capture_output=True,
                          text=True, timeout=60)


def endpoints(env: dict, session_id: str) -> list[tuple[str, str]]:
    shown = cairn(env, "show", session_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return [(e["provider"], e.get("endpoint")) for e in map(json.loads, shown.stdout.splitlines())
            if e["type"] == "request/header"]


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.strip().splitlines() if not re.match(r"cairn: session \S+ \(", line)]
    assert len(lines) == 1 and lines[0].startswith("cairn: ") and "Traceback" not in proc.stderr, proc.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


def root_for(server: BothServer, provider: str) -> str:
    return server.url + ("/v1" if provider == "openai" else "")


def first_turn(env: dict, server: BothServer, provider: str, session_id: str = "s") -> None:
    server.push(ANSWER[provider]("first answer"))
    first = cairn(env, "run", "--session-id", session_id, "hello", CAIRN_PROVIDER=provider,
                  CAIRN_BASE_URL=root_for(server, provider), **KEYS)
    assert first.returncode == 0, first.stderr


def test_the_testers_case_an_anthropic_session_resumed_with_cairn_provider_openai_stays_on_its_server(env):
    """Recorded at a local LiteLLM-like root with `anthropic`; resumed with CAIRN_PROVIDER=openai and OPENAI_API_KEY
    in the environment, no host named: the next request goes to the same server's OpenAI route, not to api.openai.com."""
    with BothServer() as server:
        first_turn(env, server, "anthropic")
        server.push(text("second answer"))
        resumed = cairn(env, "run", "--resume", "s", "again", CAIRN_PROVIDER="openai",
                        OPENAI_API_KEY=KEYS["OPENAI_API_KEY"])
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == "second answer"
        assert server.posts() == ["/v1/messages", "/v1/chat/completions"]
        assert server.requests[-1].header("authorization") == f"Bearer {KEYS['OPENAI_API_KEY']}"
        assert endpoints(env, "s") == [("anthropic", server.url), ("openai", server.url + "/v1")]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("old, new", [("openai", "anthropic"), ("anthropic", "openai")])
def test_each_way_of_switching_the_provider_keeps_the_server(env, tmp_path, old, new, way):
    config = tmp_path / "config.toml"
    config.write_text(f'[profiles.to]\nprovider = "{new}"\n')
    how = {"flag": (["--provider", new], {}), "variable": ([], {"CAIRN_PROVIDER": new}),
           "--profile": (["--profile", "to"], {}), "CAIRN_PROFILE": ([], {"CAIRN_PROFILE": "to"})}[way]
    with BothServer() as server:
        first_turn(env, server, old)
        server.push(ANSWER[new]("second answer"))
        resumed = cairn(env, "run", *how[0], "--resume", "s", "again", CAIRN_CONFIG=str(config), **how[1], **KEYS)
        assert resumed.returncode == 0, resumed.stderr
        assert server.posts() == [ROUTE[old], ROUTE[new]]
        assert endpoints(env, "s") == [(old, root_for(server, old)), (new, root_for(server, new))]


def test_a_model_override_goes_to_the_same_endpoint(env):
    with BothServer() as server:
        first_turn(env, server, "openai")
        server.push(text("second answer"))
        resumed = cairn(env, "run", "--model", "other-model", "--resume", "s", "again", **KEYS)
        assert resumed.returncode == 0, resumed.stderr
        assert server.requests[-1].body["model"] == "other-model"
        assert endpoints(env, "s") == [("openai", server.url + "/v1")] * 2


def test_a_vendor_host_the_new_provider_cannot_talk_to_is_exit_2_and_nothing_is_sent(env):
    from tui_helpers import completed_turn, write_log

    from cairn.persistence.store import SessionStore

    events = completed_turn(1, "hello", "hi")
    events[3] = header("openai", "https://api.openai.com/v1")
    write_log(SessionStore(Path(env["CAIRN_HOME"]), "jsonl"), "vendor", events, cwd=str(Path(env["HOME"]) / "ws"))
    for args, extra in ((["--provider", "anthropic"], {}), ([], {"CAIRN_PROVIDER": "anthropic"})):
        proc = cairn(env, "run", *args, "--resume", "vendor", "again", **extra, **KEYS)
        one_line_error(proc, 2, "api.openai.com", "does not speak the anthropic protocol", "--base-url URL",
                       "CAIRN_BASE_URL", "--profile NAME")
    assert endpoints(env, "vendor") == [("openai", "https://api.openai.com/v1")]  # no request was made


def test_a_demo_session_goes_to_a_server_only_once_one_is_named_and_back_to_it_after_demo(env):
    with BothServer() as server:
        demo = cairn(env, "run", "--provider", "demo", "--session-id", "d", "hello")
        assert demo.returncode == 0, demo.stderr
        refused = cairn(env, "run", "--resume", "d", "again", CAIRN_PROVIDER="openai", **KEYS)
        one_line_error(refused, 2, "never been sent to a server", "--base-url URL", "https://api.openai.com/v1")
        server.push(text("now at a server"))
        named = cairn(env, "run", "--base-url", server.url + "/v1", "--resume", "d", "again", CAIRN_PROVIDER="openai",
                      **KEYS)
        assert named.returncode == 0 and named.stdout.strip() == "now at a server", named.stderr
        assert cairn(env, "run", "--resume", "d", "a demo turn", "--provider", "demo").returncode == 0
        server.push(message("back at the same server"))
        back = cairn(env, "run", "--resume", "d", "and again", "--provider", "anthropic", **KEYS)
        assert back.returncode == 0 and back.stdout.strip() == "back at the same server", back.stderr
        assert server.posts() == ["/v1/chat/completions", "/v1/messages"]
        assert endpoints(env, "d") == [("demo", None), ("openai", server.url + "/v1"), ("demo", None),
                                       ("anthropic", server.url)]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("old, endpoint, new, suggested", [
    ("anthropic", "https://llm.example.com", "openai", "https://llm.example.com/v1"),
    ("openai", "http://10.1.2.3:4000/v1", "anthropic", "http://10.1.2.3:4000"),
])
def test_a_switch_at_a_remote_host_needs_it_named_so_no_key_goes_there_unasked(tmp_path, old, endpoint, new,
                                                                              suggested, way):
    """A remote host may serve one vendor only (DeepSeek, a company gateway): the other provider's key is not sent to
    it until the operator names it; the one line says exactly what to pass."""
    with pytest.raises(ConfigError) as refused:
        config_for_session(override(tmp_path, way, new), [header(old, endpoint)])
    line = str(refused.value)
    assert "\n" not in line and f"--base-url {suggested}" in line and "key would be sent there" in line
    named = config_for_session(override(tmp_path, way, new, base_url=suggested), [header(old, endpoint)])
    assert (named.provider, named.base_url) == (new, suggested)
