"""A long module is pointed out, never failed: size is a smell, not a rule.

A module of the package above :data:`LONG` lines gets a :class:`LongModule` warning in
pytest's summary and the test passes. The length only says the module may hold more
than one idea; the fix, when there is one, is to split along a concept a newcomer can
name (see docs/architecture.md), not to cut wherever it gets under a number.
"""

from __future__ import annotations

import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "msgsafe"

#: Lines above which a module is pointed out.
LONG = 800


class LongModule(UserWarning):
    """A module longer than LONG lines: worth a look for a second idea inside it."""


def test_a_long_module_is_pointed_out_not_failed() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LONG:
            warnings.warn(
                f"{path.relative_to(PACKAGE.parent)} has {lines} lines (> {LONG}): does it "
                "hold more than one idea? Split by concept if so; the length alone is fine.",
                LongModule,
                stacklevel=1,
            )
