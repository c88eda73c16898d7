"""The workspace is as safe as the log (SPEC §10 rev 4, §9), fuzzed through the real CLI on every backend: a random
workspace (a .gitignore, a nested git repository, a link to a file outside that must never change, sometimes a file
whose name renders like a non-UTF-8 one), random turns of real `cairn run` processes (shell commands doing random file
operations, write_file, edit_file), the operator's own edits between them, then random `cairn rewind` (sometimes
`--force`), `--undo`, `--dry-run`, and SIGKILLs mid-rewind followed by `--finish` or `--abandon`.

The oracle (tests/workspace_fuzz_lib.py) records the full workspace state around every step and checks six invariants
after each action; it never re-implements the engine. A failure prints every violation and the case's steps (plain
data: `workspace_fuzz_lib.replay(root, backend, steps)` runs them again; `minimize` shrinks them).
bench/workspace_fuzz.py runs the same cases over many seeds.
"""

from __future__ import annotations

import shutil

import pytest
from workspace_fuzz_lib import ODD_SHELL, Case, Result, describe_steps, replay, run_case

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")

# A few fixed seeds per backend (the cases do not depend on the backend, so each backend gets other ones), chosen
# for what they cover between them, not for their outcome: kills at both failpoints with --finish and --abandon, undo
# right after a rewind and undo of an undo, dry runs, refusals (exit 3), forced rewinds, non-UTF-8 names and a file
# whose name renders like one, a nested repository, links out of the workspace, an 11 MB file, .gitignore edits, a
# file replaced by a directory.
SEEDS = {"jsonl": (9, 10, 12, 15), "sqlite": (2, 8), "postgres": (14, 18)}


def report(case: Case) -> str:
    lines = [f"{len(case.violations)} violation(s):"]
    for v in case.violations:
        lines.append(f"- {v.kind}: {v.message}")
    lines.append("steps (replay with workspace_fuzz_lib.replay):")
    lines.append(describe_steps(case.steps))
    return "\n".join(lines)


@pytest.mark.parametrize("backend, seed", [(b, s) for b, seeds in SEEDS.items() for s in seeds],
                         ids=[f"{b}-{s}" for b, seeds in SEEDS.items() for s in seeds])
def test_random_turns_and_rewinds_keep_the_workspace_invariants(tmp_path, request, backend, seed):
    if backend == "postgres":
        request.getfixturevalue("pg_database_url")  # CAIRN_DATABASE_URL: a private schema, inherited by children
    case = run_case(tmp_path, backend, seed)
    assert case.counts.turns >= 3 and case.counts.rewinds + case.counts.undos + case.counts.dry_runs >= 1
    assert not case.violations, report(case)


