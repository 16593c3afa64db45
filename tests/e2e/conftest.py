"""Fixtures of end-to-end tests: one fake Anthropic process per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.processes import Fake


@pytest.fixture(scope="module")
def fake_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fake]:
    fake = Fake(tmp_path_factory.mktemp("fake"))
    yield fake
    fake.stop()
