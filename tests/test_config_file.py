"""The config file and its profiles (SPEC §6, §7 rev 2): parsing and one-line errors naming file, line and key, keys
only from the environment, precedence (flag > env > profile > default), `cairn config`, what a resumed session keeps,
Azure-style endpoints and SOCKS proxies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from openai_server import OpenAIServer, text

from cairn.app.config.provider import make_provider
from cairn.app.config.resolver import ConfigError, resolve_config
from cairn.app.config.resumed import config_for_session
from cairn.persistence.events import RequestHeader

CAIRN = str(Path(sys.executable).parent / "cairn")

SAMPLE = """\
default_profile = "deepseek"

[profiles.deepseek]
provider = "openai"
base_url = "https://api.deepseek.com"
api_key_env = "DEEPSEEK_API_KEY"
model = "deepseek-chat"
max_tokens = 4096
context_window = 131072
headers = { "X-Title" = "cairn" }

[profiles.local]
provider = "openai"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen2.5-coder"
include_usage = false

[profiles.claude]
provider = "anthropic"
model = "claude-sonnet-4-5"
thinking_budget = 2048
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(SAMPLE)
    return path


def resolve(path: Path | None, env: dict | None = None, **options):
    env = dict(env or {})
    if path is not None:
        env.setdefault("CAIRN_CONFIG", str(path))
    return resolve_config(workspace=str(path.parent if path else "."), env=env, **options)


def error_of(path: Path, content: str, **options) -> str:
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        resolve(path, **options)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- reading the file ----------------------------------------------------------------------------------------------------


def test_the_default_profile_gives_provider_model_url_key_and_parameters(config_path):
    config = resolve(config_path, {"DEEPSEEK_API_KEY": "sk-deep-1234"})
    assert (config.profile, config.provider, config.model) == ("deepseek", "openai", "deepseek-chat")
    assert config.base_url == "https://api.deepseek.com" and config.api_key == "sk-deep-1234"
    assert (config.max_tokens, config.context_window, config.headers) == (4096, 131072, {"X-Title": "cairn"})
    assert config.sources["model"] == "profile deepseek" and config.sources["profile"] == "config file default_profile"


def test_an_api_key_in_the_file_is_refused_saying_why_and_naming_the_line(tmp_path):
    message = error_of(tmp_path / "c.toml", '[profiles.x]\nprovider = "openai"\napi_key = "sk-live-123456"\n')
    assert message.startswith(f"{tmp_path / 'c.toml'}:3: profiles.x.api_key: ")
    assert "api_key_env" in message and "environment" in message and "sk-live" not in message


def test_an_authorization_header_in_the_file_is_refused(tmp_path):
    message = error_of(tmp_path / "c.toml", '[profiles.x]\nheaders = { Authorization = "Bearer sk-1234567" }\n')
    assert ":2: profiles.x.headers:" in message and "api_key_env" in message and "sk-1234567" not in message


def test_a_typo_is_an_error_with_file_line_key_and_a_suggestion(tmp_path):
    message = error_of(tmp_path / "c.toml", '[profiles.x]\nprovider = "openai"\n\nmax_tokns = 10\n')
    assert message == f"{tmp_path / 'c.toml'}:4: profiles.x.max_tokns: unknown setting; did you mean max_tokens?"


def test_an_unknown_top_level_key_is_an_error(tmp_path):
    message = error_of(tmp_path / "c.toml", 'model = "x"\n')
    assert ":1: model: unknown setting; profile settings go under [profiles.NAME]" in message


@pytest.mark.parametrize(
    "line, needle",
    [
        ('max_tokens = "lots"', "profiles.x.max_tokens: must be a whole number >= 1"),
        ("temperature = 7", "profiles.x.temperature: must be a number from 0 to 2"),
        ('provider = "gemini"', "profiles.x.provider: must be one of: openai, anthropic, demo, script"),
        ('base_url = "ftp://x"', "profiles.x.base_url: must be an http:// or https:// URL"),
        ('api_key_env = "not a name"', "profiles.x.api_key_env: must be the name of an environment variable"),
        ("include_usage = 1", "profiles.x.include_usage: must be true or false"),
    ],
)
def test_a_value_of_the_wrong_kind_names_file_line_and_key(tmp_path, line, needle):
    message = error_of(tmp_path / "c.toml", f"# profiles\n[profiles.x]\n{line}\n")
    assert f"c.toml:3: {needle}" in message


def test_invalid_toml_is_one_line_naming_the_file_and_position(tmp_path):
    message = error_of(tmp_path / "c.toml", "[profiles.x\n")
    assert "c.toml: not valid TOML" in message and "line 1" in message


