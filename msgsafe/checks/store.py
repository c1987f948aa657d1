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
- a **SQLite** file: the filesystem of its mount (``/proc/self/mountinfo``, see
  :mod:`msgsafe.outbox._mounts`): memory (``tmpfs``) or a container's writable layer
  (``overlay``) does not outlive a reboot or a rescheduled container.

:func:`postgres_findings` and :func:`sqlite_findings` judge what was read (pure, for
tests); :func:`check_store` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from msgsafe.checks.findings import Finding, Severity
from msgsafe.outbox._mounts import EPHEMERAL, mount_of, parse_mountinfo, read_mountinfo
from msgsafe.outbox._pg_url import is_store_url, parse_store_url, redact_conninfo

__all__ = ["SETTINGS", "check_store", "postgres_findings", "sqlite_findings"]

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

        with psycopg.connect(parsed.conninfo, autocommit=True) as conn:
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
    return postgres_findings(subject, settings, standbys)


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
    UNKNOWN when it cannot be)."""
    subject = f"outbox {path}"
    if mountinfo is None:
        mountinfo = read_mountinfo()
        if mountinfo is None:
            return [
                Finding(Severity.UNKNOWN, subject, "filesystem", "unknown", "no mountinfo here")
            ]
    where = Path(os.path.realpath(path))
    mount = mount_of(where, parse_mountinfo(mountinfo))
    if mount is None:
        return [Finding(Severity.UNKNOWN, subject, "filesystem", "unknown", "no mount found")]
    value = f"{mount.fstype} at {mount.point}"
    if mount.fstype in EPHEMERAL:
        return [
            Finding(
                Severity.WARNING,
                subject,
                "filesystem",
                value,
                f"the file is on {EPHEMERAL[mount.fstype]}: messages it holds (STORED) are "
                "lost with it",
                "put the outbox on a persistent volume (outbox=PATH), or share a "
                "PostgreSQL outbox (outbox='postgresql://...', docs/fleet.md)",
            )
        ]
    return [Finding(Severity.OK, subject, "filesystem", value)]
