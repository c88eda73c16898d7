"""P8: open-to-usable. `cairn resume` of (a) an 80-turn / 2.5k-event session and (b) a session whose one answer is a
2000-item tight list, timed from launching the real command in a real terminal (tmux, 120×40) until the session's tail
is on screen and a typed key is echoed in the prompt. Baseline, same run (issue 29): the smallest Textual app that shows
a line and echoes a key (`bench/_bare_textual.py`: Python, Textual's import, first frame, nothing of Cairn), timed the
same way and interleaved with the `cairn resume` runs. Also reported: `cairn show` of the same session (a real process,
output to a pipe: the same Python start-up and log load, no terminal UI; issue 12's baseline), and a one-turn session
as the floor every `cairn resume` pays whatever the session (not judged).

Targets: issue 29, open-to-usable ≤ 1.5 × the bare Textual app for both sessions; issue 12, ≤ 1.0 s each.

The screen is read with `tmux capture-pane` every few milliseconds, so a figure can be late by one poll (~5–10 ms on
this machine); that error is small against the target and the same for every run.

    python bench/p8_tui_open.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import compile_bytecode, emit, header, median, temp_dir  # noqa: E402  (puts the project on sys.path)

TARGET_S = 1.0
TARGET_RATIO = 1.5  # × the bare Textual app (issue 29); issue 12's ≤ 3 × `cairn show` is reported, not judged
SIZE = (120, 40)
KEYS = "zqzq"  # typed once the tail is on screen; text that is nowhere in either session
TIMEOUT_S = 60.0
FLOOR = "1 turn (floor)"  # reported, not judged: what any session pays (start-up, imports, first frame)
BARE = "bare Textual app"  # reported, not judged: the framework's floor (bench/_bare_textual.py), no Cairn at all


def long_session_events(turns: int = 80) -> list:
    """80 turns of the shape a working session has: a prompt, a step with two tool calls and their results, and a
    streamed final answer (chunks as the log keeps them): ~31 events per turn, ~2.5k in all."""
    from cairn.persistence.events import (
        AssistantChunk, AssistantMessage, RequestHeader, StepEnd, StepStart, ToolCall, ToolCallRequest, ToolResult,
        TurnEnd, TurnStart, UserMessage,
    )

    events: list = []
    for t in range(1, turns + 1):
        calls = [ToolCallRequest(f"call_{t}_1_{k}", "read_file", {"path": f"src/module_{t}_{k}.py"}) for k in (1, 2)]
        answer = "".join(f"Paragraph {p} of answer {t}: the module does what its name says, and more words follow "
                         f"to give the paragraph a realistic length for a terminal.\n\n" for p in range(1, 5))
        answer += f"End of answer {t}."
        events += [TurnStart(turn=t), StepStart(turn=t, step=1), UserMessage(turn=t, step=1, text=f"question {t}"),
                   RequestHeader(turn=t, step=1, provider="script", model="script", params={}, tools=[],
                                 message_count=2 * t),
                   AssistantMessage(turn=t, step=1, text="Let me read the two modules.", tool_calls=calls,
                                    interrupted=False)]
        for c in calls:
            events += [ToolCall(turn=t, step=1, call_id=c.call_id, name=c.name, arguments=c.arguments,
                                safety="read_only", parent_call_id=None),
                       ToolResult(turn=t, step=1, call_id=c.call_id, is_error=False,
                                  content="".join(f"line {n} of {c.arguments['path']}\n" for n in range(40)),
                                  error_code=None, source_seq=None)]
        events += [StepEnd(turn=t, step=1), StepStart(turn=t, step=2),
                   RequestHeader(turn=t, step=2, provider="script", model="script", params={}, tools=[],
                                 message_count=2 * t + 3)]
        pieces = [answer[i:i + 36] for i in range(0, len(answer), 36)]
        events += [AssistantChunk(turn=t, step=2, delta=p) for p in pieces]
        events += [AssistantMessage(turn=t, step=2, text=answer, tool_calls=[], interrupted=False),
                   StepEnd(turn=t, step=2), TurnEnd(turn=t, reason="completed", error=None)]
    return events


def list_session_events(items: int = 2000) -> list:
    """One turn whose answer is a 2000-item tight list, streamed in 200 chunks (the issue's worst case)."""
    from cairn.persistence.events import (
        AssistantChunk, AssistantMessage, RequestHeader, StepEnd, StepStart, TurnEnd, TurnStart, UserMessage,
    )

    answer = "Items:\n\n" + "".join(f"- item {i}: word{i % 97} word{i % 89} `code{i % 7}`\n" for i in range(items))
    size = len(answer) // 200 + 1
    return ([TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="list them"),
             RequestHeader(turn=1, step=1, provider="script", model="script", params={}, tools=[], message_count=2)]
            + [AssistantChunk(turn=1, step=1, delta=answer[i:i + size]) for i in range(0, len(answer), size)]
            + [AssistantMessage(turn=1, step=1, text=answer, tool_calls=[], interrupted=False),
               StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="completed", error=None)])


