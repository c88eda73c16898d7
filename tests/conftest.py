import time

import pytest


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
