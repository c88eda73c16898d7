"""Power cuts (SPEC §12 rev 4), a small fixed set: CAIRN_HOME and the workspace on a file system that drops what was not
fsync'd, cut at every barrier point Cairn has a failpoint for and at random moments, on JSONL and SQLite (the oracle is
tests/powercut_lib.py; the larger random run is bench/power_cut_matrix.py, its counts in docs/reliability.md)."""

from __future__ import annotations

import pytest
from powercut_fs import require
from powercut_lib import run_case

pytestmark = pytest.mark.slow

PLANS = {
    # a fresh CAIRN_HOME cut at its first barriers, then turns cut inside their tools and at their end
    "first-turn": [("turn", "prompt-accepted"), ("turn", "tool-body-start"), ("turn", "tool-body-done"),
                   ("turn", "turn-ended"), ("turn", None)],
    # a rewind cut after its plan and after its first file, finished after the cut; an undo cut the same way
    "rewind": [("turn", None), ("turn", None), ("rewind", "rewind-planned"), ("rewind", "rewind-restored"),
               ("undo", "rewind-planned"), ("turn", None)],
    # cuts at random moments, some keeping a prefix of what was not synced
    "random": [("turn", "random"), ("turn", "random"), ("turn", None), ("rewind", "random"), ("undo", "random"),
               ("turn", "random")],
}


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_a_power_cut_loses_nothing_a_barrier_covered(tmp_path, backend, plan):
    require()
    tally = run_case(tmp_path, backend, seed=sorted(PLANS).index(plan) * 7 + (backend == "sqlite"), plan=PLANS[plan])
    assert tally.cuts >= 1, "no step was cut"
    assert not tally.violations, "\n".join(tally.violations)


def test_a_completed_run_on_a_fresh_home_survives_a_cut(tmp_path):
    """The first `cairn run` into a CAIRN_HOME that did not exist exits 0: its whole session survives a cut at once
    (the home's own name is synced into its parent, not only `sessions/` into the home)."""
    require()
    tally = run_case(tmp_path, "jsonl", seed=99, plan=[("turn", None), ("turn", "prompt-accepted")])
    assert tally.events_checked > 0
    assert not tally.violations, "\n".join(tally.violations)


def test_a_power_cut_while_turns_compact_their_history_loses_nothing(tmp_path):
    """A 1,024-token window: later turns compact (a summary request, `context/compaction`), cut around them."""
    require()
    plan = [("turn", None), ("turn", None), ("turn", "random"), ("turn", "prompt-accepted"), ("turn", "turn-ended"),
            ("turn", None)]
    tally = run_case(tmp_path, "jsonl", seed=5, plan=plan, window=1024)
    assert tally.compactions >= 1, "no turn compacted: the case does not test what its name says"
    assert not tally.violations, "\n".join(tally.violations)
