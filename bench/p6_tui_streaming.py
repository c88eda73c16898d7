"""P6: one scripted 20k-token streamed turn through the TUI (headless `run_test`) vs through `cairn run`'s path.

Both use the same script provider, composition, policy and JSONL store; the difference is the face: the TUI batches the
events into the chat screen and streams Markdown, `cairn run` writes deltas to stdout (here /dev/null).

The headline turn is paced like a fast model (20k tokens in 4,000 chunks, 1 ms apart: about 4k tokens/s): does the
TUI keep up? Target: TUI time ≤ 2.0 × headless time, same run. The unpaced figures (chunks as fast as the script can
produce them) are reported too, as each face's ceiling in tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

from _common import emit, median, temp_dir  # noqa: E402  (puts the project on sys.path)

import anyio

TOKENS = 20_000


def write_script(path: Path, tokens: int, chunks: int, delay_ms: int) -> Path:
    words = [f"word{i % 97} " if i % 50 else "\n\n" for i in range(tokens)]
    path.write_text(json.dumps({"responses": [{"text": "".join(words), "chunks": chunks, "delay_ms": delay_ms}]}))
    return path


def config_for(home: Path, script: Path, workspace: Path):
    from cairn.app.config import resolve_config

    return resolve_config(home=str(home), provider="script", script=str(script), workspace=str(workspace), env={})


async def headless_once(home: Path, script: Path, workspace: Path) -> float:
    from cairn.app.approval import headless_approver
    from cairn.app.compose import open_agent
    from cairn.app.headless import Printer

    sink = io.TextIOWrapper(open(os.devnull, "wb"), write_through=True)
    async with open_agent(config_for(home, script, workspace), approver=headless_approver(False)) as agent:
        with contextlib.redirect_stdout(sink):
            printer = Printer(as_json=False)
            agent.session.subscribe(printer)
            start = time.perf_counter()
            result = await agent.run("stream")
            elapsed = time.perf_counter() - start
    assert result.reason == "completed", result
    return elapsed


async def tui_once(home: Path, script: Path, workspace: Path) -> float:
    from cairn.app.tui import CairnApp
    from cairn.persistence.events import TurnEnd
    from cairn.widgets.prompt_input import PromptInput
    from cairn.persistence.store import SessionStore

    config = config_for(home, script, workspace)
    store = SessionStore(home)
    app = CairnApp(config, store.create(cwd=str(workspace)), store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        chat = app.chat
        assert chat is not None
        start = time.perf_counter()
        chat.query_one(PromptInput).post_message(PromptInput.Submitted("stream"))
        while not (chat.session.events and isinstance(chat.session.events[-1], TurnEnd)):
            await anyio.sleep(0.005)
        await pilot.pause()  # let the screen apply the last events
        elapsed = time.perf_counter() - start
        await app.action_quit()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--chunks", type=int, default=4000)
    parser.add_argument("--delay-ms", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with temp_dir("p6") as root:
        workspace = root / "ws"
        workspace.mkdir()
        paced = write_script(root / "paced.json", args.tokens, args.chunks, args.delay_ms)
        unpaced = write_script(root / "unpaced.json", args.tokens, args.tokens, 0)
        tui, headless = [], []
        for i in range(args.runs):
            headless.append(anyio.run(headless_once, root / f"h{i}", paced, workspace))
            tui.append(anyio.run(tui_once, root / f"t{i}", paced, workspace))
        tui_max = anyio.run(tui_once, root / "tu", unpaced, workspace)
        headless_max = anyio.run(headless_once, root / "hu", unpaced, workspace)
    value, baseline = median(tui), median(headless)
    n = args.tokens
    print(f"P6 {n}-token streamed turn in {args.chunks} chunks {args.delay_ms} ms apart, median of {args.runs}")
    print(f"  TUI (run_test)   {value:8.3f} s   {n / value:10.0f} tokens/s")
    print(f"  cairn run path   {baseline:8.3f} s   {n / baseline:10.0f} tokens/s")
    print(f"unpaced ({n} one-token chunks, no delay): TUI {tui_max:.3f} s ({n / tui_max:.0f} tokens/s), "
          f"cairn run {headless_max:.3f} s ({n / headless_max:.0f} tokens/s)")
    emit("p6_tui_streaming", value, "s", baseline, target=2.0, ok=value / baseline <= 2.0,
         tui_tokens_per_s=round(n / value), headless_tokens_per_s=round(n / baseline),
         unpaced_tui_tokens_per_s=round(n / tui_max), unpaced_headless_tokens_per_s=round(n / headless_max),
         tokens=n, chunks=args.chunks, delay_ms=args.delay_ms, runs=args.runs)


if __name__ == "__main__":
    main()
