"""The fast paths of loading and of the barrier (P1, P4 in docs/benchmarks.md) against the slow ways they replace.

Each is an optimisation only: on clean and damaged input alike the outcome must be exactly the slow way's (the same
position, the same bytes, the same error naming the same line). The slow ways are still in the code (the serial check
below `PARALLEL_MIN`, `RunningCheck.stamp` plus a join), so they are compared directly on random input.
"""

from __future__ import annotations

import os
import random

import pytest

from cairn.persistence import checks
from cairn.persistence.checks import RunningCheck, verify_checks
from cairn.persistence.errors import PersistenceError
from cairn.persistence.events import ToolCall, TurnStart, UserMessage, encode_event, encoder


def stored_lines(n: int, rng: random.Random) -> list[bytes]:
    """n event lines as a writer stores them: batches, some durable (those carry a check); a few tool calls whose
    arguments hold a `chk` key, so the check mark also occurs where no check is (a stray mark)."""
    events = []
    for i in range(n):
        if i % 7 == 0:
            events.append(TurnStart(seq=i, time=1000 + i, turn=i))
        elif rng.random() < 0.03:
            events.append(ToolCall(seq=i, time=1000 + i, turn=1, step=1, call_id=f"c{i}", name="t",
                                   arguments={"a": 1, "chk": "%08x" % rng.randrange(1 << 32)}, safety="read_only",
                                   parent_call_id=None))
        else:
            events.append(UserMessage(seq=i, time=1000 + i, turn=1, step=0, text=f"line {i} " + "x" * rng.randrange(300)))
    check, lines, i = RunningCheck(), [], 0
    while i < n:
        # the raw encoder, as logs written before `unmarked` have them: the tool calls' "chk" keys are stray marks
        batch = [(e.seq, encoder.encode(e)) for e in events[i : i + rng.randrange(1, 40)]]
        stamped, at = check.stamp(batch, durable=rng.random() < 0.5)
        check.advance(at)
        lines += [data for _, data in stamped]
        i += len(batch)
    return lines


def damaged(lines: list[bytes], rng: random.Random) -> list[bytes]:
    lines = list(lines)
    k = rng.randrange(len(lines))
    kind = rng.randrange(8)
    if kind == 1:  # a byte changed inside a text: still JSON
        j = lines[k].find(b"line ")
        if j >= 0:
            lines[k] = lines[k][:j] + b"fine " + lines[k][j + 5 :]
    elif kind == 2:  # a line deleted
        del lines[k]
    elif kind == 3:  # a check's value changed
        j = lines[k].find(checks.MARK)
        if j >= 0:
            lines[k] = lines[k][: j + 8] + (b"0" if lines[k][j + 8 : j + 9] != b"0" else b"1") + lines[k][j + 9 :]
    elif kind == 4:  # a check's back offset changed
        j = lines[k].find(b"@")
        if j >= 0:
            lines[k] = lines[k][: j + 1] + b"1" + lines[k][j + 1 :]
    elif kind == 5:  # a check removed
        j = lines[k].rfind(checks.MARK)
        if j >= 0:
            lines[k] = lines[k][:j] + b"}"
    elif kind == 6:  # a blank line
        lines[k] = b""
    elif kind == 7:  # two lines swapped
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
    return lines  # kind 0: clean


def outcome(call):
    try:
        return "ok", call()
    except PersistenceError as e:
        return type(e).__name__, str(e)


def test_the_check_summed_in_a_thread_gives_exactly_the_serial_outcome(monkeypatch):
    """Above PARALLEL_MIN the first check's sum is taken in a thread while the prefix is searched for stray marks;
    with the threshold at 0 every body takes that way, and must come out as the serial check does."""
    rng = random.Random(24)
    seen = set()
    for case in range(300):
        lines = damaged(stored_lines(rng.randrange(1, 150), rng), rng)
        body = b"header\n" + b"".join(line + b"\n" for line in lines)
        monkeypatch.setattr(checks, "PARALLEL_MIN", 1 << 62)
        serial = outcome(lambda: verify_checks(body, 7, len(body), "s.jsonl", first_line=2))
        monkeypatch.setattr(checks, "PARALLEL_MIN", 0)
        threaded = outcome(lambda: verify_checks(body, 7, len(body), "s.jsonl", first_line=2))
        assert threaded == serial, case
        seen.add(serial[0])
    assert seen == {"ok", "CorruptLog"}  # clean and damaged bodies both came up


