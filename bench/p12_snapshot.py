"""P12 — what does a workspace snapshot cost per turn (SPEC §9 rev 3, issue 30; §10 rev 4, issue 38)?

A generated workspace of 10,000 files / ~200 MB (text files of 4–36 KB in 100 directories, a `.gitignore`). Each
round changes 20 files (what a turn's tools and commands typically touch), then times:

- Cairn: `ShadowRepo.snapshot()` — what the loop runs at a turn's start and end (git with Cairn's private
  environment, its own index, the size and secret checks before a changed file is added, the manifest of what was left
  out, every new object and its directory fsync'd);
- baseline (same run, same tree, same round): plain `git add -A && git write-tree` with a GIT_DIR and index of its own
  and the same fsync settings (`core.fsync=loose-object`, `core.fsyncMethod=fsync`).

The two are run alternately (order swapped every round) so machine noise hits both. Both start from a first full
snapshot (hashing the 200 MB once), which is reported apart and not in the ratio.

value = Cairn median ms per snapshot; baseline = plain git median; target ratio <= 1.2.
Extra: the wait a side-effecting `run_command` adds on an unchanged tree (a snapshot right after the previous one,
as before a command in the middle of a turn): median ms, target <= 50.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
from pathlib import Path

from _common import describe, emit, header, median, now_ns, temp_dir

from cairn.app.agent.snapshots import ShadowRepo


def generate(ws: Path, files: int, total_mb: int, rng: random.Random) -> None:
    average = total_mb * 1024 * 1024 // files
    line = b"the quick brown fox jumps over the lazy dog; 0123456789 abcdefghij\n"
    for i in range(files):
        d = ws / f"dir{i % 100:03}"
        d.mkdir(exist_ok=True)
        size = rng.randint(average // 5, average * 9 // 5)
        body = (line * (size // len(line) + 1))[:size - 12] + f"{i:010}\n".encode()
        (d / f"file{i:05}.txt").write_bytes(body)
    (ws / ".gitignore").write_text("*.log\nbuild/\n")


FSYNC = ["-c", "core.fsync=loose-object", "-c", "core.fsyncMethod=fsync"]  # what Cairn's snapshots use


def plain_git(ws: Path, git_dir: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(git_dir), "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(ws),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["git", *FSYNC, "add", "-A"], env=env, cwd=ws, check=True, capture_output=True)
    subprocess.run(["git", *FSYNC, "write-tree"], env=env, cwd=ws, check=True, capture_output=True)


def touch(ws: Path, rng: random.Random, files: int, n: int, round_no: int) -> None:
    for _ in range(n):
        i = rng.randrange(files)
        path = ws / f"dir{i % 100:03}" / f"file{i:05}.txt"
        with open(path, "ab") as f:
            f.write(f"round {round_no}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(12)
    with temp_dir("p12") as where:
        header("P12 workspace snapshot per turn", where)
        ws = where / "ws"
        ws.mkdir()
        generate(ws, args.files, args.mb, rng)
        plain_dir = where / "plain.git"
        subprocess.run(["git", "init", "-q", "--bare", str(plain_dir)], check=True,
                       env={"PATH": os.environ["PATH"], "HOME": str(where)})
        repo = ShadowRepo(where / "home", ws, "bench", budget=600, holds_secret=lambda data: b"sk-bench-key" in data)
        t0 = now_ns()
        repo.snapshot()
        first_cairn = now_ns() - t0
        t0 = now_ns()
        plain_git(ws, plain_dir)
        first_plain = now_ns() - t0
        print(f"   first full snapshot: Cairn {first_cairn / 1e6:.0f} ms, plain git {first_plain / 1e6:.0f} ms")
        cairn_ns, plain_ns, unchanged_ns = [], [], []
        for r in range(args.rounds):
            touch(ws, rng, args.files, 20, r)
            order = [("cairn", repo.snapshot), ("plain", lambda: plain_git(ws, plain_dir))]
            if r % 2:
                order.reverse()
            for name, run in order:
                t0 = now_ns()
                run()
                (cairn_ns if name == "cairn" else plain_ns).append(now_ns() - t0)
            t0 = now_ns()
            repo.snapshot()  # unchanged since the one above: what a command waits for mid-turn
            unchanged_ns.append(now_ns() - t0)
        print(describe("Cairn snapshot (20 files changed)", cairn_ns))
        print(describe("plain git add -A && write-tree", plain_ns))
        print(describe("Cairn snapshot, unchanged tree", unchanged_ns))
        value, baseline = median(cairn_ns) / 1e6, median(plain_ns) / 1e6
        unchanged = median(unchanged_ns) / 1e6
        emit("p12_snapshot", value, "ms", baseline, 1.2, value / baseline <= 1.2 and unchanged <= 50,
             unchanged_ms=unchanged, unchanged_target_ms=50, files=args.files, mb=args.mb,
             first_cairn_ms=first_cairn / 1e6, first_plain_ms=first_plain / 1e6)


if __name__ == "__main__":
    main()
