"""`/model` with no argument lists the config file's profiles — each with its provider, model and server host, the one
in use marked — and says how to switch (issue 40). Nothing secret is shown: a base URL's user part never is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tui_helpers import wait_for

from cairn.app.config.resolver import resolve_config
from cairn.app.config.settings import DEFAULT_ANTHROPIC_MODEL
from cairn.app.slash_commands import model_listing, url_host
from cairn.app.tui import CairnApp
from cairn.persistence.store import SessionStore
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.transcript import Notice

CONFIG = """
default_profile = "deepseek"

[profiles.deepseek]
provider = "openai"
base_url = "https://api.deepseek.com/v1"
api_key_env = "DEEPSEEK_API_KEY"
model = "deepseek-chat"

[profiles.claude]
provider = "anthropic"

[profiles.local]
provider = "openai"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen2.5-coder"

[profiles.bare]
model = "some-model"
"""


def write_config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_the_listing_names_every_profile_with_provider_model_and_host_and_marks_the_one_in_use(tmp_path):
    path = write_config(tmp_path)
    config = SimpleNamespace(config_file=path, base_url="https://api.deepseek.com/v1")
    provider = SimpleNamespace(name="openai", model="deepseek-chat", recorded_endpoint="https://api.deepseek.com/v1")
    lines = model_listing(config, provider, "deepseek").splitlines()
    assert lines[0] == "Now: openai · deepseek-chat @ api.deepseek.com (profile deepseek)."
    assert lines[1] == f"Profiles in {path}:"
    assert lines[2:6] == [
        "▸ deepseek  openai · deepseek-chat · api.deepseek.com  (in use)",
        f"- claude    anthropic · {DEFAULT_ANTHROPIC_MODEL} (default) · api.anthropic.com",
        "- local     openai · qwen2.5-coder · 127.0.0.1:8080",
        "- bare      default provider · some-model · default server",
    ]
    assert "/model PROFILE" in lines[6] and "/model NAME" in lines[6]


def test_another_profile_in_use_is_the_one_marked(tmp_path):
    config = SimpleNamespace(config_file=write_config(tmp_path), base_url=None)
    provider = SimpleNamespace(name="openai", model="qwen2.5-coder", recorded_endpoint="http://127.0.0.1:8080/v1")
    marked = [line for line in model_listing(config, provider, "local").splitlines() if "▸" in line]
    assert marked == ["▸ local     openai · qwen2.5-coder · 127.0.0.1:8080  (in use)"]


def test_without_profiles_it_says_where_to_define_them():
    provider = SimpleNamespace(name="demo", model="demo")
    text = model_listing(SimpleNamespace(config_file=None, base_url=None), provider, None)
    assert text.startswith("Now: demo · demo.")
    assert "No profiles" in text and "[profiles.NAME]" in text and "config.toml" in text and "/model NAME" in text


def test_a_broken_config_file_is_said_not_raised(tmp_path):
    path = write_config(tmp_path, "[profiles.x]\nnot_a_setting = 1\n")
    provider = SimpleNamespace(name="demo", model="demo")
    text = model_listing(SimpleNamespace(config_file=path, base_url=None), provider, None)
    assert "cannot be read" in text and "not_a_setting" in text


def test_hosts_never_show_a_user_part():
    assert url_host("https://user:sk-secret@proxy.example:8443/v1?key=abc") == "proxy.example:8443"
    assert url_host("http://[::1]:9000/v1") == "[::1]:9000"
    assert url_host("not a url") == "?"


@pytest.mark.anyio
async def test_bare_model_in_the_tui_lists_the_profiles(tmp_path):
    path = write_config(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    config = resolve_config(home=str(home), workspace=str(workspace), config_file=str(path), profile="local",
                            env={"CAIRN_API_KEY": "sk-model-listing", "CAIRN_SNAPSHOTS": "off"})
    store = SessionStore(home, "jsonl")
    app = CairnApp(config, store.create(cwd=str(workspace), deferred=True), store)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the chat")
            app.chat.query_one(PromptInput).insert("/model")
            await pilot.press("enter")
            shown = await wait_for(pilot, lambda: [str(n.render()) for n in app.chat.query(Notice)
                                                   if "Profiles in" in str(n.render())], "the listing")
            await pilot.press("ctrl+q")
    finally:
        app.close_if_still_open()
    (text,) = shown
    assert "Now: openai · qwen2.5-coder @ 127.0.0.1:8080 (profile local)." in text
    assert "▸ local     openai · qwen2.5-coder · 127.0.0.1:8080  (in use)" in text
    assert "- deepseek  openai · deepseek-chat · api.deepseek.com" in text
    assert "sk-model-listing" not in text
