"""Fixtures of the unit tests in more than one area; those of one area are in its own
``conftest.py`` (``outbox/``, ``checks/``, ``spark/``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``XDG_DATA_HOME`` under ``tmp_path``: the default outboxes a test makes live there."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home
