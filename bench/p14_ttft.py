"""P14 — time to first token: Cairn against the official `openai` SDK on the same instant local server, same run.

An instant OpenAI-protocol server runs in a child process (this script with `--serve`): HTTP/1.1 with keep-alive,
`POST …/chat/completions` answered at once with a streamed chat completion (the first event already carries text),
`GET /props` answered like llama-server (n_ctx 8192), anything else 404. Both clients talk to it over 127.0.0.1; the
rounds alternate between them (order swapped every round), so machine noise hits both.

(a) Turns of one session. Cairn: one `open_session(provider="openai", …)` with the defaults an operator gets
    (checkpoint policy, workspace snapshots, project context on, in a small git workspace); a turn is timed from the
    call of `session.run(prompt)` to the moment its first `assistant/chunk` is appended (the first streamed text).
    SDK: one `AsyncOpenAI` client; `chat.completions.create(stream=True)` with the same messages (system prompt and
    the conversation so far) and the same tool schemas, timed to the first chunk carrying text. Value = Cairn's median
    TTFT, baseline = the SDK's; target ratio <= 1.1. The same with CAIRN_PROJECT_CONTEXT=off is printed too.
(b) A fresh session: `open_session(…)` + its first turn, against a fresh `AsyncOpenAI` client + its first request;
    target ratio <= 1.5.
(c) `cairn acp` answering `initialize`: the process spawned, one ACP initialize line written on its stdin at once,
    timed until the answer line is read; against `cairn --version`'s whole process time; target ratio <= 1.2.

The last line's value/baseline/ratio are (a)'s; (b) and (c) are extra fields, and `ok` needs all three.
`--profile FILE` writes a cProfile of (a)'s Cairn turns (to see what a turn does before its request); `--server-ms N`
makes the server wait N ms before its first byte (a model's own time, as a real server has), `--only` runs one part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import compile_bytecode, emit, header, median, percentile, temp_dir

TARGET_TURNS = 1.1
TARGET_FRESH = 1.5
TARGET_ACP = 1.2
MODEL = "bench-model"
KEY = "sk-bench-0123456789"
ANSWER = ["Hello", " from", " the", " instant", " server."]
FIRST_TOKEN_S = float(os.environ.get("P14_FIRST_TOKEN_MS") or 0) / 1000  # the server's own delay (`--server-ms`)


# -- the instant server (child process) -----------------------------------------------------------------------------

def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse_body(model: str) -> bytes:
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": model}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER[0]},
                                     "finish_reason": None}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]} for t in ANSWER[1:]]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events.append({**base, "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                                                      "total_tokens": 105}})
    out = b"".join(_chunk(b"data: " + json.dumps(e).encode() + b"\n\n") for e in events)
    return out + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode("latin-1").split(" ", 2)
            length = 0
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                name, _, value = h.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if method == "POST" and path.split("?")[0].endswith("/chat/completions"):
                model = json.loads(body).get("model") or MODEL
                if FIRST_TOKEN_S:
                    await asyncio.sleep(FIRST_TOKEN_S)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" + _sse_body(model))
            elif method == "GET" and path == "/props":
                data = json.dumps({"default_generation_settings": {"n_ctx": 8192}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(data), data))
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- the clients ------------------------------------------------------------------------------------------------------

class FirstChunk:
    """Notes the moment the first `assistant/chunk` of the session is appended after `arm()`."""

    def __init__(self) -> None:
        self.at: int | None = None

    def arm(self) -> None:
        self.at = None

    def __call__(self, event: object) -> None:
        if self.at is None and type(event).__name__ == "AssistantChunk":
            self.at = time.perf_counter_ns()


def session_options(home: Path, ws: Path, url: str) -> dict:
    return dict(workspace=str(ws), provider="openai", base_url=url, model=MODEL, api_key=KEY, home=str(home),
                approve=True)


async def cairn_turn(session, first: FirstChunk, prompt: str) -> float:
    first.arm()
    start = time.perf_counter_ns()
    result = await session.run(prompt)
    assert result.reason == "completed", (result.reason, result.error)
    assert first.at is not None
    return (first.at - start) / 1e6


async def sdk_request(client, messages: list[dict], tools: list[dict]) -> float:
    start = time.perf_counter_ns()
    at = None
    parts = []
    stream = await client.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=True,
                                                  max_tokens=2048, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if at is None:
                at = time.perf_counter_ns()
            parts.append(chunk.choices[0].delta.content)
    assert at is not None
    messages.append({"role": "assistant", "content": "".join(parts)})
    return (at - start) / 1e6


def tool_dicts(session) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in session.loop.tools.schemas()]


async def turns_of_one_session(home: Path, ws: Path, url: str, rounds: int, profile: str | None,
                               env: dict[str, str] | None = None) -> tuple[list[float], list[float]]:
    """(Cairn's TTFTs, the SDK's) over `rounds` alternating turns; `env`: variables set while the session is open."""
    from openai import AsyncOpenAI

    from cairn.app.api import open_session

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    profiler = None
    try:
        cairn_ms, sdk_ms = [], []
        async with open_session(**session_options(home, ws, url)) as session:
            first = FirstChunk()
            session.session.subscribe(first)
            client = AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
            messages: list[dict] = [{"role": "system", "content": session.loop.exchange.system_prompt}]
            tools = tool_dicts(session)
            for i in range(rounds + 3):  # the first 3 rounds warm both up (connections, the window probe)
                prompt = f"question {i}: what is in this workspace?"

                async def ours() -> float:
                    if profiler is not None:
                        profiler.enable()
                    try:
                        return await cairn_turn(session, first, prompt)
                    finally:
                        if profiler is not None:
                            profiler.disable()

                async def theirs() -> float:
                    messages.append({"role": "user", "content": prompt})
                    return await sdk_request(client, messages, tools)

                if i == 3 and profile:
                    import cProfile

                    profiler = cProfile.Profile()
                pair = [await ours(), await theirs()] if i % 2 else list(reversed([await theirs(), await ours()]))
                if i >= 3:
                    cairn_ms.append(pair[0])
                    sdk_ms.append(pair[1])
            await client.close()
        if profiler is not None and profile:
            profiler.dump_stats(profile)
        return cairn_ms, sdk_ms
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def fresh_sessions(home: Path, ws: Path, url: str, rounds: int) -> tuple[list[float], list[float]]:
    from cairn.app.api import open_session

    shape: dict = {}

    async def ours(prompt: str) -> float:
        first = FirstChunk()
        start = time.perf_counter_ns()
        async with open_session(**session_options(home, ws, url)) as session:
            session.session.subscribe(first)
            result = await session.run(prompt)
            shape.update(system=session.loop.exchange.system_prompt, tools=tool_dicts(session))
        assert result.reason == "completed" and first.at is not None, (result.reason, result.error)
        return (first.at - start) / 1e6

    cairn_ms, sdk_ms = [], []
    await ours("warm-up")  # (the same request shape for the SDK: Cairn's system prompt and tool schemas)
    for i in range(rounds + 2):
        prompt = f"fresh question {i}"
        if i % 2:
            a = await ours(prompt)
            b = await theirs_fresh(url, shape["system"], shape["tools"], prompt)
        else:
            b = await theirs_fresh(url, shape["system"], shape["tools"], prompt)
            a = await ours(prompt)
        if i >= 2:
            cairn_ms.append(a)
            sdk_ms.append(b)
    return cairn_ms, sdk_ms


async def theirs_fresh(url: str, system: str | None, tools: list[dict] | None, prompt: str) -> float:
    """A fresh client + its first request, timed from before the client is built to the first text chunk."""
    from openai import AsyncOpenAI

    start = time.perf_counter_ns()
    client = AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
    at = None
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system or ""}, {"role": "user", "content": prompt}],
        tools=tools or [], stream=True, max_tokens=2048, stream_options={"include_usage": True})
    async for chunk in stream:
        if at is None and chunk.choices and chunk.choices[0].delta.content:
            at = time.perf_counter_ns()
    await client.close()
    assert at is not None
    return (at - start) / 1e6


# -- (c) cairn acp -----------------------------------------------------------------------------------------------------

def acp_initialize(argv: list[str], env: dict, cwd: Path) -> float:
    start = time.perf_counter_ns()
    proc = subprocess.Popen([*argv, "acp"], env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin and proc.stdout
    proc.stdin.write(b'{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, '
                     b'"clientCapabilities": {}}}\n')
    proc.stdin.flush()
    line = proc.stdout.readline()
    took = (time.perf_counter_ns() - start) / 1e6
    answer = json.loads(line)
    assert answer.get("id") == 0 and answer["result"]["protocolVersion"] == 1, line
    proc.stdin.close()
    proc.wait(timeout=30)
    return took


def version_time(argv: list[str], env: dict, cwd: Path) -> float:
    start = time.perf_counter_ns()
    done = subprocess.run([*argv, "--version"], env=env, cwd=cwd, capture_output=True)
    took = (time.perf_counter_ns() - start) / 1e6
    assert done.returncode == 0 and done.stdout.startswith(b"cairn"), done
    return took


def acp_rounds(home: Path, ws: Path, url: str, rounds: int) -> tuple[list[float], list[float]]:
    from p8_tui_open import cairn_command

    argv = cairn_command()
    env = {**os.environ, "CAIRN_HOME": str(home), "CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": url,
           "CAIRN_MODEL": MODEL, "CAIRN_API_KEY": KEY, "CAIRN_CONFIG": str(home / "none.toml")}
    acp, version = [], []
    for i in range(rounds + 1):
        pair = (acp_initialize(argv, env, ws), version_time(argv, env, ws)) if i % 2 else \
            tuple(reversed((version_time(argv, env, ws), acp_initialize(argv, env, ws))))
        if i:
            acp.append(pair[0])
            version.append(pair[1])
    return acp, version


# -- the run ----------------------------------------------------------------------------------------------------------

def make_workspace(ws: Path) -> None:
    """A small project: a git repository with a README, an instructions file and a few dozen source files."""
    ws.mkdir()
    (ws / "README.md").write_text("# bench project\n\nA small project for P14.\n")
    (ws / "AGENTS.md").write_text("Run the tests with `make test`.\n")
    src = ws / "src"
    src.mkdir()
    for i in range(40):
        (src / f"module_{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    subprocess.run([*git, "add", "."], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=ws, check=True)


def line(label: str, values: list[float]) -> str:
    return (f"{label:<44} n={len(values):<4} median {median(values):8.2f} ms   p90 {percentile(values, 90):8.2f} ms"
            f"   min {min(values):8.2f} ms")


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(_serve())
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="measured turns in (a) (default 40)")
    parser.add_argument("--fresh", type=int, default=20, help="measured fresh sessions in (b) (default 20)")
    parser.add_argument("--acp", type=int, default=15, help="measured process starts in (c) (default 15)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of (a)'s Cairn turns here")
    parser.add_argument("--only", choices=["turns", "fresh", "acp"], help="run one part only")
    parser.add_argument("--server-ms", type=float, default=0,
                        help="the server waits this long before its first byte (a model's own time; default 0)")
    args = parser.parse_args()
    os.environ["P14_FIRST_TOKEN_MS"] = str(args.server_ms)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_common.SRC, capture_output=True,
                            text=True).stdout.strip() or "?"
    for name in ("CAIRN_PROJECT_CONTEXT", "CAIRN_PROVIDER", "CAIRN_BASE_URL", "CAIRN_MODEL", "CAIRN_API_KEY",
                 "OPENAI_API_KEY", "OPENAI_BASE_URL", "CAIRN_SNAPSHOTS", "CAIRN_CONTEXT_WINDOW"):
        os.environ.pop(name, None)
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        with temp_dir("p14") as root:
            home, ws = root / "home", root / "ws"
            home.mkdir()
            (home / "none.toml").write_text("")
            os.environ["CAIRN_CONFIG"] = str(home / "none.toml")
            make_workspace(ws)
            header("P14 time to first token: Cairn vs the openai SDK on one instant local server"
                   + (f" (first byte after {args.server_ms:g} ms)" if args.server_ms else ""), root)
            print(f"   {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
                  f"load {open('/proc/loadavg').read().split()[:3]}")
            results: dict = {}
            if args.only in (None, "turns"):
                ours, theirs = asyncio.run(turns_of_one_session(home, ws, url, args.rounds, args.profile))
                print(line("(a) openai SDK, turns of one conversation", theirs))
                print(line("(a) Cairn, turns of one session (defaults)", ours))
                results["turns"] = (median(ours), median(theirs))
                print(f"    ratio {median(ours) / median(theirs):.2f} (target <= {TARGET_TURNS})")
                for key, label, env in (
                        ("turns_context_off", "CAIRN_PROJECT_CONTEXT=off", {"CAIRN_PROJECT_CONTEXT": "off"}),
                        ("turns_both_off", "project context and snapshots off",
                         {"CAIRN_PROJECT_CONTEXT": "off", "CAIRN_SNAPSHOTS": "off"})):
                    off, off_sdk = asyncio.run(turns_of_one_session(home, ws, url, args.rounds // 2, None, env))
                    print(line("    openai SDK (same rounds)", off_sdk))
                    print(line(f"    Cairn, {label}", off))
                    results[key] = median(off) / median(off_sdk)
                    print(f"    ratio {results[key]:.2f}")
            if args.only in (None, "fresh"):
                ours, theirs = asyncio.run(fresh_sessions(home, ws, url, args.fresh))
                print(line("(b) openai SDK, fresh client + first request", theirs))
                print(line("(b) Cairn, open_session + first turn", ours))
                results["fresh"] = (median(ours), median(theirs))
                print(f"    ratio {median(ours) / median(theirs):.2f} (target <= {TARGET_FRESH})")
            if args.only in (None, "acp"):
                print(f"   {compile_bytecode()}")
                acp, version = acp_rounds(home, ws, url, args.acp)
                print(line("(c) cairn --version, whole process", version))
                print(line("(c) cairn acp, spawn to initialize answered", acp))
                results["acp"] = (median(acp), median(version))
                print(f"    ratio {median(acp) / median(version):.2f} (target <= {TARGET_ACP})")
    finally:
        server.terminate()
        server.wait(timeout=10)
    turns = results.get("turns", (float("nan"), 1.0))
    fresh = results.get("fresh")
    acp_pair = results.get("acp")
    ok = all(r is not None and r[0] / r[1] <= t for r, t in
             ((results.get("turns"), TARGET_TURNS), (fresh, TARGET_FRESH), (acp_pair, TARGET_ACP)))
    extra = {}
    if fresh:
        extra.update(fresh_ms=fresh[0], fresh_sdk_ms=fresh[1], fresh_ratio=round(fresh[0] / fresh[1], 3),
                     fresh_target=TARGET_FRESH)
    if acp_pair:
        extra.update(acp_initialize_ms=acp_pair[0], version_ms=acp_pair[1],
                     acp_ratio=round(acp_pair[0] / acp_pair[1], 3), acp_target=TARGET_ACP)
    for key in ("turns_context_off", "turns_both_off"):
        if key in results:
            extra[f"{key}_ratio"] = round(results[key], 3)
    emit("p14_ttft", turns[0], "ms", turns[1], TARGET_TURNS, ok, commit=commit, **extra)


if __name__ == "__main__":
    sys.exit(main())
