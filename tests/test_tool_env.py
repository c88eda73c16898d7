"""Tools never see Cairn's keys, and a command runs exactly as approved (SPEC §10 rev 4), through the real `cairn run`.

A key in a tool's environment defeats every scrubber (`printenv KEY | rev` stores it reversed), so `run_command` and
MCP stdio servers are started without any key variable Cairn knows — the built-in names, every profile's `api_key_env`,
the database URL — nor any variable holding one of the session's secret values; an MCP server's own `env` / `env_vars`
are the operator's words and pass as configured. Masking (`***`) is for what is stored and shown: the command that runs
is the one the model wrote. Real processes throughout: a real OpenAI-protocol server, real shells, a real MCP server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from acp_helpers import rig_fixture, script_env
from crash_harness import Rig, json_lines
from openai_server import OpenAIServer, text, tool_calls

SERVER = str(Path(__file__).with_name("mcp_server.py"))
rig = pytest.fixture(rig_fixture, name="rig")

KEYS = {  # every key Cairn knows about in these tests, by the variable that holds it
    "MYKEY": "sk-profile-key-7f3a91",  # the chosen profile's api_key_env
    "OTHER_KEY": "sk-other-profile-55d2",  # another profile's api_key_env
    "OPENAI_API_KEY": "sk-openai-key-0c8e44",
    "ANTHROPIC_API_KEY": "sk-ant-key-9b1f27",
    "CAIRN_API_KEY": "sk-cairn-key-e6d503",
    "CAIRN_DATABASE_URL": "postgresql://cairn:pw-db-SECRET-31@127.0.0.1:1/cairn",
}
COPIES = {  # other names holding a secret value: the key in use, a profile's key, the database password
    "KEY_COPY": KEYS["CAIRN_API_KEY"],
    "MYKEY_COPY": KEYS["MYKEY"],
    "DB_PASSWORD": "pw-db-SECRET-31",
}
CONFIG = """default_profile = "work"

[profiles.work]
provider = "openai"
api_key_env = "MYKEY"

[profiles.other]
provider = "anthropic"
api_key_env = "OTHER_KEY"
"""


def configure(rig: Rig, extra: str = "") -> dict[str, str]:
    path = rig.io / "config.toml"
    path.write_text(CONFIG + extra)
    return {"CAIRN_CONFIG": str(path), "CAIRN_SNAPSHOTS": "off"}


def run(rig: Rig, env: dict[str, str], prompt: str) -> tuple[subprocess.CompletedProcess, str, list[dict]]:
    """`cairn run --yes --json PROMPT`: the process, its session id, and the session as stored on disk."""
    proc = rig.run("run", "--yes", "--json", prompt, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    session_id = json.loads(proc.stdout.splitlines()[0])["id"]
    stored = (rig.home / "sessions" / f"{session_id}.jsonl").read_text().splitlines()[1:]
    return proc, session_id, [json.loads(line) for line in stored]


def stored_bytes(rig: Rig) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(rig.home.rglob("*")) if p.is_file())


def environment_file(path: Path) -> dict[str, str]:
    """`env` output as a mapping (values with newlines are not used here)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def test_run_command_sees_no_key_and_the_log_holds_none_even_reversed(rig):
    names = [*KEYS, *COPIES]
    command = (f"env > env.txt; for v in {' '.join(names)}; do printenv $v | rev; done; "
               'echo "visible=$VISIBLE"')
    with OpenAIServer([tool_calls([{"id": "c1", "name": "run_command", "arguments": {"command": command}}]),
                       text("done")]) as server:
        env = {**configure(rig), **KEYS, **COPIES, "VISIBLE": "yes", "CAIRN_BASE_URL": server.base_url}
        proc, _, events = run(rig, env, "print the keys")

    seen = environment_file(rig.ws / "env.txt")
    assert seen["VISIBLE"] == "yes" and "PATH" in seen  # the rest of the environment is passed on
    assert not set(names) & set(seen), sorted(set(names) & set(seen))
    secrets = {*KEYS.values(), *COPIES.values()}
    assert not secrets & set(seen.values())
    result = of_type(events, "tool/result")[0]["content"]
    assert "visible=yes" in result and result.endswith("[exit code 0]")
    stored, output = stored_bytes(rig), proc.stdout + proc.stderr
    for secret in secrets:
        for form in (secret, secret[::-1]):
            assert form not in stored and form not in output, form


def test_a_command_holding_the_key_runs_with_the_real_key_while_the_log_shows_it_masked(rig):
    key = KEYS["MYKEY"]
    command = f"printf '%s' '{key}' > out.txt; echo ran"
    with OpenAIServer([tool_calls([{"id": "c1", "name": "run_command", "arguments": {"command": command}}]),
                       text("done")]) as server:
        env = {**configure(rig), "MYKEY": key, "CAIRN_BASE_URL": server.base_url}
        proc, _, events = run(rig, env, "write the key")

    assert (rig.ws / "out.txt").read_text() == key  # executed as written, not as `printf '%s' '***'`
    masked = "printf '%s' '***' > out.txt; echo ran"
    assert of_type(events, "tool/call")[0]["arguments"] == {"command": masked}
    assert of_type(events, "assistant/message")[0]["tool_calls"][0]["arguments"] == {"command": masked}
    assert key not in stored_bytes(rig) and key not in proc.stdout + proc.stderr


def test_an_mcp_server_sees_its_own_env_and_no_key_and_its_secrets_stay_out_of_commands(rig):
    dump = rig.io / "server-env.txt"
    args = ["-c", 'env > "$0" && exec "$1" "$2"', str(dump), sys.executable, SERVER]
    table = (f"\n[mcp_servers.tix]\ncommand = \"/bin/sh\"\nargs = {json.dumps(args)}\n"
             'env = { SERVER_SETTING = "from-config", ANTHROPIC_API_KEY = "server-own-anthropic-key" }\n'
             'env_vars = ["SERVICE_TOKEN"]\n')
    env = {**configure(rig, table), **KEYS, **COPIES, "SERVICE_TOKEN": "svc-token-SECRET-8a"}
    env.update(script_env(rig, [
        {"tool_calls": [{"name": "tix__lookup", "arguments": {"query": "q"}},
                        {"name": "run_command", "arguments": {"command": "env > command-env.txt"}}]},
        {"text": "done"},
    ]))
    _, _, events = run(rig, env, "look it up")

    assert [r["is_error"] for r in of_type(events, "tool/result")] == [False, False], of_type(events, "tool/result")
    server = environment_file(dump)
    assert server["SERVER_SETTING"] == "from-config"  # the server's own env, as configured …
    assert server["ANTHROPIC_API_KEY"] == "server-own-anthropic-key"  # … even under a key's name
    assert server["SERVICE_TOKEN"] == "svc-token-SECRET-8a"  # env_vars: named by the operator for this server
    leaked = {n for n in [*KEYS, *COPIES] if n in server} - {"ANTHROPIC_API_KEY"}
    assert not leaked, sorted(leaked)
    assert not {*KEYS.values(), *COPIES.values()} & set(server.values())
    command = environment_file(rig.ws / "command-env.txt")
    assert "SERVICE_TOKEN" not in command and "svc-token-SECRET-8a" not in command.values()  # a server's secret
    assert "server-own-anthropic-key" not in stored_bytes(rig)  # a secret-looking `env` value is scrubbed too
