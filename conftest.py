"""Repository-wide test setup (GUIDE §3).

- Snapshot baselines live in the top-level `snapshots/<test module>/`, not in `tests/__snapshots__/`: `snap_compare`
  looks `pytest_textual_snapshot.SVGImageExtension` up when it is called, so rebinding that name to a subclass with
  another `dirname` moves every baseline.
- `NO_COLOR` and `TEXTUAL_THEME` change how Textual renders; a developer's shell must not change a snapshot's pixels.
  `NO_COLOR` is read when an app starts, so clearing it here is enough. `TEXTUAL_THEME` is read when textual is first
  imported (by the snapshot plugin, before this file), so clearing it here only protects child processes: `.ci/run`
  unsets it, and the snapshot tests also set their theme explicitly.
- On a machine with no PostgreSQL service, the first test module that needs one starts a throwaway server for the
  session (tests/embedded_pg.py); it is stopped and removed when pytest ends (`pytest_unconfigure`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest_textual_snapshot

ROOT = Path(__file__).resolve().parent
SNAPSHOTS = ROOT / "snapshots"

for _name in ("NO_COLOR", "TEXTUAL_THEME"):
    os.environ.pop(_name, None)


class TopLevelSVGImageExtension(pytest_textual_snapshot.SVGImageExtension):
    @classmethod
    def dirname(cls, *, test_location) -> str:  # type: ignore[override]
        return str(SNAPSHOTS / test_location.basename)


pytest_textual_snapshot.SVGImageExtension = TopLevelSVGImageExtension  # type: ignore[misc]


def pytest_unconfigure(config) -> None:
    embedded = sys.modules.get("embedded_pg")
    if embedded is not None:
        embedded.stop_shared_server()
