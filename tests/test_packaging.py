"""Cairn installs as one top-level import name, `cairn` (SPEC §6 Python API).

The repository keeps `app/`, `widgets/` and `persistence/` at its top; a regular install must not put those generic
names into site-packages, where they would shadow (or be shadowed by) a user's own `app` package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        # The test extra's setuptools builds it (no isolated build environment): nothing is downloaded.
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("cairn-*.whl")
    return built


def top_level_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/", 1)[0] for name in z.namelist() if ".dist-info/" not in name}


def test_wheel_has_cairn_as_its_only_top_level_name(wheel):
    assert top_level_names(wheel) == {"cairn"}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for module in ("cairn/__init__.py", "cairn/__main__.py", "cairn/app/api.py", "cairn/app/cli.py",
                   "cairn/app/tools/command.py", "cairn/widgets/persistence_service.py", "cairn/persistence/store.py"):
        assert module in names
    assert not any(n.startswith(("tests/", "bench/", "conftest")) for n in names)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment holding the wheel. Its dependencies come from this environment through a .pth
    line (no network); a path added that way is not scanned for .pth files, so this environment's own (editable)
    Cairn cannot leak in."""
    env = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    if "no such option: --python" in proc.stderr:  # pip < 22.3 cannot install into another interpreter
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
            capture_output=True, text=True, timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    return env


def user_project(root: Path) -> Path:
    """A project with its own `app`, `widgets` and `persistence` packages, as a Flask or FastAPI project has."""
    for name in ("app", "widgets", "persistence"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"OWNER = 'user {name}'\n")
    (root / "app" / "api.py").write_text("def open_session():\n    return 'the user api'\n")
    return root


def test_installed_wheel_imports_beside_a_users_own_app_package(installed, tmp_path):
    project = user_project(tmp_path / "project")
    code = (
        "import cairn, app, widgets, persistence\n"
        "from cairn import open_session\n"
        "from cairn.app.api import open_session as api_open\n"
        "from app.api import open_session as user_open\n"
        "assert open_session is api_open, 'cairn.open_session is the API'\n"
        "assert user_open() == 'the user api'\n"
        "assert (app.OWNER, widgets.OWNER, persistence.OWNER) == ('user app', 'user widgets', 'user persistence')\n"
        "import cairn.persistence.store, cairn.widgets.persistence_service\n"
        "print(cairn.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(installed / "bin" / "python"), "-c", code], cwd=project, capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(installed), proc.stdout


def test_installed_command_and_python_m_cairn_agree(installed, tmp_path):
    project = user_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CAIRN_HOME": str(tmp_path / "home")}
    from cairn import __version__

    script = subprocess.run([str(installed / "bin" / "cairn"), "--version"], cwd=project, capture_output=True,
                            text=True, env=env, timeout=60)
    module = subprocess.run([str(installed / "bin" / "python"), "-m", "cairn", "--version"], cwd=project,
                            capture_output=True, text=True, env=env, timeout=60)
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    assert script.stdout == module.stdout == f"cairn {__version__}\n"
    sessions = subprocess.run([str(installed / "bin" / "python"), "-m", "cairn", "sessions"], cwd=project,
                              capture_output=True, text=True, env=env, timeout=60)
    assert sessions.returncode == 0, sessions.stderr