def test_the_oracle_catches_a_rewind_that_reverts_the_operators_edit_or_misses_a_turns_change(tmp_path):
    """The oracle is not vacuous: fed a workspace that a wrong rewind would leave, it names each wrong path."""
    case = Case(tmp_path, "jsonl", "s")
    case.do({"op": "setup", "edits": [{"kind": "write", "path": "a.txt", "data": "one\n"},
                                      {"kind": "write", "path": "keep.txt", "data": "keep\n"}]})
    case.do({"op": "turn", "calls": [{"name": "run_command", "arguments": {"command": "echo two > a.txt"}}]})
    case.do({"op": "hand", "edits": [{"kind": "append", "path": "keep.txt", "data": "the operator's\n"}]})
    case.do({"op": "turn", "calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "bee\n"}}]})
    before = case.state()
    case.do({"op": "rewind", "turn": 1})
    assert not case.violations, report(case)
    after = case.state()
    assert after["a.txt"][1] == b"one\n" and "b.txt" not in after and after["keep.txt"][1] == b"keep\nthe operator's\n"
    wrong = dict(after)
    wrong["keep.txt"] = ("file", b"keep\n", 0o644)  # the operator's edit reverted
    wrong["b.txt"] = before["b.txt"]  # a turn's new file left, unnamed
    case.check_rewind(1, before, wrong, Result(0, "", "", ["rewind"]), force=False)
    found = {v.kind: v.message for v in case.violations}
    assert "'keep.txt': no turn >= 1 changed it, yet the rewind changed it" in found["rewind-wrong"]
    assert "'b.txt': changed by turn 2" in found["rewind-unnamed"] and "keep.txt" not in found["rewind-unnamed"]
    case.violations.clear()
    case.check_rewind(1, before, wrong, Result(0, "not restored: b.txt: why\n", "", ["rewind"]), force=False)
    assert [v.kind for v in case.violations] == ["rewind-wrong"]  # b.txt named: allowed; keep.txt still wrong


# -------------------------------------------------------------------------------- what the fuzz found, shrunk by hand


def _run(command: str) -> dict:
    return {"name": "run_command", "arguments": {"command": command}}


def _write(path: str, data: str) -> dict:
    return {"kind": "write", "path": path, "data": data}


FINDINGS = {
    # a tracked file replaced by a directory makes `git update-index` fail in every later snapshot: the rewind falls
    # back to before-images and the command's b.txt stays, unnamed
    "a-file-replaced-by-a-directory-turns-snapshots-off": [
        {"op": "setup", "edits": [_write("a.txt", "a\n")]},
        {"op": "turn", "calls": [_run("rm a.txt && mkdir a.txt && echo x > a.txt/inner")]},
        {"op": "turn", "calls": [_run("echo new > b.txt")]},
        {"op": "rewind", "turn": 2},
    ],
    # plan_undo calls repo.snapshot() unguarded: SnapshotUnavailable is a traceback, exit 1
    "undo-when-no-snapshot-can-be-taken": [
        {"op": "setup", "edits": [_write("a.txt", "a\n")]},
        {"op": "turn", "calls": [_run("rm a.txt && mkdir a.txt && echo x > a.txt/inner")]},
        {"op": "turn", "calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "bee\n"}}]},
        {"op": "rewind", "turn": 2},
        {"op": "rewind", "undo": True},
    ],
    # the plan restores a.txt where a directory stands (the whole rewind skips it and exits 0); after a SIGKILL,
    # --finish counts the unreadable path as "changed since the plan" and refuses (exit 3) though nothing changed
    "finish-after-a-kill-with-a-directory-where-the-plan-restores-a-file": [
        {"op": "setup", "edits": [_write("a.txt", "a\n")]},
        {"op": "turn", "calls": [_run("mv a.txt b.txt")]},
        {"op": "turn", "calls": [_run("mkdir a.txt && echo x > a.txt/inner")]},
        {"op": "kill", "point": "rewind-planned", "then": "finish", "turn": 1},
    ],
    # with snapshots on, what a file tool (or a command) did to an ignored path is neither restored nor named (the
    # manifest check skips IGNORED); with snapshots off the same rewind restores both from before-images
    "an-ignored-file-a-file-tool-changed-is-neither-restored-nor-named": [
        {"op": "setup", "edits": [_write(".gitignore", "*.log\n"), _write("debug.log", "keep\n")]},
        {"op": "turn", "calls": [{"name": "edit_file", "arguments": {"path": "debug.log", "old": "keep", "new": "x"}},
                                 {"name": "write_file", "arguments": {"path": "new.log", "content": "new\n"}}]},
        {"op": "rewind", "turn": 1},
    ],
    # a file over the size limit that a turn deleted is in no tree and no longer in the manifest: silently gone
    "a-file-over-the-size-limit-a-turn-deleted-is-not-named": [
        {"op": "setup", "edits": [{"kind": "big", "path": "big.bin"}, _write("a.txt", "a\n")]},
        {"op": "turn", "calls": [_run("rm big.bin; echo b >> a.txt")]},
        {"op": "rewind", "turn": 1},
    ],
    # debug.log was ignored (not captured) at turn 1's start and is absent now: FilePlan.already takes "not captured"
    # for "did not exist", so it is not named, while x.log (its only copy, made by the turn) is deleted
    "an-ignored-file-a-turn-uncovered-then-renamed-vanishes-unnamed": [
        {"op": "setup", "edits": [_write(".gitignore", "*.log\n"), _write("debug.log", "the operator's log\n")]},
        {"op": "turn", "calls": [_run("rm .gitignore")]},
        {"op": "turn", "calls": [_run("mv debug.log x.log")]},
        {"op": "rewind", "turn": 1},
    ],
    # plan_undo reads the current state at the plan's display path (U+FFFD), not real_path(): undoing the undo
    # finds nothing there, takes the deletion as already done, and exits 0 with the file still present
    "undo-of-an-undo-with-a-non-utf8-name": [
        {"op": "setup", "edits": []},
        {"op": "turn", "calls": [_run(f"printf odd > {ODD_SHELL}")]},
        {"op": "rewind", "turn": 1},
        {"op": "rewind", "undo": True},
        {"op": "rewind", "undo": True},
    ],
}


@pytest.mark.parametrize("name", list(FINDINGS))
def test_what_the_fuzz_found_keeps_the_invariants(tmp_path, name):
    case = replay(tmp_path, "jsonl", FINDINGS[name])
    assert not case.violations, report(case)
