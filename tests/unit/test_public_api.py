"""The public surface is deliberate: this test pins it."""

from __future__ import annotations

import msgsafe
import msgsafe.errors
import msgsafe.testing


def test_top_level_names() -> None:
    assert msgsafe.__all__ == sorted(msgsafe.__all__)
    assert msgsafe.__all__ == [
        "AsyncProducer",
        "Consumer",
        "Delivery",
        "Envelope",
        "Message",
        "MsgsafeError",
        "Outcome",
        "Producer",
        "Receipt",
        "RetryPolicy",
        "Status",
        "__version__",
        "errors",
        "new_message_id",
    ]
    for name in msgsafe.__all__:
        assert hasattr(msgsafe, name), name


def test_error_names() -> None:
    assert msgsafe.errors.__all__ == sorted(msgsafe.errors.__all__)
    assert set(msgsafe.errors.__all__) >= {
        "MsgsafeError",
        "TransientError",
        "PermanentError",
        "ConfigurationError",
        "MissingExtra",
        "ClosedError",
        "MessageTooLarge",
        "InvalidMessage",
        "SendTimeout",
        "ConfirmTimeout",
        "ConnectError",
        "ConnectionLost",
        "Refused",
        "Rejected",
        "Unroutable",
        "AuthenticationError",
        "OutboxError",
        "OutboxFull",
        "OutboxCorrupt",
        "OutboxLocked",
    }


def test_status_values() -> None:
    assert {s.name for s in msgsafe.Status} == {"CONFIRMED", "STORED"}


def test_testing_exports_memory_broker() -> None:
    assert "MemoryBroker" in msgsafe.testing.__all__
