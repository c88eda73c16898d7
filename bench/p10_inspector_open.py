"""P10: opening the session inspector on a 100k-event session (issue 19). Target: ≤ 1 s from nothing read to the first
frame painted (the session read, the model built, the screen mounted and drawn at 160×45). Textual's own import is
paid before timing starts (a `cairn inspect` pays it once, whatever the session's size).

Baseline, same run: the cold load alone (`SessionStore.inspect`, what `cairn show` pays). Also reported: building the
model, a filter over every event, a jump to the next recovered call, and a search that matches nothing (a full scan).
The session is P4's: real code as tool output, ending inside a turn, so repair's rows are computed too.
"""

from __future__ import annotations

import asyncio
import time

from _common import emit, header, median, temp_dir  # noqa: E402  (puts the project on sys.path)
from p4_cold_load import EVENTS, SESSION_ID, SessionGenerator, write_session

RUNS = 3
TARGET_S = 1.0


def now() -> float:
    return time.perf_counter()


async def open_once(store) -> tuple[float, float, object]:
    from cairn.app.screens.inspector import EventTable, InspectorApp, InspectorScreen

    t0 = now()
    screen = InspectorScreen.load(store, SESSION_ID)
    t_model = now() - t0
    app = InspectorApp(screen)
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        table = screen.query_one(EventTable)
        assert table.render_line(1).text.strip(), "the table drew a row"
        elapsed = now() - t0
        await pilot.press("q")
    return elapsed, t_model, screen.model


def main() -> None:
    import textual.app  # noqa: F401  (the import is not what is measured)

    from cairn.app.inspect.model import parse_filter
    from cairn.persistence.store import SessionStore

    with temp_dir("cairn-p10-") as root:
        header("P10 inspector open, 100k events", root)
        events = SessionGenerator().generate(EVENTS)
        store = SessionStore(root / "home", "jsonl")
        size = write_session(store, events)
        print(f"   session: {EVENTS:,} events, {size / 1e6:.1f} MB")

        loads = []
        for _ in range(RUNS):
            t0 = now()
            store.inspect(SESSION_ID)
            loads.append(now() - t0)
        opens, models = [], []
        model = None
        for _ in range(RUNS):
            elapsed, t_model, model = asyncio.run(open_once(store))
            opens.append(elapsed)
            models.append(t_model)
        assert model is not None
        t0 = now()
        view = model.view(parse_filter("type:tool/result"))
        t_filter = now() - t0
        t0 = now()
        found = model.next_where(model.view().indices, 0, model.is_recovered_call)
        t_jump = now() - t0
        t0 = now()
        missing = model.next_where(model.view().indices, -1, model.search_predicate("no such text in the session"))
        t_search = now() - t0
        assert found is not None and missing is None

        base, value = median(loads), median(opens)
        print(f"   cold load (store.inspect), baseline: {base:.3f} s (median of {RUNS})")
        print(f"   load + model:                         {median(models):.3f} s")
        print(f"   open to first frame (value):          {value:.3f} s   runs: {', '.join(f'{x:.3f}' for x in opens)}")
        print(f"   filter type:tool/result ({len(view.indices):,} rows): {t_filter * 1000:.0f} ms")
        print(f"   jump to the next recovered call:      {t_jump * 1000:.0f} ms")
        print(f"   search with no match (full scan):     {t_search:.2f} s")
        emit("p10_inspector_open", value, "s", base, TARGET_S, value <= TARGET_S,
             events=EVENTS, model_s=median(models), filter_ms=t_filter * 1000, search_miss_s=t_search)


if __name__ == "__main__":
    main()
