"""The public surface of msgsafe.outbox, pinned."""

from __future__ import annotations

import msgsafe.outbox


def test_exported_names() -> None:
    assert msgsafe.outbox.__all__ == [
        "Forwarder",
        "ForwarderStats",
        "OutboxEntry",
        "OutboxSpec",
        "PostgresOutbox",
        "QuarantinedEntry",
        "SqliteOutbox",
        "default_path",
        "open_store",
    ]
    for name in msgsafe.outbox.__all__:
        assert getattr(msgsafe.outbox, name) is not None


def test_store_methods_the_cli_uses() -> None:
    for cls in (msgsafe.outbox.SqliteOutbox, msgsafe.outbox.PostgresOutbox):
        for method in (
            "put",
            "claim",
            "delivered",
            "failed",
            "release",
            "has_key",
            "stats",
            "pending",
            "close",
            "list",
            "quarantined",
            "replay",
            "purge",
        ):
            assert callable(getattr(cls, method)), (cls, method)
    assert callable(msgsafe.outbox.PostgresOutbox.put_in)
