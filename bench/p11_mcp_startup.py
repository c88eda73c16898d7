"""P11: MCP servers out of the way (issue 29).

(a) `cairn run` with one local stdio MCP server (`bench/_mcp_tiny.py`, written with the `mcp` SDK), a turn whose model
(the script provider) calls the server's tool once and then answers, timed from launch to exit. Baseline, same run and
interleaved: the SDK's own client starting that server and listing its tools, as a process of its own
(`bench/_mcp_sdk_client.py`: Python, the SDK's import, the server's start, `initialize`, `tools/list`, the ordered
stop). Value: the difference; target ≤ 0.3 s. `cairn run` of the same turn without the tool and without the server is
reported too (what Cairn costs on its own).

(b) The TUI's open-to-usable (`cairn resume` of a one-turn session in a real terminal, as P8 times it: until a typed
key is echoed) with that server configured, against the same without it, interleaved; target ≤ 1.1×. The servers
start in the background, so the prompt does not wait for them.

    python bench/p11_mcp_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import compile_bytecode, emit, header, median, temp_dir  # noqa: E402  (puts the project on sys.path)
from p8_tui_open import Tmux, cairn_command, long_session_events, resume_once, write_session

TARGET_OVER_SDK_S = 0.3
TARGET_TUI_RATIO = 1.1
HERE = Path(__file__).resolve().parent
SERVER = HERE / "_mcp_tiny.py"


def timed(argv: list[str], env: dict, cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with temp_dir("p11") as root:
        header("P11 MCP start-up: cairn run vs the SDK's own client; TUI open with and without a server", root)
        print(f"   {compile_bytecode()}")
        home, ws = root / "home", root / "ws"
        ws.mkdir()
        (root / "none.toml").write_text("")
        config = root / "config.toml"
        config.write_text(f"[mcp_servers.tiny]\ncommand = {json.dumps(sys.executable)}\n"
                          f"args = [{json.dumps(str(SERVER))}]\n")
        with_tool = root / "tool.json"
        with_tool.write_text(json.dumps({"responses": [
            {"tool_calls": [{"name": "tiny__echo", "arguments": {"text": "hello"}}]}, {"text": "done"}]}))
        plain = root / "plain.json"
        plain.write_text(json.dumps({"responses": [{"text": "done"}]}))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "TEXTUAL"))}
        if os.environ.get("CAIRN_BENCH_SRC"):
            base["CAIRN_BENCH_SRC"] = os.environ["CAIRN_BENCH_SRC"]
        base.update(CAIRN_HOME=str(home), CAIRN_PROVIDER="script")
        env_mcp = {**base, "CAIRN_CONFIG": str(config), "CAIRN_SCRIPT": str(with_tool)}
        env_plain = {**base, "CAIRN_CONFIG": str(root / "none.toml"), "CAIRN_SCRIPT": str(plain)}
        run = [*cairn_command(), "run", "go"]
        sdk = [sys.executable, str(HERE / "_mcp_sdk_client.py"), str(SERVER)]
        timed(run, env_mcp, ws), timed(sdk, base, ws), timed(run, env_plain, ws)  # warm-up (.pyc, page cache)
        with_mcp, sdk_client, without = [], [], []
        for _ in range(args.runs):
            with_mcp.append(timed(run, env_mcp, ws))
            sdk_client.append(timed(sdk, base, ws))
            without.append(timed(run, env_plain, ws))
        a, b, c = median(with_mcp), median(sdk_client), median(without)
        print(f"P11 cairn run, one MCP server, one call to its tool: {a:.3f} s   SDK client start + list: {b:.3f} s   "
              f"over the SDK: {a - b:+.3f} s (target ≤ {TARGET_OVER_SDK_S} s)   cairn run without MCP: {c:.3f} s",
              flush=True)

        # (b) the TUI, with and without the server configured
        write_session(home, "one-turn", long_session_events(1), ws)
        tui: dict[str, list[float]] = {"with": [], "without": []}
        if shutil.which("tmux"):
            tmux = Tmux(root)
            try:
                n = 0
                for _ in range(args.runs):
                    for label, cfg in (("without", root / "none.toml"), ("with", config)):
                        n += 1
                        env = {"CAIRN_PROVIDER": "script", "CAIRN_SCRIPT": str(plain), "CAIRN_HOME": str(home),
                               "CAIRN_CONFIG": str(cfg),
                               **{k: v for k, v in base.items() if k == "CAIRN_BENCH_SRC"}}
                        tui[label].append(resume_once(tmux, env, home, "one-turn", "End of answer 1.", n)[1])
            finally:
                tmux.close()
            t_with, t_without = median(tui["with"]), median(tui["without"])
            print(f"P11 TUI open-to-usable: with the server configured {t_with:.3f} s, without {t_without:.3f} s, "
                  f"ratio {t_with / t_without:.2f} (target ≤ {TARGET_TUI_RATIO})", flush=True)
        else:
            print("P11 TUI part skipped: no tmux", file=sys.stderr)
            t_with = t_without = float("nan")
    tui_ratio = t_with / t_without
    ok = a - b <= TARGET_OVER_SDK_S and tui_ratio <= TARGET_TUI_RATIO
    emit("p11_mcp_startup", a - b, "s over the SDK client", b, target=TARGET_OVER_SDK_S, ok=ok,
         cairn_run_with_mcp_s=a, sdk_client_s=b, cairn_run_without_mcp_s=c, tui_with_s=t_with,
         tui_without_s=t_without, tui_ratio=round(tui_ratio, 3), tui_target=TARGET_TUI_RATIO, runs=args.runs)


if __name__ == "__main__":
    main()
