"""The ``msgsafe`` command: one typer application, one module per command."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import typer

from msgsafe.cli import demo, doctor, outbox, outbox_watch, shell, verify
from msgsafe.cluster import cli as cluster

__all__ = ["app", "main"]

app = typer.Typer(
    name="msgsafe",
    help=(
        "msgsafe: publish and consume without losing an accepted message.\n\n"
        "Exit codes: 0 ok; 1 a message was lost or a send failed; 2 bad usage; "
        "3 could not run (broker unreachable, bad URL, outbox unusable); doctor: "
        "4 a setting could not be checked, 5 warning, 6 a setting that loses messages; "
        "send: 7 some messages were only stored in the outbox (none failed)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command(name="demo")(demo.demo)
app.command(name="verify")(verify.verify)
app.command(name="doctor")(doctor.doctor)
app.command(name="send")(shell.send)
app.command(name="consume")(shell.consume)
outbox.app.command(name="watch")(outbox_watch.watch)
app.add_typer(outbox.app, name="outbox")
app.add_typer(cluster.app, name="cluster")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``msgsafe`` console script and ``python -m msgsafe``."""
    # Library loggers stay quiet unless something is wrong; commands report themselves.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    app(args=None if argv is None else list(argv), prog_name="msgsafe")
