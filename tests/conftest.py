import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["jsonl", "sqlite"])
def backend_name(request):
    return request.param