def write_session(home: Path, session_id: str, events: list, cwd: Path) -> None:
    from cairn.persistence.events import encode_event
    from cairn.persistence.store import SessionStore

    store = SessionStore(home)
    opened = store.create(cwd=str(cwd), session_id=session_id)
    try:
        batch = []
        for seq, event in enumerate(events):
            event.seq = seq
            event.time = 1_764_686_400_000 + seq
            batch.append((seq, encode_event(event)))
        opened.writer.append(batch, durable=True)
    finally:
        opened.writer.close()
        opened.lock.release()


def cairn_command() -> list[str]:
    """The real `cairn` of this checkout's venv (the console script), else `python -m cairn.app.cli`; with
    CAIRN_BENCH_SRC, that checkout's `cairn` (loaded as `_common` loads it: A/B-testing a change)."""
    if os.environ.get("CAIRN_BENCH_SRC"):
        here = Path(__file__).resolve().parent
        launcher = (f"import sys; sys.path.insert(0, {str(here)!r}); import _common; "
                    "from cairn.app.cli import main; sys.exit(main())")
        return [sys.executable, "-c", launcher]
    script = Path(sys.executable).parent / "cairn"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cairn.app.cli"]


class Tmux:
    """A private tmux server (its own socket), so nothing of the user's tmux is touched."""

    def __init__(self, root: Path) -> None:
        self.socket = str(root / "tmux.sock")
        self.run("new-session", "-d", "-s", "idle", "-x", str(SIZE[0]), "-y", str(SIZE[1]), "sleep 3600")

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def capture(self, target: str) -> str:
        return self.run("capture-pane", "-p", "-t", target)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


def wait_screen(tmux: Tmux, target: str, needle: str, start: float) -> float:
    while True:
        if needle in tmux.capture(target):
            return time.perf_counter() - start
        if time.perf_counter() - start > TIMEOUT_S:
            raise TimeoutError(f"{needle!r} never appeared:\n{tmux.capture(target)}")
        time.sleep(0.004)


def resume_once(tmux: Tmux, env: dict, home: Path, session_id: str, tail: str, n: int,
                command: str = "") -> tuple[float, float]:
    """Seconds from launch to the tail on screen, and to the typed keys echoed."""
    target = f"r{n}"
    command = command or shlex.join([*cairn_command(), "--home", str(home), "resume", session_id])
    env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    start = time.perf_counter()
    tmux.run("new-session", "-d", "-s", target, "-x", str(SIZE[0]), "-y", str(SIZE[1]), *env_args, command)
    shown = wait_screen(tmux, target, tail, start)
    tmux.run("send-keys", "-t", target, "-l", KEYS)
    echoed = wait_screen(tmux, target, KEYS, start)
    tmux.run("send-keys", "-t", target, "C-q")
    for _ in range(500):  # the ordered quit; the next run needs the session's lock back
        if target not in tmux.run("list-sessions", "-F", "#{session_name}").split():
            break
        time.sleep(0.01)
    else:
        tmux.run("kill-session", "-t", target)
    return shown, echoed


