"""Power-cut matrix (SPEC §12 rev 4): many seeded cases of tests/powercut_lib.py — CAIRN_HOME and the workspace on the
power-cut file system (tests/powercut_fs.py), turns, rewinds and undos cut at barrier points and at random moments
(half of the cuts keep a random prefix of each file's unsynced writes; a third of the cases run on a 1,024-token
window, so their turns compact), each followed by the oracle's checks.

    python bench/power_cut_matrix.py --cases 40 --backend jsonl [--seed 1] [--steps 6]

Prints the counts (cases, steps, cuts at failpoints / at random moments / keeping a prefix, durable events and
outside effects checked, refusals, violations). Not a timing benchmark: value = violations (plus harness errors),
target 0; baseline = cuts (ratio: violations per cut).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit, header  # noqa: E402

import powercut_fs  # noqa: E402
import powercut_lib  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--backend", choices=["jsonl", "sqlite"], default="jsonl")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (cases use seed, seed+1, …)")
    parser.add_argument("--steps", type=int, default=6, help="steps per case")
    args = parser.parse_args()
    reason = powercut_fs.unavailable()
    if reason:
        sys.exit(f"power_cut_matrix: {reason}")
    base = Path(tempfile.mkdtemp(prefix="cairn-bench-powercut-"))
    header(f"power-cut matrix: {args.cases} cases on {args.backend} from seed {args.seed}", base)
    total = powercut_lib.Tally()
    errors = []
    started = time.monotonic()
    for seed in range(args.seed, args.seed + args.cases):
        root = base / f"case{seed}"
        root.mkdir()
        try:
            window = 1024 if seed % 3 == 0 else None  # a third of the cases compact their history as they go
            tally = powercut_lib.run_case(root, args.backend, seed, steps=args.steps, window=window)
            total.add(tally)
            for v in tally.violations:
                print(v[:400])
        except Exception as e:  # a harness failure: counted apart, never hidden
            errors.append(f"seed {seed}: {type(e).__name__}: {e}")
            print(errors[-1])
        finally:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"cases {args.cases}  steps {total.steps}  cuts {total.cuts} (at failpoints {total.failpoint_cuts}, "
          f"random {total.random_cuts}, keeping a prefix {total.kept_prefix_cuts})  durable events checked "
          f"{total.events_checked}  outside effects checked {total.effects_checked}  refused (exit 4) {total.refused}  "
          f"compactions {total.compactions}")
    print(f"violations {len(total.violations)}; harness errors {len(errors)}; {elapsed:.0f} s")
    shutil.rmtree(base, ignore_errors=True)
    bad = len(total.violations) + len(errors)
    emit("power_cut_matrix", bad, "violations", baseline=max(total.cuts, 1), target=0, ok=bad == 0,
         backend=args.backend, cases=args.cases, cuts=total.cuts, failpoint_cuts=total.failpoint_cuts,
         random_cuts=total.random_cuts, kept_prefix=total.kept_prefix_cuts, events_checked=total.events_checked,
         effects_checked=total.effects_checked, refused=total.refused, compactions=total.compactions, harness_errors=len(errors),
         seconds=round(elapsed, 1))


if __name__ == "__main__":
    main()
