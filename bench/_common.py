"""Shared helpers for the benchmark scripts (GUIDE §4).

Each script prints human-readable figures and, as its last line, exactly one JSON object made by `emit()`.
Baselines are always measured in the same run, in the same temporary directory (so on the same filesystem) as the
thing they are compared with. Set CAIRN_BENCH_DIR to put the temporary directories somewhere else than /tmp, and
CAIRN_BENCH_SRC to a checkout (e.g. `git worktree add /tmp/cairn-fix`) to benchmark its `persistence` package instead
of this one (A/B comparisons of a proposed fix, same scripts, same machine).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

# `python bench/<name>.py` must measure the checkout it names (this one, or CAIRN_BENCH_SRC), installed or not: load
# that checkout's `cairn` package with its three folders as the subpackages, as the installed layout has them.
ROOT = Path(__file__).resolve().parent.parent
SRC = Path(os.environ.get("CAIRN_BENCH_SRC") or ROOT).resolve()


def _load_checkout(src: Path) -> None:
    import importlib.util

    init = src / "cairn" / "__init__.py"
    spec = importlib.util.spec_from_file_location("cairn", init, submodule_search_locations=[str(init.parent)])
    assert spec and spec.loader, f"no cairn package in {src}"
    package = importlib.util.module_from_spec(spec)
    sys.modules["cairn"] = package
    spec.loader.exec_module(package)
    for name in ("app", "widgets", "persistence"):
        sub = importlib.util.spec_from_file_location(
            f"cairn.{name}", src / name / "__init__.py", submodule_search_locations=[str(src / name)]
        )
        assert sub and sub.loader
        module = importlib.util.module_from_spec(sub)
        sys.modules[f"cairn.{name}"] = module
        setattr(package, name, module)
        sub.loader.exec_module(module)


_load_checkout(SRC)


def compile_bytecode() -> str:
    """Write the `.pyc` files of the measured checkout's `cairn`, as a user's machine has them from the first run on
    (or from `pip install .`). Start-up benchmarks need this: with PYTHONDONTWRITEBYTECODE set (as in this
    sandbox's environment) every `cairn` process would compile its ~100 modules from source (~70 ms), while the bare
    baseline's site-packages were compiled by pip. Returns a line saying what was done."""
    import compileall

    ok = all(compileall.compile_dir(str(SRC / name), quiet=1) for name in ("cairn", "app", "widgets", "persistence"))
    return f"bytecode of {SRC} compiled ({'ok' if ok else 'some files failed'})"

now_ns = time.perf_counter_ns


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory, removed afterwards. Under $CAIRN_BENCH_DIR if set, else the system temp dir."""
    base = os.environ.get("CAIRN_BENCH_DIR") or None
    path = Path(tempfile.mkdtemp(prefix=f"cairn-bench-{prefix}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), p in [0, 100]."""
    s = sorted(values)
    if not s:
        raise ValueError("percentile of nothing")
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(s[lo])
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def describe(label: str, values_ns: Sequence[float], unit: str = "ms") -> str:
    scale = {"ms": 1e6, "us": 1e3, "s": 1e9}[unit]
    return (
        f"{label:<34} n={len(values_ns):<5} median {median(values_ns) / scale:9.3f} {unit}   "
        f"p99 {percentile(values_ns, 99) / scale:9.3f} {unit}   min {min(values_ns) / scale:9.3f} {unit}"
    )


def machine() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"


def header(title: str, where: Path | None = None) -> None:
    from cairn import persistence

    print(f"== {title}")
    print(f"   {machine()}" + (f"; files in {where}" if where else ""))
    print(f"   persistence from {Path(persistence.__file__).parent}")


def emit(bench: str, value: float, unit: str, baseline: float, target: float, ok: bool, **extra: Any) -> None:
    """The machine-readable last line (GUIDE §4)."""
    ratio = value / baseline if baseline else float("inf")
    record = {
        "bench": bench,
        "value": round(value, 4),
        "unit": unit,
        "baseline": round(baseline, 4),
        "ratio": round(ratio, 3),
        "target": target,
        "ok": bool(ok),
    }
    record.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in extra.items()})
    sys.stdout.flush()
    print(json.dumps(record), flush=True)
