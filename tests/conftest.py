import time

import pytest


@pytest.fixture(autouse=True)
def no_project_context(monkeypatch):
    """Project instructions and the environment lines are off unless a test turns them on (`monkeypatch.delenv`): most
    tests pin SPEC §2's exact events and requests, and none may depend on the machine's AGENTS.md, date or git state
    (tests/test_project_instructions.py and test_system_environment.py cover them; child processes inherit this)."""
    monkeypatch.setenv("CAIRN_PROJECT_CONTEXT", "off")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["jsonl", "sqlite"])
def backend_name(request):
    return request.param


@pytest.fixture
def pg_database_url(monkeypatch):
    """A private, empty PostgreSQL schema for this test, as CAIRN_DATABASE_URL (child processes inherit it)."""
    from pg_helpers import fresh_schema

    with fresh_schema() as (_schema, url):
        monkeypatch.setenv("CAIRN_DATABASE_URL", url)
        yield url


@pytest.fixture
def utc(monkeypatch):
    """The sessions screen shows local times: pin the zone so the picture does not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
