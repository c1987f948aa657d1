"""One :class:`~msgsafe.Producer` per executor process and configuration.

Spark runs many tasks, one after another, in each Python worker process; opening a
broker connection per task would dominate small batches. Producers are cached here by
``(url, outbox, options)`` and closed when the interpreter exits.

NOTE: PySpark may end a worker with ``os._exit`` (no ``atexit``); that is safe because
every task waits for all its confirmations before it returns, so nothing is in flight
between tasks. Messages a producer STORED stay in its outbox file and are forwarded by
the next producer that opens the file.

Outbox files belong to one process at a time (:class:`~msgsafe.errors.OutboxLocked`),
while several executors run on one machine. A sink's outbox is therefore a family of
*slots* ``NAME.spark-N.EXT``: each process takes the first free slot, so a later worker
reopens (and drains) the file a finished one left behind.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgsafe._callbacks import call_logged
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, OutboxError, OutboxLocked
from msgsafe.producer import Producer

__all__ = ["OUTBOX_SLOTS", "SinkOutbox", "close_all", "discard", "outbox_slot", "producer_for"]

log = logging.getLogger("msgsafe.spark")

#: The sink's ``outbox=``: ``False``/``None``, ``True`` (default file family), or a path.
SinkOutbox = bool | str | os.PathLike[str] | None

#: How many processes of one machine can hold an outbox slot of the same sink at once.
OUTBOX_SLOTS = 64

_lock = threading.Lock()
_producers: dict[tuple[str, str, tuple[tuple[str, str], ...]], Producer] = {}


def _cache_key(
    url: str, outbox: SinkOutbox, options: Mapping[str, object]
) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    where = repr(outbox if isinstance(outbox, (bool, type(None))) else os.fspath(outbox))
    return url, where, tuple(sorted((name, repr(value)) for name, value in options.items()))


def outbox_slot(url: str, outbox: SinkOutbox, slot: int) -> Path | None:
    """The outbox file of ``slot`` for this sink, or None without an outbox."""
    if outbox is None or outbox is False:
        return None
    if outbox is True:
        from msgsafe.outbox import default_path

        base = default_path(parse_url(url))
    elif isinstance(outbox, (str, os.PathLike)):
        base = Path(os.fspath(outbox)).expanduser()
    else:
        raise ConfigurationError(
            f"the Spark sink's outbox must be True, False or a path, not {type(outbox).__name__}"
        )
    suffix = base.suffix or ".sqlite3"
    return base.with_name(f"{base.stem}.spark-{slot}{suffix}")


def _open(url: str, outbox: SinkOutbox, options: Mapping[str, object]) -> Producer:
    kwargs: dict[str, Any] = dict(options)
    if outbox_slot(url, outbox, 0) is None:
        return Producer(url, outbox=False, **kwargs)
    for slot in range(OUTBOX_SLOTS):
        path = outbox_slot(url, outbox, slot)
        if path is None:  # pragma: no cover - excluded above
            break
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise OutboxError(f"cannot create the outbox directory {path.parent}: {exc}") from exc
        try:
            producer = Producer(url, outbox=path, **kwargs)
        except OutboxLocked:
            continue
        log.debug("executor %d uses outbox slot %d", os.getpid(), slot)
        return producer
    raise OutboxLocked(f"all {OUTBOX_SLOTS} outbox slots of this sink are held by other processes")


def producer_for(url: str, outbox: SinkOutbox, options: Mapping[str, object]) -> Producer:
    """The producer of this process for this configuration, opened on first use.

    Thread-safe. A producer closed by someone else is dropped with :func:`discard`.
    """
    key = _cache_key(url, outbox, options)
    with _lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _open(url, outbox, options)
            _producers[key] = producer
        return producer


def discard(producer: Producer) -> None:
    """Forget ``producer`` (found closed) so the next :func:`producer_for` opens a new one."""
    with _lock:
        for key, cached in list(_producers.items()):
            if cached is producer:
                del _producers[key]


def close_all(timeout: float | None = 30.0) -> None:
    """Close every cached producer of this process (waits for sends in flight)."""
    with _lock:
        producers = list(_producers.values())
        _producers.clear()
    for producer in producers:
        # At interpreter exit: one failing must not keep the others open.
        call_logged(log, f"closing {producer!r}", producer.close, timeout)
    from msgsafe.spark.kafka_fast import close_clients

    close_clients(30.0 if timeout is None else timeout)


atexit.register(close_all)
