"""Every embedding test runs against the native engine and its pure-Python twin."""

from __future__ import annotations

import types

import pytest

from recserve.embedding import _native, _pure


@pytest.fixture(params=["native", "python"])
def engine(request: pytest.FixtureRequest) -> types.ModuleType:
    return _native if request.param == "native" else _pure
