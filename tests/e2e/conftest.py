"""Fixtures of end-to-end tests: one fake Anthropic process and one fresh database per
module. Service processes resume any run they find ownerless, so each module's
processes get a database of their own: runs other tests left behind stay out of their
way (and out of the fake's script)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import fresh_database
from tests.e2e.processes import Fake


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def fake_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fake]:
    fake = Fake(tmp_path_factory.mktemp("fake"))
    yield fake
    fake.stop()
