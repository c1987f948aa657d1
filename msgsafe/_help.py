"""Help text of the ``msgsafe`` command: docstrings reflowed into paragraphs.

Below every layer (pure text, no I/O, typer only named in annotations), so that both
commands built with typer use it: ``msgsafe`` (``msgsafe/cli``) and the cluster's own
``python -m msgsafe.cluster.cli``, which the layers keep from importing ``msgsafe.cli``.
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

__all__ = ["reflow", "reflow_help"]

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def reflow(text: str) -> str:
    """``text`` (a docstring or help text) as paragraphs: the lines of each paragraph
    joined by single spaces, paragraphs separated by one blank line, surrounding blank
    lines and indentation removed."""
    paragraphs = _PARAGRAPH_BREAK.split(inspect.cleandoc(text))
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def reflow_help(app: typer.Typer) -> None:
    """Give every command and group of ``app`` (sub-apps included) its help text as
    :func:`reflow` paragraphs; idempotent.

    Typer's rich help keeps the hard line breaks of every paragraph but the first, so a
    docstring wrapped at the source's line length would be printed with its sentences
    cut where the source wrapped them, and the terminal wrapping again around them.
    Call it once every command is registered, before the app runs.
    """
    if isinstance(app.info.help, str):
        app.info.help = reflow(app.info.help)
    for command in app.registered_commands:
        text = command.help
        if text is None and command.callback is not None:
            text = inspect.getdoc(command.callback)
        if text:
            command.help = reflow(text)
    for group in app.registered_groups:
        if isinstance(group.help, str):
            group.help = reflow(group.help)
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
