"""The client suites the harness knows: every module of this package that defines a
``SUITE`` (:class:`~tests.thirdparty.suites.model.Suite`). A new client is a new module
here; nothing else lists them."""

from __future__ import annotations

import importlib
import pkgutil

from tests.thirdparty.suites.model import Suite


def _discover() -> dict[str, Suite]:
    found: dict[str, Suite] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        suite = getattr(module, "SUITE", None)
        if isinstance(suite, Suite):
            found[suite.name] = suite
    return found


#: Client name (``--checkout NAME=DIR``) -> its suite.
SUITES: dict[str, Suite] = _discover()
