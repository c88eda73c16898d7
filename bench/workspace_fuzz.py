"""Workspace fuzz (SPEC §10 rev 4, §9): many random cases through the real CLI, each checked by the invariants of
tests/workspace_fuzz_lib.py (exit codes, no traceback, refusals touch nothing, dry runs write nothing, a rewind reverses
only what Cairn's turns changed or names what it leaves, nothing outside the workspace changes, undo is exact, a rewind
SIGKILLed midway is blocked until --finish, which completes it as if it had run whole).

    python bench/workspace_fuzz.py --cases 200 --backend jsonl [--seed 1] [--jobs 2] [--no-odd-names] [--no-big]
                                   [--no-dir-swaps] [--literal] [--minimize] [--verbose]

Prints the counts (cases, turns, rewinds, undos, kills, violations, by kind) and, with --minimize, a shrunk step list
for the first case of each kind of violation. Not a timing benchmark: value = violations (plus harness errors),
target 0; baseline = cases (ratio: violations per case).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit, header  # noqa: E402

import workspace_fuzz_lib as fuzz  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--backend", choices=["jsonl", "sqlite", "postgres"], default="jsonl")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (cases use seed, seed+1, …)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run side by side (each is a chain of processes)")
    parser.add_argument("--no-odd-names", action="store_true", help="no non-UTF-8 file names")
    parser.add_argument("--no-big", action="store_true", help="no 11 MB files")
    parser.add_argument("--no-dir-swaps", action="store_true", help="no file replaced by a directory")
    parser.add_argument("--literal", action="store_true",
                        help="invariant 3 over turns only (an earlier rewind's changes must stay; see the library)")
    parser.add_argument("--minimize", action="store_true", help="shrink the first failing case of each kind")
    parser.add_argument("--verbose", action="store_true", help="print every violation in full")
    args = parser.parse_args()
    opts = fuzz.Options(odd_names=not args.no_odd_names, big_files=not args.no_big,
                         dir_swaps=not args.no_dir_swaps, literal=args.literal)

    base = Path(tempfile.mkdtemp(prefix="cairn-bench-wsfuzz-"))
    header(f"workspace fuzz: {args.cases} cases on {args.backend} from seed {args.seed}", base)
    with contextlib.ExitStack() as stack:
        if args.backend == "postgres":
            from _pg import pg_schema

            stack.enter_context(pg_schema("wsfuzz"))  # CAIRN_DATABASE_URL: every case has its own session id

        def one(seed: int) -> tuple[int, fuzz.Case | None, str]:
            root = base / f"case{seed}"
            root.mkdir()
            try:
                case = fuzz.run_case(root, args.backend, seed, opts, sid=f"fz{seed}")
                return seed, case, ""
            except Exception as e:  # a harness failure (a timeout): counted apart, never hidden
                return seed, None, f"{type(e).__name__}: {e}"
            finally:
                fuzz.cleanup(root)

        started = time.monotonic()
        total = fuzz.Counts()
        kinds: collections.Counter[str] = collections.Counter()
        first_of_kind: dict[str, tuple[int, list[dict]]] = {}
        harness_errors = []
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for seed, case, error in pool.map(one, range(args.seed, args.seed + args.cases)):
                if case is None:
                    harness_errors.append((seed, error))
                    print(f"seed {seed}: harness error {error}")
                    continue
                total.add(case.counts)
                for v in case.violations:
                    kinds[v.kind] += 1
                    first_of_kind.setdefault(v.kind, (seed, case.steps))
                    if args.verbose:
                        print(f"seed {seed}: {v.kind}: {v.message}\n")
                    else:
                        print(f"seed {seed}: {v.kind}: {v.message.splitlines()[0][:300]}")
        elapsed = time.monotonic() - started

        print(f"cases {total.cases}  turns {total.turns}  rewinds {total.rewinds}  undos {total.undos}  "
              f"dry-runs {total.dry_runs}  kills {total.kills} (finished {total.finishes}, "
              f"abandoned {total.abandons})  hand edits {total.hand_edits}  "
              f"refused: exit 3 {total.refused_3}, exit 2 {total.refused_2}")
        print(f"violations {total.violations}" + (f" ({', '.join(f'{k} {n}' for k, n in kinds.most_common())})"
                                                  if kinds else "") + f"; harness errors {len(harness_errors)}; "
              f"{elapsed:.0f} s")
        if args.minimize:
            counter = iter(range(10**6))

            def fresh() -> Path:
                root = base / f"min{next(counter)}"
                root.mkdir()
                return root

            for kind, (seed, steps) in first_of_kind.items():
                small = fuzz.minimize(fresh, args.backend, steps, kind, opts)
                print(f"\n== {kind}: seed {seed}, {len(steps)} steps shrunk to {len(small)}:")
                print(fuzz.describe_steps(small))
                case = fuzz.replay(fresh(), args.backend, small, opts)
                for v in case.violations:
                    if v.kind == kind:
                        print(v.message)
                        break
    fuzz.cleanup(base)
    violations = total.violations + len(harness_errors)
    emit("workspace_fuzz", violations, "violations", baseline=max(total.cases, 1), target=0, ok=violations == 0,
         backend=args.backend, cases=total.cases, turns=total.turns, rewinds=total.rewinds, undos=total.undos,
         dry_runs=total.dry_runs, kills=total.kills, refused_3=total.refused_3, harness_errors=len(harness_errors),
         seconds=round(elapsed, 1))


if __name__ == "__main__":
    main()
