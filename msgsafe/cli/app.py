"""The ``msgsafe`` command: one typer application, one module per command."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from msgsafe import __version__
from msgsafe._help import reflow_help
from msgsafe.cli import (
    deadletter,
    demo,
    doctor,
    nemesis,
    outbox,
    outbox_forward,
    outbox_watch,
    shell,
    verify,
)
from msgsafe.cluster import cli as cluster

__all__ = ["app", "main"]

app = typer.Typer(
    name="msgsafe",
    help=(
        "msgsafe: publish and consume without losing an accepted message.\n\n"
        "Exit codes: 0 ok; 1 a message was lost or a send failed; 2 bad usage; "
        "3 could not run (broker unreachable, bad URL, outbox unusable); doctor: "
        "4 a setting could not be checked, 5 warning, 6 a setting that loses messages; "
        "send: 7 some messages were only stored in the outbox (none failed); "
        "outbox drain: 8 nothing waits, but messages are in the quarantine; deadletter "
        "replay: 1 a replay failed (its dead letter stays), 2 also an id not there."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"msgsafe {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version (msgsafe X.Y.Z) and exit.",
        ),
    ] = False,
) -> None:
    """Options before any command: ``--version``."""


app.command(name="demo")(demo.demo)
app.command(name="verify")(verify.verify)
app.command(name="doctor")(doctor.doctor)
app.command(name="send")(shell.send)
app.command(name="consume")(shell.consume)
app.command(name="nemesis")(nemesis.nemesis)
outbox.app.command(name="watch")(outbox_watch.watch)
outbox.app.command(name="forward")(outbox_forward.forward)
app.add_typer(outbox.app, name="outbox")
app.add_typer(cluster.app, name="cluster")
app.add_typer(deadletter.app, name="deadletter")
# Last, once every command is registered: their docstrings' line breaks go.
reflow_help(app)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``msgsafe`` console script and ``python -m msgsafe``."""
    # Library loggers stay quiet unless something is wrong; commands report themselves.
    # MSGSAFE_LOG_LEVEL=INFO (or DEBUG, WARNING) shows what the library saw on the way.
    logging.basicConfig(level=_log_level(), format="%(levelname)s %(name)s: %(message)s")
    app(args=None if argv is None else list(argv), prog_name="msgsafe")


def _log_level() -> int:
    """The level ``MSGSAFE_LOG_LEVEL`` names (a name or a number); ERROR without it, and
    for a value that names no level (which is then said on stderr)."""
    text = os.environ.get("MSGSAFE_LOG_LEVEL", "").strip()
    if not text:
        return logging.ERROR
    level = int(text) if text.isdigit() else logging.getLevelName(text.upper())
    if isinstance(level, int):
        return level
    sys.stderr.write(
        f"msgsafe: MSGSAFE_LOG_LEVEL={text!r} names no level (DEBUG, INFO, WARNING, ERROR); "
        "using ERROR\n"
    )
    return logging.ERROR
