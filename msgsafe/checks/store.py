"""What the outbox store does with a STORED message: ``msgsafe doctor URL --outbox STORE``.

STORED promises that the message survives until it is forwarded. That rests on the
store's own durability, which the broker checks cannot see:

- a **PostgreSQL** outbox (``postgresql://``): the server's ``fsync``,
  ``full_page_writes`` and ``synchronous_commit`` (as the store's own sessions get them:
  role and database settings included), and its replication as
  ``pg_stat_replication`` shows it. A standby that streams asynchronously (not named in
  ``synchronous_standby_names``), or ``synchronous_commit`` below ``on`` with standbys,
  lets a commit be reported before a standby has it: promoted after the primary's loss,
  that standby lacks rows a producer was told were STORED.
- the **pooling** between the store and its server (PgBouncer's transaction mode, found
  by a heuristic: :mod:`msgsafe.outbox._pg_pooling`): reported, refused in statement
  mode.
- a **SQLite** file: the filesystem of its mount (``/proc/self/mountinfo``, see
  :mod:`msgsafe.outbox._mounts`): memory (``tmpfs``) or a container's writable layer
  (``overlay``) does not outlive a reboot or a rescheduled container.

:func:`postgres_findings` and :func:`sqlite_findings` judge what was read (pure, for
tests); :func:`check_store` reads it.

The producer rates its store on the destinations' scale
(:class:`~msgsafe.message.Guarantee`, :func:`store_guarantee`), puts the rating on every
STORED receipt (``receipt.store_guarantee``) and refuses, at construction, a store below
``require=`` (:func:`admit_store`): a SQLite file rated by the same
:func:`~msgsafe.outbox._mounts.file_guarantee` the doctor's finding comes from, so the
two never disagree. ``"durable"`` and ``"replicated"`` refuse a store rated ``NONE``;
``"any"`` accepts it with one WARNING. A store on one machine's disk (``DURABLE``) is
not refused by ``"replicated"``: a message waits there only while the broker cannot
take it, and the receipt says where it waits (a fleet that needs more shares a
PostgreSQL outbox with a synchronous standby, which ``msgsafe doctor --outbox``
checks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from msgsafe.checks.findings import Finding, Severity
from msgsafe.errors import UnsafeOutbox
from msgsafe.message import Guarantee
from msgsafe.outbox._mounts import EPHEMERAL, Mount, file_guarantee
from msgsafe.outbox._pg_pooling import CONNECT_OPTIONS, PoolMode, describe_mode, pooling_mode
from msgsafe.outbox._pg_url import is_store_url, parse_store_url, redact_conninfo
from msgsafe.outbox.sqlite import SqliteOutbox
from msgsafe.ports import OutboxStore

__all__ = [
    "SETTINGS",
    "STORE_REQUIREMENTS",
    "admit_store",
    "check_store",
    "pooling_finding",
    "postgres_findings",
    "sqlite_findings",
    "store_guarantee",
]

log = logging.getLogger("msgsafe.outbox")

#: ``require=`` values and the weakest store rating each lets through (see the module
#: docstring for why ``"replicated"`` asks no more of the store than ``"durable"``).
STORE_REQUIREMENTS: dict[str, Guarantee] = {
    "any": Guarantee.NONE,
    "durable": Guarantee.UNKNOWN,
    "replicated": Guarantee.UNKNOWN,
}

#: What to do about a store that loses what it stores.
_STORE_FIX = (
    "put the outbox on a persistent volume (outbox='/volume/outbox.db'), share a "
    "PostgreSQL outbox (outbox='postgresql://...', docs/fleet.md), or accept the loss "
    "with require='any'"
)

#: Outbox files accepted on memory with require="any", warned about once per process.
_warned: set[str] = set()
_warned_lock = threading.Lock()

#: The server settings a PostgreSQL outbox's durability rests on.
SETTINGS = ("fsync", "full_page_writes", "synchronous_commit", "synchronous_standby_names")

_SETTINGS_SQL = "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)"
_STANDBYS_SQL = "SELECT application_name, state, sync_state FROM pg_stat_replication"

_CRASH = "a crash of the server's machine"


def check_store(spec: str, *, mountinfo: str | None = None) -> list[Finding]:
    """The findings for the outbox ``spec`` names: a ``postgresql://`` URL (asked of the
    server; one UNKNOWN finding when it cannot be reached) or a SQLite file's path (its
    filesystem; ``mountinfo`` as :func:`sqlite_findings`)."""
    if is_store_url(spec):
        return _check_postgres(spec)
    return sqlite_findings(Path(spec).expanduser(), mountinfo)


def _check_postgres(url: str) -> list[Finding]:
    parsed = parse_store_url(url)
    subject = f"outbox {parsed.redacted}"
    try:
        import psycopg

        with psycopg.connect(parsed.conninfo, **CONNECT_OPTIONS) as conn:
            pooling = pooling_mode(
                conn, lambda: psycopg.connect(parsed.conninfo, **CONNECT_OPTIONS)
            )
            settings = {
                str(name): str(value)
                for name, value in conn.execute(_SETTINGS_SQL, (list(SETTINGS),)).fetchall()
            }
            standbys = [
                (str(r[0]), str(r[1]), None if r[2] is None else str(r[2]))
                for r in conn.execute(_STANDBYS_SQL).fetchall()
            ]
    except Exception as exc:  # unreachable, refused login, missing extra: not known
        return [
            Finding(
                Severity.UNKNOWN,
                subject,
                "server",
                "unknown",
                f"could not be asked: {redact_conninfo(f'{type(exc).__name__}: {exc}')}",
                "check the URL, the login and that the server runs",
            )
        ]
    return [*postgres_findings(subject, settings, standbys), pooling_finding(subject, pooling)]


def pooling_finding(subject: str, mode: PoolMode) -> Finding:
    """What the pooling between the outbox and its server (found by the heuristic of
    :func:`~msgsafe.outbox._pg_pooling.pooling_mode`) means: OK without a pooler, INFO
    behind one, CRITICAL for statement pooling (the outbox refuses to open through it)."""
    if mode == "statement":
        return Finding(
            Severity.CRITICAL,
            subject,
            "pooling (heuristic)",
            mode,
            describe_mode(mode),
            "pool_mode = transaction (or session) for the outbox's database in the pooler",
        )
    severity = Severity.OK if mode == "direct" else Severity.INFO
    return Finding(severity, subject, "pooling (heuristic)", mode, describe_mode(mode))


def postgres_findings(
    subject: str,
    settings: Mapping[str, str],
    standbys: Sequence[tuple[str, str, str | None]],
) -> list[Finding]:
    """Findings for a PostgreSQL outbox's server: ``settings`` by name (see
    :data:`SETTINGS`), ``standbys`` as ``pg_stat_replication`` lists them
    (``application_name``, ``state``, ``sync_state``; the state None when the login may
    not read it)."""
    found: list[Finding] = []
    fsync = settings.get("fsync", "unknown")
    if fsync == "off":
        found.append(
            Finding(
                Severity.CRITICAL,
                subject,
                "fsync",
                fsync,
                f"commits are not forced to disk: {_CRASH} loses STORED rows, or corrupts "
                "the table",
                "ALTER SYSTEM SET fsync = on; SELECT pg_reload_conf()",
            )
        )
    writes = settings.get("full_page_writes", "unknown")
    if writes == "off":
        found.append(
            Finding(
                Severity.CRITICAL,
                subject,
                "full_page_writes",
                writes,
                f"a page half written at {_CRASH} cannot be repaired from the WAL: committed "
                "rows may be lost or the table corrupt",
                "ALTER SYSTEM SET full_page_writes = on; SELECT pg_reload_conf()",
            )
        )
    found.extend(_commit_findings(subject, settings, standbys))
    if fsync == "on" and writes == "on" and not any(f.severity > Severity.INFO for f in found):
        found.insert(0, Finding(Severity.OK, subject, "fsync, full_page_writes", "on"))
    return found


def _commit_findings(
    subject: str,
    settings: Mapping[str, str],
    standbys: Sequence[tuple[str, str, str | None]],
) -> list[Finding]:
    commit = settings.get("synchronous_commit", "unknown")
    names = settings.get("synchronous_standby_names", "")
    streaming = [s for s in standbys if s[1] == "streaming"]
    fix_commit = "ALTER SYSTEM SET synchronous_commit = on; SELECT pg_reload_conf()"
    if commit == "off":
        return [
            Finding(
                Severity.CRITICAL,
                subject,
                "synchronous_commit",
                commit,
                "a commit is reported before its WAL is on disk: a crash loses the STORED "
                "rows of its last moments (up to 3 x wal_writer_delay)",
                fix_commit + " (or ALTER ROLE/DATABASE ... RESET synchronous_commit)",
            )
        ]
    found: list[Finding] = []
    if not streaming:
        if names.strip():
            found.append(
                Finding(
                    Severity.WARNING,
                    subject,
                    "synchronous_standby_names",
                    names,
                    "no standby streams: every commit waits for one (puts wait, sends are "
                    "not reported STORED) until a standby is back",
                    "start the standby, or set synchronous_standby_names = '' while it is rebuilt",
                )
            )
        else:
            found.append(
                Finding(
                    Severity.INFO,
                    subject,
                    "replication",
                    "none",
                    "one server: STORED rows are as safe as its disk, and there is no "
                    "standby to fail over to",
                    "for a fleet: a synchronous standby (docs/fleet.md)",
                )
            )
        return found
    if any(sync is None for _, _, sync in streaming):
        return [
            Finding(
                Severity.UNKNOWN,
                subject,
                "replication",
                "unknown",
                "pg_stat_replication hides the standbys' sync_state from this login",
                "GRANT pg_monitor TO <the outbox's user>",
            )
        ]
    synchronous = [n for n, _, sync in streaming if sync in ("sync", "quorum")]
    asynchronous = [n for n, _, sync in streaming if sync not in ("sync", "quorum")]
    if asynchronous:
        found.append(
            Finding(
                Severity.WARNING if synchronous else Severity.CRITICAL,
                subject,
                "replication",
                "asynchronous: " + ", ".join(asynchronous),
                "these standbys are not in synchronous_standby_names: promoted after the "
                "primary's loss, one lacks rows whose commit was reported (STORED)"
                + ("; promote only a synchronous one" if synchronous else ""),
                "synchronous_standby_names = 'ANY 1 (<standby names>)' on the primary",
            )
        )
    if commit in ("local", "remote_write"):
        found.append(
            Finding(
                Severity.CRITICAL if commit == "local" else Severity.WARNING,
                subject,
                "synchronous_commit",
                commit,
                (
                    "a commit does not wait for the standby: promoted after the primary's "
                    "loss, it lacks rows whose commit was reported (STORED)"
                    if commit == "local"
                    else "a commit waits only until the standby's OS has the WAL, not its "
                    "disk: a crash of both machines loses STORED rows"
                ),
                fix_commit,
            )
        )
    elif synchronous and not asynchronous and commit in ("on", "remote_apply"):
        found.append(
            Finding(
                Severity.OK,
                subject,
                "replication",
                f"synchronous ({commit}): " + ", ".join(synchronous),
            )
        )
    return found


def sqlite_findings(path: Path, mountinfo: str | None = None) -> list[Finding]:
    """The finding for a SQLite outbox at ``path`` (the file, or where it will be): the
    filesystem of its mount, from ``mountinfo`` (``/proc/self/mountinfo`` read when None;
    UNKNOWN when it cannot be). CRITICAL exactly when a producer's default ``require``
    refuses the file (:func:`~msgsafe.outbox._mounts.file_guarantee` decides both)."""
    subject = f"outbox {path}"
    guarantee, mount = file_guarantee(path, mountinfo)
    if mount is None:
        return [Finding(Severity.UNKNOWN, subject, "filesystem", "unknown", "no mount known")]
    value = f"{mount.fstype} at {mount.point}"
    if guarantee is Guarantee.NONE:
        return [
            Finding(
                Severity.CRITICAL,
                subject,
                "filesystem",
                value,
                f"the file is on {EPHEMERAL[mount.fstype]}: messages it holds (STORED) are "
                "lost with it, and a producer refuses it unless require='any'",
                _STORE_FIX,
            )
        ]
    return [Finding(Severity.OK, subject, "filesystem", value)]


def store_guarantee(store: OutboxStore) -> tuple[Guarantee, Mount | None]:
    """What ``store`` does with a STORED message, and the mount that decides it for a
    SQLite file (:func:`~msgsafe.outbox._mounts.file_guarantee`); ``UNKNOWN`` for any
    other store (a PostgreSQL outbox's durability rests on server settings that
    ``msgsafe doctor --outbox URL`` asks the server, the producer does not)."""
    if isinstance(store, SqliteOutbox):
        return file_guarantee(store.path)
    return Guarantee.UNKNOWN, None


def admit_store(store: OutboxStore, require: str) -> Guarantee:
    """The rating of ``store`` (:func:`store_guarantee`), once it meets ``require``
    (:data:`STORE_REQUIREMENTS`); raises :class:`~msgsafe.errors.UnsafeOutbox` below it.
    A store on memory or a container's layer that ``"any"`` accepts is named in one
    WARNING per file and process."""
    guarantee, mount = store_guarantee(store)
    name = str(store.path) if isinstance(store, SqliteOutbox) else repr(store)
    where = _where(mount)
    if guarantee.rank >= STORE_REQUIREMENTS[require].rank:
        if guarantee is Guarantee.NONE:
            _warn_accepted(name, where)
        return guarantee
    raise UnsafeOutbox(
        f"the outbox {name} is on {where}: a message it stores (STORED) is lost with it, "
        f"and require={require!r} asks for more; {_STORE_FIX}",
        store=name,
        fix=_STORE_FIX,
    )


def _where(mount: Mount | None) -> str:
    if mount is None:
        return "a filesystem that could not be named"
    kind = EPHEMERAL.get(mount.fstype, "a disk")
    return f"{kind} ({mount.fstype} mounted at {mount.point})"


def _warn_accepted(name: str, where: str) -> None:
    with _warned_lock:
        first = name not in _warned
        _warned.add(name)
    if first:
        log.warning(
            "the outbox %s is on %s: what it stores does not outlive the machine or "
            "container; accepted because require='any', and STORED receipts say so "
            "(store_guarantee=Guarantee.NONE)",
            name,
            where,
        )
