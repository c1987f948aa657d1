"""Where the outbox lives: :func:`open_store` turns the producer's ``outbox=`` argument
into a store, and :func:`default_path` names the default file.

The naming rule. The default outbox of a producer is a SQLite file in
``platformdirs.user_data_dir("msgsafe")/outbox/`` named after its
:class:`~msgsafe.outbox.destination.Destination` — the scheme, the set of hosts with
loopback aliases made one (``localhost`` = ``127.0.0.1`` = ``::1``), and the virtual
host — never after client options, their order or credentials::

    amqp_localhost_5672-<16 hex digits of sha256(destination key)>.sqlite3

so ``amqp://u:p@127.0.0.1:5672/%2F?confirm_timeout=6`` and
``amqp://localhost:5672`` with ``confirm_timeout=6`` as a keyword share one file.

A file belongs to one process at a time. A second process for the same destination
takes the next free *slot*, ``<name>.1.sqlite3``, ``<name>.2.sqlite3``... (at most
:data:`SLOTS`), instead of failing with :class:`~msgsafe.errors.OutboxLocked`.

On opening its default file, a producer adopts the other outbox files of the directory
that hold waiting messages for the same destination (a dead process's slot, or a file
named under the earlier rule — a hash of the whole URL — found by the target its rows
store) and forwards their messages; one WARNING line names them
(:func:`msgsafe.outbox.discovery.adopt_strays`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path

from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError, OutboxError, OutboxLocked
from msgsafe.outbox._pg_url import is_store_url
from msgsafe.outbox.destination import Destination, destination_of
from msgsafe.outbox.discovery import adopt_strays, default_dir
from msgsafe.outbox.sqlite import SqliteOutbox
from msgsafe.ports import OutboxStore, is_outbox_store

__all__ = ["SLOTS", "OutboxSpec", "default_dir", "default_path", "open_store", "slot_path"]

log = logging.getLogger("msgsafe.outbox")

#: ``True`` (default file), ``False``/``None`` (no outbox), a path, a ``postgresql://``
#: URL (a table a fleet shares), or a store object.
OutboxSpec = bool | str | os.PathLike[str] | OutboxStore | None

#: Processes of one user that can each hold a default outbox of one destination at once.
SLOTS = 64

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Opening and adopting run once per file and process; _adopted remembers the stores.
_open_lock = threading.Lock()
_adopted: weakref.WeakSet[SqliteOutbox] = weakref.WeakSet()


def slot_path(destination: Destination, slot: int = 0, directory: Path | None = None) -> Path:
    """The default outbox file of ``destination`` for ``slot`` (0: the first process)."""
    digest = hashlib.sha256(destination.key.encode()).hexdigest()[:16]
    if not destination.networked:
        label = f"memory_{destination.vhost}"
    else:
        hosts = ",".join(f"{host}:{port}" for host, port in sorted(destination.hosts))
        label = f"{destination.scheme}_{hosts}"
    name = f"{_UNSAFE.sub('_', label)[:40]}-{digest}"
    folder = default_dir() if directory is None else directory
    return folder / (f"{name}.sqlite3" if slot == 0 else f"{name}.{slot}.sqlite3")


def default_path(target: BrokerUrl, options: Mapping[str, object] | None = None) -> Path:
    """The first default outbox file for ``target`` (slot 0): named by its destination,
    so options, host order, loopback spelling and credentials do not change it."""
    return slot_path(destination_of(target, options))


def open_store(
    spec: OutboxSpec, target: BrokerUrl, options: Mapping[str, object] | None = None
) -> OutboxStore | None:
    """The outbox for ``target`` as ``spec`` selects it.

    ``True``: the default file of the destination (``options`` are the producer's
    keyword options, which can name the AMQP 1.0 virtual host): the first free slot,
    directory created, other files with waiting messages for the destination adopted
    (see the module docstring); ``False``/``None``: no outbox; a ``postgresql://`` URL:
    a :class:`~msgsafe.outbox.postgres.PostgresOutbox` on the table it names (one per
    producer; every process of a fleet may share it); a path: a
    :class:`SqliteOutbox` there; an object implementing
    :class:`~msgsafe.ports.OutboxStore`: returned as it is. SQLite stores are shared
    within the process (:meth:`SqliteOutbox.shared`): two producers for one destination
    use one store; each closes it once. Whether the store is safe enough for the
    producer is :func:`msgsafe.checks.store.admit_store`'s to say, not this function's.
    """
    if spec is None or spec is False:
        return None
    if spec is True:
        return _open_default(destination_of(target, options), target.redacted())
    if is_store_url(spec):
        from msgsafe.outbox.postgres import PostgresOutbox  # the optional extra

        return PostgresOutbox.from_url(str(spec), target=target.redacted())
    if isinstance(spec, (str, os.PathLike)):
        return SqliteOutbox.shared(Path(os.fspath(spec)).expanduser(), target=target.redacted())
    if is_outbox_store(spec):
        # Its capabilities may be missing (a store written before they existed): it
        # then declares nothing optional (msgsafe.ports.store_capabilities).
        return spec
    raise ConfigurationError(
        f"outbox must be True, False, a path or an OutboxStore, not {type(spec).__name__}"
    )


def _open_default(destination: Destination, target: str) -> SqliteOutbox:
    directory = default_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise OutboxError(f"cannot create the outbox directory {directory}: {exc}") from exc
    with _open_lock:
        store = _first_free_slot(destination, target, directory)
        if store not in _adopted:
            _adopted.add(store)
            try:
                adopt_strays(store, destination, directory)
            except BaseException:
                store.close()
                raise
    return store


def _first_free_slot(destination: Destination, target: str, directory: Path) -> SqliteOutbox:
    for slot in range(SLOTS):
        path = slot_path(destination, slot, directory)
        try:
            store = SqliteOutbox.shared(path, target=target)
        except OutboxLocked:
            continue
        if slot:
            log.info(
                "the default outbox of %s is in use by another process; this one uses %s",
                destination,
                path,
            )
        return store
    raise OutboxLocked(
        f"all {SLOTS} default outbox files of {destination} are in use by other "
        f"processes (in {directory}); give this producer its own outbox=PATH"
    )
