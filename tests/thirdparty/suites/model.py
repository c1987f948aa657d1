"""What a client suite is: :class:`Suite`, one per module of this package."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Suite:
    """One client's suite: where it comes from and how the harness runs it."""

    #: The name given on the command line (``--checkout NAME=DIR``).
    name: str
    #: The broker the suite runs against: ``rabbitmq``, ``kafka`` or ``none``.
    broker: str
    repo: str
    commit: str
    #: The test files run, relative to the checkout. With more than one, a test id is
    #: prefixed with its module's name (``test_producer::test_send``).
    test_files: tuple[str, ...]
    #: Other files of the checkout the test files import (copied as they are).
    support: tuple[str, ...]
    #: (old, new) text edits of the test files, both sides: each must apply to at least
    #: one file; ``{address}`` / ``{port}`` in ``new`` are the broker's.
    edits: tuple[tuple[str, str], ...]
    #: (old, new) text edits for the wrapper side only: the import swap.
    swap: tuple[tuple[str, str], ...]
    #: Test (class or function) name -> why it is not run: it reads private internals.
    set_aside: dict[str, str]
    #: Test id -> why the wrapper's outcome differs on purpose (one line each).
    intended: dict[str, str]
    #: conftest.py written next to the tests (harness changes that are not text edits).
    conftest: str = ""
    env: dict[str, str] = field(default_factory=dict)
    #: More pytest arguments (a plugin's option, ``-p no:...``).
    pytest_args: tuple[str, ...] = ()
