"""Where the outbox lives: :func:`open_store` turns the producer's ``outbox=`` argument
into a store, and :func:`default_path` names the per-target file in the user's data
directory."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import platformdirs

from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConfigurationError, OutboxError
from msgsafe.outbox.sqlite import SqliteOutbox
from msgsafe.ports import OutboxStore

__all__ = ["OutboxSpec", "default_path", "open_store"]

#: ``True`` (default file), ``False``/``None`` (no outbox), a path, or a store object.
OutboxSpec = bool | str | os.PathLike[str] | OutboxStore | None

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_path(target: BrokerUrl) -> Path:
    """The outbox file for ``target``: under ``platformdirs.user_data_dir("msgsafe")``,
    named by a hash of the URL without credentials (so a password change keeps the file
    and no secret reaches the file name)."""
    redacted = target.redacted()
    digest = hashlib.sha256(redacted.encode()).hexdigest()[:16]
    label = _UNSAFE.sub("_", f"{target.scheme}_{','.join(map(str, target.endpoints))}")[:40]
    if target.protocol == "memory":
        label = _UNSAFE.sub("_", f"memory_{target.path}")[:40]
    return Path(platformdirs.user_data_dir("msgsafe")) / "outbox" / f"{label}-{digest}.sqlite3"


def open_store(spec: OutboxSpec, target: BrokerUrl) -> OutboxStore | None:
    """The outbox for ``target`` as ``spec`` selects it.

    ``True``: a :class:`SqliteOutbox` at :func:`default_path` (directory created);
    ``False``/``None``: no outbox; a path: a :class:`SqliteOutbox` there; an object
    implementing :class:`~msgsafe.ports.OutboxStore`: returned as it is. SQLite stores
    are shared within the process (:meth:`SqliteOutbox.shared`): two producers for one
    target use one store; each closes it once.
    """
    if spec is None or spec is False:
        return None
    if spec is True:
        path = default_path(target)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise OutboxError(f"cannot create the outbox directory {path.parent}: {exc}") from exc
        return SqliteOutbox.shared(path, target=target.redacted())
    if isinstance(spec, (str, os.PathLike)):
        return SqliteOutbox.shared(Path(os.fspath(spec)).expanduser(), target=target.redacted())
    if isinstance(spec, OutboxStore):
        return spec
    raise ConfigurationError(
        f"outbox must be True, False, a path or an OutboxStore, not {type(spec).__name__}"
    )