def show_once(env: dict, home: Path, session_id: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([*cairn_command(), "--home", str(home), "show", session_id], env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr.decode()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not shutil.which("tmux"):
        print("P8 needs tmux (apt-get install tmux)", file=sys.stderr)
        sys.exit(2)
    figures: dict[str, dict] = {}
    with temp_dir("p8") as root:
        header("P8 cairn resume open-to-usable vs cairn show", root)
        print(f"   {compile_bytecode()}")
        home, workspace = root / "home", root / "ws"
        workspace.mkdir()
        sessions = {"80 turns": ("long-session", long_session_events(), "End of answer 80."),
                    "2000-item list": ("list-session", list_session_events(), "item 1999: word"),
                    FLOOR: ("one-turn", long_session_events(1), "End of answer 1.")}
        for label, (sid, events, _) in sessions.items():
            write_session(home, sid, events, workspace)
            print(f"   {label}: {len(events)} events, "
                  f"{sum(p.stat().st_size for p in home.rglob(sid + '*')) / 1e6:.2f} MB")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "TEXTUAL"))}
        env.update(CAIRN_PROVIDER="script", CAIRN_SCRIPT=str(root / "script.json"), TERM="xterm-256color")
        if os.environ.get("CAIRN_BENCH_SRC"):
            env["CAIRN_BENCH_SRC"] = os.environ["CAIRN_BENCH_SRC"]
        (root / "script.json").write_text('{"responses": []}')
        tmux = Tmux(root)
        bare_command = f"{sys.executable} {Path(__file__).with_name('_bare_textual.py')}"
        try:
            n = 0
            for label, (sid, _, tail) in sessions.items():
                shows, tails, echoes, bare_tails, bare_echoes = [], [], [], [], []
                show_once(env, home, sid)  # warm the page cache and .pyc files for both
                for _ in range(args.runs):
                    shows.append(show_once(env, home, sid))
                    n += 1
                    shown, echoed = resume_once(tmux, {"CAIRN_PROVIDER": "script",
                                                       "CAIRN_SCRIPT": env["CAIRN_SCRIPT"], "CAIRN_HOME": str(home),
                                                       **{k: v for k, v in env.items() if k == "CAIRN_BENCH_SRC"}},
                                                home, sid, tail, n)
                    tails.append(shown)
                    echoes.append(echoed)
                    n += 1  # the baseline right after, so both see the same machine (it is shared and noisy)
                    shown, echoed = resume_once(tmux, {}, home, "", "End of answer 1.", n, bare_command)
                    bare_tails.append(shown)
                    bare_echoes.append(echoed)
                f = figures[label] = {"show": median(shows), "tail": median(tails), "usable": median(echoes),
                                      "bare_tail": median(bare_tails), "bare": median(bare_echoes)}
                print(f"P8 {label:<16} median of {args.runs}: cairn resume: tail on screen {f['tail']:.3f} s, key "
                      f"echoed {f['usable']:.3f} s (worst {max(echoes):.3f} s)   bare Textual app: key echoed "
                      f"{f['bare']:.3f} s   ratio {f['usable'] / f['bare']:.2f}   (cairn show {f['show']:.3f} s, "
                      f"× {f['usable'] / f['show']:.2f})", flush=True)
        finally:
            tmux.close()
    floor = figures.pop(FLOOR)
    ratio = {k: f["usable"] / f["bare"] for k, f in figures.items()}
    worst = max(figures, key=ratio.__getitem__)
    ok = all(f["usable"] <= TARGET_S and ratio[k] <= TARGET_RATIO for k, f in figures.items())
    emit("p8_tui_open", figures[worst]["usable"], "s", figures[worst]["bare"], target=TARGET_RATIO, ok=ok,
         worst_session=worst, target_s=TARGET_S,
         usable_s={k: round(f["usable"], 3) for k, f in figures.items()},
         tail_s={k: round(f["tail"], 3) for k, f in figures.items()},
         bare_textual_usable_s={k: round(f["bare"], 3) for k, f in figures.items()},
         ratios={k: round(r, 3) for k, r in ratio.items()},
         show_s={k: round(f["show"], 3) for k, f in figures.items()},
         show_ratios={k: round(f["usable"] / f["show"], 3) for k, f in figures.items()},
         floor_usable_s=round(floor["usable"], 3), floor_ratio=round(floor["usable"] / floor["bare"], 3),
         runs=args.runs)


if __name__ == "__main__":
    main()
