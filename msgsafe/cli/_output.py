"""What every command shares: exit codes, the two consoles, JSON output, error exits.

Human output goes to stdout through rich; progress and diagnostics go to stderr so that
``--json`` output on stdout stays machine-readable.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlencode

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from msgsafe.errors import ConfigurationError, MsgsafeError, PermanentError, TransientError

__all__ = [
    "URL_FORMS",
    "ExitCode",
    "err",
    "exit_with",
    "fail",
    "out",
    "parse_pairs",
    "print_json",
    "secret_url",
    "translate_errors",
    "url_param",
    "with_options",
]

#: Human output (tables, reports).
out = Console(highlight=False, soft_wrap=False)
#: Progress bars and diagnostics: never mixed into stdout.
err = Console(stderr=True, highlight=False, soft_wrap=True)


class ExitCode(enum.IntEnum):
    """Exit codes of every ``msgsafe`` command (documented in ``msgsafe --help``)."""

    OK = 0
    #: A message that was accepted was not found again (demo, verify), or a send failed.
    LOSS = 1
    #: Bad command line (click's own code).
    USAGE = 2
    #: The command could not run: broker unreachable, bad URL, outbox unusable.
    ERROR = 3
    #: doctor: a setting could not be checked (the broker did not say).
    UNKNOWN = 4
    #: doctor: a setting that weakens a guarantee under some failures.
    WARNING = 5
    #: doctor: a setting that the failure stories show loses acknowledged messages.
    CRITICAL = 6
    #: send: every message is safe, but some only in the outbox, not yet at the broker.
    STORED = 7
    #: outbox drain: nothing waits, but the quarantine holds messages (not delivered).
    QUARANTINED = 8


def print_json(data: object) -> None:
    """One JSON document on one line of stdout (sorted keys, so output is stable to
    diff): a command's single document is valid JSON, and the events of a command that
    prints several (``outbox forward``) are JSON lines, one object per line."""
    sys.stdout.write(json.dumps(data, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


#: How a URL argument or option names where its text is, instead of holding it (a
#: password on the command line is in every local user's ``ps``).
ENV_PREFIX = "env:"
FILE_PREFIX = "@"


def secret_url(given: str, what: str = "URL") -> str:
    """The URL ``given`` names: ``env:NAME`` the value of environment variable NAME,
    ``@PATH`` the first line of file PATH (whitespace around it stripped), anything
    else itself. A variable that is not set, or a file that cannot be read or is empty,
    is a usage error (exit 2) naming the variable or file, never a value."""
    if given.startswith(ENV_PREFIX):
        name = given[len(ENV_PREFIX) :]
        value = os.environ.get(name, "").strip()
        if not name or not value:
            raise typer.BadParameter(f"{what}: environment variable {name!r} is not set")
        return value
    if given.startswith(FILE_PREFIX):
        path = Path(given[len(FILE_PREFIX) :]).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise typer.BadParameter(f"{what}: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise typer.BadParameter(f"{what}: {path} is not UTF-8 text") from None
        if not lines or not lines[0].strip():
            raise typer.BadParameter(f"{what}: {path} is empty")
        return lines[0].strip()
    return given


def url_param(value: str | None) -> str | None:
    """A typer callback for a URL argument or option: :func:`secret_url` of it."""
    return None if value is None else secret_url(value)


#: The help every URL argument and option ends with.
URL_FORMS = "env:NAME or @FILE read it from a variable or a file (kept out of ps)."


def exit_with(code: ExitCode) -> NoReturn:
    """Leave the command with ``code``."""
    raise typer.Exit(int(code))


def fail(message: str, code: ExitCode = ExitCode.ERROR, *, as_json: bool = False) -> NoReturn:
    """Report ``message`` (no credentials in it: callers pass redacted text) and exit."""
    if as_json:
        print_json({"error": message, "exit_code": int(code)})
    else:
        err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    exit_with(code)


@contextmanager
def translate_errors(*, as_json: bool = False) -> Iterator[None]:
    """Turn msgsafe errors escaping a command into a one-line message and exit code."""
    try:
        yield
    except ConfigurationError as exc:
        fail(f"{type(exc).__name__}: {exc}", ExitCode.ERROR, as_json=as_json)
    except (TransientError, PermanentError) as exc:
        fail(f"{type(exc).__name__}: {exc}", ExitCode.ERROR, as_json=as_json)
    except MsgsafeError as exc:
        fail(f"{type(exc).__name__}: {exc}", ExitCode.ERROR, as_json=as_json)


def parse_pairs(pairs: Sequence[str] | None, what: str) -> Mapping[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a pair without '=' is a usage error."""
    result: dict[str, str] = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{what} must be NAME=VALUE, got {pair!r}")
        result[name] = value
    return result


def with_options(url: str, options: Mapping[str, str]) -> str:
    """``url`` with ``options`` appended to its query string: adapter options travel the
    documented way (the URL), validated by the adapter like any other."""
    if not options:
        return url
    base, _, fragment = url.partition("#")
    joiner = "&" if "?" in base else "?"
    query = urlencode(sorted(options.items()))
    return f"{base}{joiner}{query}" + (f"#{fragment}" if fragment else "")


#: The column printed whole, never cut or folded: its ids are copied into other commands
#: (``replay``, ``purge``).
_ID_COLUMN = "message id"


def print_table(title: str, columns: Sequence[str], cells: Iterable[Sequence[str]]) -> None:
    """A table of ``cells``, its ``message id`` column (if any) printed whole on one line
    at any console width (output to a pipe is 80 columns): the other columns fold their
    text to make room, and a console too narrow even for that gets a wider table."""
    rows = [list(row) for row in cells]
    whole = columns.index(_ID_COLUMN) if _ID_COLUMN in columns else None
    table = Table(title=title)
    # Each column takes its text, 2 of padding and 1 of border (and the table 1 more
    # border); the other columns at least 1 character of text each.
    needed = 1 + 4 * len(columns)
    for index, column in enumerate(columns):
        if index == whole:
            width = max([len(column), *(len(row[index]) for row in rows)])
            table.add_column(column, no_wrap=True, min_width=width)
            needed += width - 1
        else:
            table.add_column(column, overflow="fold")
    for row in rows:
        # Every cell is text from the store (ids, keys, errors): escaped, never rich markup.
        table.add_row(*map(escape, row))
    if out.width >= needed:
        out.print(table)
    else:
        # Lines wider than the console: a terminal wraps them, a pipe keeps them whole.
        table.width = needed
        out.print(table, crop=False)
