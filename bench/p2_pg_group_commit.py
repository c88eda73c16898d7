"""P2 on PostgreSQL — do concurrent barriers share one durable commit?

The same three shapes as p2_group_commit.py (eight tasks reaching a barrier together), on the postgres backend: the
figure is durable commits per round (`coordinator.stats.fsyncs`: one `synchronous_commit` commit each). Target <= 2;
baseline 8 (one durable commit per caller).
"""

from __future__ import annotations

import sys

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header
from _pg import pg_schema, server_settings

import anyio

from p2_group_commit import BASELINE, CALLERS, TARGET, report, run


def main() -> None:
    with pg_schema("p2") as url:
        header(f"P2 on PostgreSQL: group commit ({CALLERS} concurrent flush() calls per round)")
        print(f"   {server_settings(url)}")
        results = anyio.run(run, "/tmp/cairn-bench-p2-pg-home", "postgres")
    worst = report("postgres", results)
    rounds = [n for fs, _ in results.values() for n in fs]
    print(f"   worst round: {worst} durable commits; naive per-caller: {BASELINE}")
    emit("p2_pg_group_commit", float(worst), "commits/round", float(BASELINE), TARGET, worst <= TARGET,
         mean=sum(rounds) / len(rounds), rounds=len(rounds),
         shapes={shape: max(fs) for shape, (fs, _) in results.items()})


if __name__ == "__main__":
    sys.exit(main())
