"""The ``msgsafe`` command line: ``demo``, ``verify``, ``doctor``, ``outbox``, ``send``,
``consume``. Built on typer and rich; human output by default, ``--json`` everywhere."""

from msgsafe.cli.app import app, main

__all__ = ["app", "main"]
