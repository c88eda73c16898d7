"""PostgreSQL crash matrix (issue 39): a real `cairn run` whose server crashes at a random moment of its turn.

Each trial: a private PostgreSQL cluster (one for the whole run, tests/pg_helpers.py `PrivateServer`), a real `cairn run`
against a local OpenAI-protocol server (tests/openai_server.py): a slowly streamed answer that calls `run_command` (a
1.5 s body), then a second streamed answer. At a random moment after the turn's first row is stored, the server is
stopped like a crash (`pg_ctl -m immediate stop`: the write-behind commits still in its WAL buffers are lost) and
started again `--down` seconds later. Then: did `cairn run` finish its turn (exit 0), does `cairn show` read the session
(exit 0, seqs contiguous, answers whole), and is every row a completed barrier covered still there, unchanged?

    python bench/pg_crash_matrix.py [--trials 30] [--seed 1] [--down 1.0] [--wal-writer-delay 200ms]

Prints per-trial lines and the counts: trials, unreadable sessions, trials that lost acknowledged (durable) barriers,
trials with any violation, and trials whose crash took write-behind rows (at least; seen right after the restart).
Not a timing benchmark: value = trials with a violation, target 0; baseline = trials (ratio: violations per trial).
With CAIRN_BENCH_SRC=<checkout> the children run that checkout's Cairn (A/B of a fix, as for the other scripts).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TURN_SECONDS = 4.5  # about how long the trial's turn takes once its first row is stored (two answers, one tool body)


def as_cairn(src: str, argv: list[str]) -> int:
    """`cairn ARGS` run from the checkout `src` (the trials' children get a bare environment: it is passed here)."""
    os.environ["CAIRN_BENCH_SRC"] = src
    import _common  # noqa: F401  (loads that checkout's cairn package)
    from cairn.app.cli import main as cairn_main

    return cairn_main(argv)


def crash_at(offset: float):
    """A crash moment `offset` seconds after the session's first stored row."""
    first: list[float] = []

    def when(kinds: list[str], started: bool) -> bool:
        if not kinds:
            return False
        if not first:
            first.append(time.monotonic())
        return time.monotonic() - first[0] >= offset

    return when


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--down", type=float, default=1.0, help="seconds the server stays down")
    parser.add_argument("--wal-writer-delay", default=None,
                        help="the server's wal_writer_delay (default: its own, 200ms); longer loses more to a crash")
    parser.add_argument("--verbose", action="store_true", help="print every violation in full")
    args = parser.parse_args()

    from _common import SRC, emit, header  # (loads the checkout's cairn package)
    from pg_helpers import private_server, run_crash_trial

    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="cairn-bench-pgcrash-"))
    header(f"PostgreSQL crash matrix: {args.trials} immediate-mode crashes, server down {args.down:g} s", base)
    settings = {"wal_writer_delay": args.wal_writer_delay} if args.wal_writer_delay else None
    cairn = [sys.executable, str(Path(__file__).resolve()), "--as-cairn", str(SRC)]
    counts = {"unreadable": 0, "lost_barriers": 0, "violations": 0, "run_failed": 0, "lost_write_behind": 0}
    started = time.monotonic()
    with private_server(settings) as server:
        print(f"   private server in {server.dir}; wal_writer_delay {args.wal_writer_delay or 'default'}; "
              f"Cairn from {SRC}")
        for n in range(args.trials):
            offset = rng.uniform(0.0, TURN_SECONDS)
            root = base / f"t{n}"
            trial = run_crash_trial(server, root, f"pgc{n}", crash_at(offset), f"{offset:.2f} s", down=args.down,
                                    cairn=cairn)
            found = trial.violations()
            counts["unreadable"] += trial.unreadable
            counts["lost_barriers"] += bool(trial.lost_barrier())
            counts["violations"] += bool(found)
            counts["run_failed"] += trial.run_code != 0
            counts["lost_write_behind"] += trial.lost_by_crash() > 0
            kinds = [kind for _, kind, _ in trial.before]
            where = kinds[-1] if kinds else "nothing stored"
            print(f"trial {n:3d}: crash at +{offset:.2f} s after {len(kinds)} rows (last {where}, durable through "
                  f"seq {trial.durable}); the crash took {trial.lost_by_crash()} rows; run exit {trial.run_code}, "
                  f"show exit {trial.show_code}; {'ok' if not found else f'{len(found)} violation(s)'}")
            for v in found:
                print(f"           {v if args.verbose else v.splitlines()[0][:300]}")
    elapsed = time.monotonic() - started
    shutil.rmtree(base, ignore_errors=True)
    print(f"trials {args.trials}  unreadable sessions {counts['unreadable']}  lost acknowledged barriers "
          f"{counts['lost_barriers']}  runs that failed {counts['run_failed']}  trials with violations "
          f"{counts['violations']}  crashes that took write-behind rows (at least) {counts['lost_write_behind']}; "
          f"{elapsed:.0f} s")
    emit("pg_crash_matrix", counts["violations"], "violations", baseline=max(args.trials, 1), target=0,
         ok=counts["violations"] == 0, trials=args.trials, unreadable=counts["unreadable"],
         lost_barriers=counts["lost_barriers"], run_failed=counts["run_failed"],
         lost_write_behind=counts["lost_write_behind"], down=args.down,
         wal_writer_delay=args.wal_writer_delay or "default", seconds=round(elapsed, 1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-cairn"]:
        sys.exit(as_cairn(sys.argv[2], sys.argv[3:]))
    main()