def test_a_stray_mark_before_the_first_check_is_named_the_same_way_on_a_long_body(monkeypatch):
    """A body over PARALLEL_MIN really takes the threaded way; a mark before the first check is found there and named
    as the serial check names it."""
    filler = UserMessage(seq=0, time=1, turn=1, step=0, text="x" * 1000)
    lines = [encode_event(filler)] * (checks.PARALLEL_MIN // 1000 + 10)
    stray = b'{"a":1,"chk":"00000000"}'
    lines[5] = lines[5][:-1] + b',"arguments":' + stray + b"}"
    check = RunningCheck()
    stamped, _ = check.stamp(list(enumerate(lines)), durable=True)
    body = b"".join(data + b"\n" for _, data in stamped)
    assert len(body) > checks.PARALLEL_MIN
    with pytest.raises(PersistenceError) as threaded:
        verify_checks(body, 0, len(body), "s.jsonl", first_line=2)
    assert threaded.value.line == len(lines) + 1
    assert f"lines 2–{len(lines) + 1}" in str(threaded.value)
    monkeypatch.setattr(checks, "PARALLEL_MIN", 1 << 62)
    with pytest.raises(PersistenceError) as serial:
        verify_checks(body, 0, len(body), "s.jsonl", first_line=2)
    assert str(serial.value) == str(threaded.value)


def test_stamp_lines_gives_exactly_the_bytes_and_position_of_stamp_and_a_join():
    """The JSONL writer's one-join stamp against `stamp` + join, over random sequences of batches: durable or not,
    the first check (no back offset) and later ones, empty batches, and re-sends of events already covered."""
    rng = random.Random(1)
    for case in range(200):
        fast, slow = RunningCheck(), RunningCheck()
        seq = 0
        for _ in range(rng.randrange(1, 30)):
            start = max(0, seq - rng.choice((0, 0, 0, 1, 3)))  # sometimes a re-send of covered events
            n = rng.randrange(0, 6)
            batch = [(s, encode_event(UserMessage(seq=s, time=s, turn=1, step=0, text="t" * rng.randrange(50))))
                     for s in range(start, start + n)]
            durable = rng.random() < 0.5
            stamped, slow_at = slow.stamp(batch, durable)
            slow_data = b"\n".join([d for _, d in stamped]) + b"\n" if stamped else b""
            fast_data, fast_at = fast.stamp_lines(batch, durable)
            assert (fast_data, fast_at, fast.last) == (slow_data, slow_at, slow.last), case
            fast.advance(fast_at)
            slow.advance(slow_at)
            seq = max(seq, start + n)


def _check_finite_by_recursion(value, where):
    """check_finite as it was before plain values were skipped: one call per value."""
    import math

    from cairn.persistence.events import NonFiniteNumber

    if isinstance(value, float):
        if not math.isfinite(value):
            raise NonFiniteNumber(f"{where}: non-finite number {value!r} cannot be stored")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_finite_by_recursion(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite_by_recursion(v, f"{where}[{i}]")


class _Float(float):
    pass


class _Str(str):
    pass


def _random_value(rng: random.Random, depth: int = 0):
    leaves = [1, True, None, "s", _Str("u"), 0.5, _Float(2.0), float("nan"), float("inf"), -float("inf"),
              _Float("nan"), 10**30]
    if depth > 3 or rng.random() < 0.5:
        return rng.choice(leaves)
    kind = rng.randrange(3)
    items = [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 0:
        return {f"k{i}": v for i, v in enumerate(items)}
    return items if kind == 1 else tuple(items)


def test_check_finite_that_skips_plain_values_raises_exactly_where_the_recursion_did():
    from cairn.persistence.events import check_finite

    rng = random.Random(3)
    raised = 0
    for case in range(2000):
        value = _random_value(rng)
        expected = outcome_of(lambda: _check_finite_by_recursion(value, "x"))
        assert outcome_of(lambda: check_finite(value, "x")) == expected, (case, value)
        raised += expected[0] != "ok"
    assert 200 < raised < 1800  # both outcomes came up often


def outcome_of(call):
    try:
        call()
    except ValueError as e:
        return type(e).__name__, str(e)
    return "ok", None


@pytest.mark.parametrize("size", [0, 1, 4095, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17])
def test_read_all_returns_the_whole_file(tmp_path, size):
    from cairn.persistence.jsonl import _read_all

    data = random.Random(size).randbytes(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_all(fd, str(path)) == data
    finally:
        os.close(fd)


def test_read_all_reads_past_the_size_fstat_gave():
    """A file holding more than its fstat size says (here a /proc file, size 0; a session file that grew between the
    fstat and the read is the case that matters) is still read to its end."""
    from cairn.persistence.jsonl import _read_all

    fd = os.open("/proc/self/mounts", os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == 0
        data = _read_all(fd, "/proc/self/mounts")
    finally:
        os.close(fd)
    with open("/proc/self/mounts", "rb") as f:
        assert data == f.read() and data


def test_the_check_run_beside_a_decode_gives_exactly_verify_checks_outcome():
    """VerifyBeside runs verify_checks in a thread with its mark search done by `regex` (GIL released): on random
    clean and damaged bodies, `result()` returns or raises exactly what verify_checks does."""
    from cairn.persistence.checks import VerifyBeside

    rng = random.Random(27)
    seen = set()
    for case in range(300):
        lines = damaged(stored_lines(rng.randrange(1, 150), rng), rng)
        body = b"header\n" + b"".join(line + b"\n" for line in lines)
        expected = outcome(lambda: verify_checks(body, 7, len(body), "s.jsonl", first_line=2))
        assert outcome(VerifyBeside(body, 7, len(body), "s.jsonl", first_line=2).result) == expected, case
        seen.add(expected[0])
    assert seen == {"ok", "CorruptLog"}


def _write_long_session(home, n: int = 5000):
    """A real JSONL session over PARALLEL_MIN: durable batches of 50 events (a check each), ~1 KB per event."""
    from cairn.persistence.store import SessionStore

    store = SessionStore(home, "jsonl")
    opened = store.create(cwd=str(home), session_id="long")
    events = [UserMessage(seq=i, time=1000 + i, turn=1, step=0, text=f"line {i} " + "y" * 1000) for i in range(n)]
    for i in range(0, n, 50):
        opened.writer.append([(e.seq, encode_event(e)) for e in events[i : i + 50]], durable=True)
    opened.writer.close()
    opened.lock.release()
    path = store.backend.path("long")
    assert path.stat().st_size > checks.PARALLEL_MIN
    return store, path


@pytest.mark.parametrize("damage", ["clean", "byte", "check", "torn", "blank", "not json"])
def test_a_long_jsonl_session_loads_exactly_as_with_the_check_after_the_decode(tmp_path, monkeypatch, damage):
    """The JSONL load checks a body over PARALLEL_MIN beside its decode; with the threshold out of reach it checks after
    it, as before. Same events, same resume position, same error naming the same line, whatever the damage."""
    from cairn.persistence import jsonl

    store, path = _write_long_session(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "byte":  # a changed byte inside a text, far from the end: still JSON
        j = data.find(b"line 1234 ")
        data[j : j + 4] = b"fine"
    elif damage == "check":
        j = data.find(checks.MARK, len(data) // 3)
        data[j + 8] = ord("0") if data[j + 8] != ord("0") else ord("1")
    elif damage == "torn":  # a crash mid-write: half a line at the end (only the decoded part is checked)
        data += data[-400:-100]
    elif damage == "blank":
        j = data.find(b"\n", len(data) // 2)
        data[j:j] = b"\n"
    elif damage == "not json":
        j = data.find(b"line 2000 ")
        data[j - 9 : j - 8] = b"?"
    path.write_bytes(bytes(data))

    def load():
        log = store.backend.load("long")
        return [encode_event(e) for e in log.events], log.check, log.torn_bytes

    beside = outcome(load)
    monkeypatch.setattr(jsonl, "PARALLEL_MIN", 1 << 62)
    after = outcome(load)
    assert beside == after
    assert (beside[0] == "ok") == (damage in ("clean", "torn", "blank"))


@pytest.mark.parametrize("damage", ["clean", "check"])
def test_a_long_session_loads_the_same_when_no_thread_can_be_started(tmp_path, monkeypatch, damage):
    """Out of threads (RuntimeError from Thread.start, which no real test machine can be made to give reliably: the one
    mock here), the check runs where the load runs, with the same outcome."""
    import threading

    from cairn.persistence import jsonl

    store, path = _write_long_session(tmp_path)
    if damage == "check":
        data = bytearray(path.read_bytes())
        j = data.find(checks.MARK, len(data) // 3)
        data[j + 8] = ord("0") if data[j + 8] != ord("0") else ord("1")
        path.write_bytes(bytes(data))

    def load():
        log = store.backend.load("long")
        return [encode_event(e) for e in log.events], log.check

    normal = outcome(load)

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert outcome(load) == normal
    assert (normal[0] == "ok") == (damage == "clean")
    monkeypatch.undo()
    monkeypatch.setattr(jsonl, "PARALLEL_MIN", 1 << 62)
    assert outcome(load) == normal
