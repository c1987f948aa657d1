"""The Spark writer's tests share one fixture: the memory broker they write to, with the
writer's cached producers closed before it is forgotten."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from msgsafe.spark import close_all
from msgsafe.testing import MemoryBroker


@pytest.fixture
def broker(memory_broker: MemoryBroker) -> Iterator[MemoryBroker]:
    """The shared ``memory_broker``; the sink's cached producers are closed before it is
    forgotten, so none outlives the test connected to a broker that is gone."""
    yield memory_broker
    close_all(5)