def test_a_default_profile_that_does_not_exist_is_an_error(tmp_path):
    message = error_of(tmp_path / "c.toml", 'default_profile = "nope"\n[profiles.a]\nmodel = "m"\n')
    assert ":1: default_profile: names no profile of this file (profiles: a)" in message


def test_a_named_config_file_that_is_missing_is_an_error_but_an_absent_default_is_fine(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*CAIRN_CONFIG"):
        resolve(tmp_path / "missing.toml")
    assert resolve_config(workspace=str(tmp_path), env={}).config_file is None


def test_an_unknown_profile_lists_the_known_ones(config_path):
    with pytest.raises(ConfigError, match=r"profile 'nope'.*profiles: claude, deepseek, local"):
        resolve(config_path, profile="nope")


def test_a_profile_without_a_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no config file"):
        resolve_config(workspace=str(tmp_path), env={"CAIRN_PROFILE": "x"})


def test_reading_commands_never_read_the_file(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("this is = not toml [")
    config = resolve_config(workspace=str(tmp_path), env={"CAIRN_CONFIG": str(bad)}, runs_model=False)
    assert config.config_file is None


# -- precedence ---------------------------------------------------------------------------------------------------------


def test_precedence_is_flag_then_env_then_profile_then_default(config_path):
    env = {"DEEPSEEK_API_KEY": "sk-deep-1234"}
    assert resolve(config_path, env).model == "deepseek-chat"
    assert resolve(config_path, {**env, "CAIRN_MODEL": "from-env"}).model == "from-env"
    flagged = resolve(config_path, {**env, "CAIRN_MODEL": "from-env"}, model="from-flag")
    assert (flagged.model, flagged.sources["model"]) == ("from-flag", "flag --model")
    assert resolve(config_path, {**env, "CAIRN_MAX_TOKENS": "99"}).max_tokens == 99
    assert resolve(config_path, {**env, "CAIRN_MAX_TOKENS": "99"}, max_tokens="7").max_tokens == 7
    default = resolve(config_path, env)
    assert (default.timeout, default.sources["timeout"]) == (120.0, "default")


def test_the_profile_flag_beats_the_variable_which_beats_default_profile(config_path):
    assert resolve(config_path, {"CAIRN_PROFILE": "local"}).profile == "local"
    assert resolve(config_path, {"CAIRN_PROFILE": "local"}, profile="claude").profile == "claude"


def test_the_key_comes_from_cairn_api_key_then_the_profiles_variable_never_openai_api_key(config_path):
    env = {"DEEPSEEK_API_KEY": "sk-deep-1234", "OPENAI_API_KEY": "sk-openai-999"}
    assert resolve(config_path, env).api_key == "sk-deep-1234"
    assert resolve(config_path, {**env, "CAIRN_API_KEY": "sk-cairn-5"}).api_key == "sk-cairn-5"
    assert resolve(config_path, {"OPENAI_API_KEY": "sk-openai-999"}).api_key is None


def test_a_profiles_missing_key_is_exit_2_naming_its_variable_and_profile(config_path):
    config = resolve(config_path, {})
    with pytest.raises(ConfigError, match="set DEEPSEEK_API_KEY \\(named by api_key_env in profile deepseek\\)"):
        make_provider(config)


def test_a_chosen_profiles_provider_and_model_count_as_chosen_on_resume_the_default_profile_does_not(config_path):
    header = RequestHeader(seq=1, turn=1, step=1, provider="anthropic", model="claude-x", params={}, tools=[],
                           message_count=2, endpoint="https://api.anthropic.com")
    env = {"DEEPSEEK_API_KEY": "sk-deep-1234", "ANTHROPIC_API_KEY": "sk-ant-777777"}
    by_default = config_for_session(resolve(config_path, env), [header])
    assert (by_default.provider, by_default.model) == ("anthropic", "claude-x")
    # the default profile's endpoint belongs to its provider, not to the session's: the session's own is kept
    assert by_default.base_url == "https://api.anthropic.com" and by_default.api_key == "sk-ant-777777"
    assert by_default.headers == {}
    chosen = config_for_session(resolve(config_path, env, profile="deepseek"), [header])
    assert (chosen.provider, chosen.model, chosen.base_url) == ("openai", "deepseek-chat", "https://api.deepseek.com")
    by_variable = config_for_session(resolve(config_path, {**env, "CAIRN_PROFILE": "local"}), [header])
    assert (by_variable.provider, by_variable.model) == ("openai", "qwen2.5-coder")


# -- cairn config -------------------------------------------------------------------------------------------------------


def cairn(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}
    return subprocess.run([CAIRN, *args], env={**base, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_cairn_config_shows_each_setting_with_its_source_and_masks_the_key(config_path, tmp_path):
    proc = cairn(tmp_path, "config", "--json", "--model", "flagged", CAIRN_CONFIG=str(config_path),
                 DEEPSEEK_API_KEY="sk-deep-SECRET-1", CAIRN_TIMEOUT="30")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["profile"] == {"value": "deepseek", "source": "config file default_profile"}
    assert shown["model"] == {"value": "flagged", "source": "flag --model"}
    assert shown["timeout"] == {"value": 30.0, "source": "env CAIRN_TIMEOUT"}
    assert shown["base_url"] == {"value": "https://api.deepseek.com", "source": "profile deepseek"}
    assert shown["api_key"] == {"value": "***", "source": "env DEEPSEEK_API_KEY (profile deepseek)"}
    assert shown["max_retries"] == {"value": 4, "source": "default"}
    assert shown["config_file"] == {"value": str(config_path), "source": "env CAIRN_CONFIG"}
    assert "SECRET" not in proc.stdout + proc.stderr


def test_cairn_config_text_needs_no_reachable_provider_and_says_when_the_key_is_missing(config_path, tmp_path):
    proc = cairn(tmp_path, "--config", str(config_path), "config")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert rows["provider"].split()[1:] == ["openai", "profile", "deepseek"]
    assert "DEEPSEEK_API_KEY" in rows["api_key"] and "not set" in rows["api_key"]


def test_cairn_config_with_a_broken_file_is_exit_2_one_line(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[profiles.x]\napi_key = "sk-x-123456"\n')
    proc = cairn(tmp_path, "config", CAIRN_CONFIG=str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "c.toml:2: profiles.x.api_key" in proc.stderr
    assert "sk-x-123456" not in proc.stderr


def test_a_run_uses_the_profile_chosen_by_flag(tmp_path):
    with OpenAIServer([text("from the local profile")]) as server:
        path = tmp_path / "c.toml"
        path.write_text(f'[profiles.mine]\nprovider = "openai"\nbase_url = "{server.base_url}"\nmodel = "m1"\n'
                        f'include_usage = false\nheaders = {{ "X-Title" = "cairn" }}\n')
        proc = cairn(tmp_path, "run", "--config", str(path), "--profile", "mine", "hi", CAIRN_DEMO_DELAY_MS="0")
        request = server.requests[0]
    assert proc.returncode == 0 and proc.stdout == "from the local profile\n", proc.stderr
    assert request.body["model"] == "m1" and "stream_options" not in request.body
    assert request.header("x-title") == "cairn"


# -- Azure and proxies --------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_azure_style_url_keeps_its_query_and_sends_the_key_as_api_key(tmp_path):
    with OpenAIServer([text("azure says hi")]) as server:
        url = f"{server.url}/openai/deployments/gpt4o?api-version=2024-10-21"
        path = tmp_path / "c.toml"
        path.write_text(f'[profiles.azure]\nprovider = "openai"\nbase_url = "{url}"\napi_key_env = "AZURE_OPENAI_KEY"\n'
                        'api_key_header = "api-key"\n')
        config = resolve(path, {"AZURE_OPENAI_KEY": "azure-key-123456"}, profile="azure")
        provider = make_provider(config)
        from cairn.app.providers.base import ModelRequest

        items = [i async for i in provider.stream(ModelRequest([{"role": "user", "content": "hi"}], [], "gpt4o"))]
        await provider.aclose()
        request = server.requests[0]
    assert request.path == "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
    assert request.header("api-key") == "azure-key-123456" and request.header("authorization") is None
    assert items[0].text == "azure says hi"


def test_a_socks_proxy_is_supported(tmp_path, monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
    provider = make_provider(resolve_config(workspace=str(tmp_path), provider="openai", base_url="http://127.0.0.1:1/v1",
                                            env={}))
    anyio.run(provider.aclose)


def test_a_proxy_scheme_httpx_cannot_use_is_exit_2_one_line(tmp_path):
    proc = cairn(tmp_path, "run", "--provider", "openai", "--base-url", "http://127.0.0.1:9/v1", "hi",
                 ALL_PROXY="socks4://user:pw-SECRET@127.0.0.1:9")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "ALL_PROXY" in proc.stderr and "SECRET" not in proc.stderr and proc.stderr.count("\n") == 1


# -- the README's profiles ----------------------------------------------------------------------------------------------


def readme_profiles() -> str:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Connect a model", 1)[1]
    return section.split("```toml\n", 1)[1].split("```", 1)[0]


@pytest.mark.anyio
async def test_every_readme_profile_works_against_a_local_server_speaking_its_api(tmp_path):
    """Each profile of the README, with its base URL pointed at a local server of its kind: the request carries the
    profile's model, headers and key the way that API wants them."""
    import tomllib

    from anthropic_server import AnthropicServer, message

    from cairn.app.providers.base import ModelRequest, TextDelta

    profiles = tomllib.loads(readme_profiles())["profiles"]
    assert set(profiles) >= {"deepseek", "openai", "openrouter", "claude", "local", "litellm"}
    for name, profile in profiles.items():
        anthropic = profile["provider"] == "anthropic"
        server = AnthropicServer([message(f"hi from {name}")]) if anthropic else OpenAIServer([text(f"hi from {name}")])
        with server:
            text_toml = readme_profiles().replace(
                f'[profiles.{name}]', f'[profiles.{name}]\nbase_url = "{server.base_url}"', 1)
            text_toml = "\n".join(line for line in text_toml.splitlines()
                                  if not (line.startswith("base_url") and server.base_url not in line))
            path = tmp_path / f"{name}.toml"
            path.write_text(text_toml)
            env = {profile["api_key_env"]: f"key-for-{name}-123"} if "api_key_env" in profile else {}
            provider = make_provider(resolve(path, env, profile=name))
            try:
                items = [i async for i in provider.stream(ModelRequest([{"role": "user", "content": "hi"}], [], ""))]
            finally:
                await provider.aclose()
            sent = server.requests[0]
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == f"hi from {name}", name
        assert sent.body["model"] == profile["model"] and sent.refused is None, name
        if "api_key_env" in profile:
            expected = sent.header("x-api-key") if anthropic else sent.header("authorization")
            assert expected == (f"key-for-{name}-123" if anthropic else f"Bearer key-for-{name}-123"), name
        for header, value in profile.get("headers", {}).items():
            assert sent.header(header) == value, name


# -- the endpoint a session was sent to is kept (SPEC §6 rev 3) -------------------------------------------------------


def test_a_resumed_session_keeps_its_recorded_endpoint_unless_the_operator_names_another(tmp_path):
    header = RequestHeader(seq=1, turn=1, step=1, provider="openai", model="local-m", params={}, tools=[],
                           message_count=2, endpoint="http://127.0.0.1:8081/v1")
    kept = config_for_session(resolve_config(workspace=str(tmp_path), env={"CAIRN_PROVIDER": "openai"}), [header])
    assert (kept.base_url, kept.sources["base_url"]) == ("http://127.0.0.1:8081/v1", "the resumed session's last request")
    named = config_for_session(resolve_config(workspace=str(tmp_path), base_url="http://127.0.0.1:9/v1",
                                              env={"CAIRN_PROVIDER": "openai"}), [header])
    assert named.base_url == "http://127.0.0.1:9/v1"  # the operator's choice
    old = RequestHeader(seq=1, turn=1, step=1, provider="openai", model="m", params={}, tools=[], message_count=2)
    with pytest.raises(ConfigError, match="--base-url"):  # never the hosted default for a session that may be local
        config_for_session(resolve_config(workspace=str(tmp_path), env={"CAIRN_PROVIDER": "openai"}), [old])


def test_the_recorded_endpoint_holds_no_credential():
    from cairn.app.providers.openai import endpoint_of

    assert endpoint_of("https://user:pw@llm.example/v1?api-version=2&api_key=sk-1") == \
        "https://llm.example/v1?api-version=2"
    assert endpoint_of("http://127.0.0.1:8081/v1") == "http://127.0.0.1:8081/v1"


def test_a_resumed_session_reports_the_profile_its_next_request_uses(config_path):
    """ACP's `profile` option after session/load shows what the next request goes out with (issue 25)."""
    header = RequestHeader(seq=1, turn=1, step=1, provider="openai", model="qwen2.5-coder", params={}, tools=[],
                           message_count=2, profile="local", endpoint="http://127.0.0.1:8080/v1")
    env = {"DEEPSEEK_API_KEY": "sk-deep-1234"}
    resumed = config_for_session(resolve(config_path, env), [header])  # the file's default profile is deepseek
    assert (resumed.profile, resumed.model, resumed.base_url) == ("local", "qwen2.5-coder", "http://127.0.0.1:8080/v1")
    chosen = config_for_session(resolve(config_path, env, profile="deepseek"), [header])
    assert (chosen.profile, chosen.model) == ("deepseek", "deepseek-chat")
