"""What issue 44 took off the way to a turn's first token (bench/p14_ttft.py measures it): one TLS context per process
for the providers' clients, no directory fsync for a workspace snapshot that wrote nothing, and the project context
read while the turn-start snapshot is taken, recorded in the same order as before."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from cairn.app.agent.snapshots import ShadowRepo
from cairn.app.providers.anthropic import AnthropicProvider
from cairn.app.providers.openai import OpenAIProvider
from cairn.app.providers.tls import shared_ssl_context

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")


def client_context(provider: OpenAIProvider):
    """The TLS context of the provider's client (httpx keeps it on its connection pool)."""
    return provider._get_client()._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_providers_of_one_process_share_one_tls_context():
    first = OpenAIProvider("m", base_url="http://127.0.0.1:9/v1")
    second = OpenAIProvider("m", base_url="https://example.invalid/v1", api_key="sk-x")
    third = AnthropicProvider("m", base_url="https://example.invalid", api_key="sk-y")
    assert client_context(first) is client_context(second) is client_context(third) is shared_ssl_context()
    assert client_context(first).verify_mode.name == "CERT_REQUIRED"  # (certificates still checked)


def test_another_ca_setting_gets_its_own_tls_context(monkeypatch):
    import certifi

    default = shared_ssl_context()
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    own = shared_ssl_context()
    assert own is not default and own is shared_ssl_context()
    assert client_context(OpenAIProvider("m", base_url="http://127.0.0.1:9/v1")) is own


@needs_git
def test_a_snapshot_that_wrote_nothing_syncs_no_directory(tmp_path: Path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    repo = ShadowRepo(tmp_path / "home", ws, "s1")
    synced: list[int] = []
    real = repo._sync_objects
    monkeypatch.setattr(repo, "_sync_objects", lambda since: (synced.append(since), real(since)))
    first = repo.snapshot()
    assert len(synced) == 1  # the first one wrote the tree: its object directories are synced
    same = repo.snapshot()
    assert same.tree == first.tree and len(synced) == 1  # unchanged: nothing written, nothing to sync
    (ws / "a.txt").write_text("changed\n")
    changed = repo.snapshot()
    assert changed.tree != first.tree and len(synced) == 2


@needs_git
def test_the_turn_start_snapshot_and_the_project_context_keep_their_order(tmp_path: Path, monkeypatch):
    """turn/start, workspace/snapshot, then the context events, then step/start: the context was read beside the
    snapshot, and is recorded after it, as before."""
    from cairn.app.api import open_session

    monkeypatch.setenv("CAIRN_PROJECT_CONTEXT", "on")
    monkeypatch.setenv("CAIRN_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Be brief.\n")
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)

    async def main() -> list[str]:
        async with open_session(str(ws), provider="demo", home=str(tmp_path / "home")) as session:
            for prompt in ("one", "two"):
                assert (await session.run(prompt)).reason == "completed"
            return [type(e).__name__ for e in session.session.events]

    kinds = anyio.run(main)
    first = kinds[kinds.index("TurnStart"):kinds.index("StepStart")]
    assert first == ["TurnStart", "WorkspaceSnapshot", "ContextEnvironment", "ContextInstructions"]
    second = kinds[len(kinds) - kinds[::-1].index("TurnStart") - 1:]
    assert second[:2] == ["TurnStart", "WorkspaceSnapshot"] and second[2] == "StepStart"  # nothing new to record


def test_a_request_body_encodes_to_the_same_json_as_json_dumps():
    import json

    from cairn.app.providers.base import encode_json

    body = {"model": "m", "messages": [{"role": "user", "content": "héllo 你好 😀"}], "n": 10**30, "t": 0.5,
            "tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "object"}}}]}
    assert json.loads(encode_json(body)) == body
    assert json.loads(encode_json({True: 1, None: 2})) == {"true": 1, "null": 2}  # (what msgspec refuses: json's way)
