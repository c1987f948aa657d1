"""The public surface is deliberate: this test pins it."""

from __future__ import annotations

import msgsafe
import msgsafe.errors
import msgsafe.testing


def test_top_level_names() -> None:
    assert msgsafe.__all__ == sorted(msgsafe.__all__)
    assert msgsafe.__all__ == [
        "AsyncConsumer",
        "AsyncDelivery",
        "AsyncProducer",
        "BatchPolicy",
        "Consumer",
        "Delivery",
        "Envelope",
        "Guarantee",
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
        "OutboxGone",
        "UnsafeOutbox",
    }


def test_status_values() -> None:
    assert {s.name for s in msgsafe.Status} == {"CONFIRMED", "STORED"}


def test_testing_exports_memory_broker() -> None:
    assert "MemoryBroker" in msgsafe.testing.__all__


def test_integration_import_paths() -> None:
    import importlib
    import importlib.metadata

    import msgsafe.spark

    pika = importlib.import_module("msgsafe.compat.pika")
    kafka = importlib.import_module("msgsafe.compat.confluent_kafka")
    assert pika.BlockingConnection.__module__ == "msgsafe.compat.pika"
    assert pika.ConnectionParameters.__module__.startswith("pika.")
    assert kafka.Producer.__module__ == "msgsafe.compat.confluent_kafka"
    assert kafka.KafkaError is importlib.import_module("confluent_kafka").KafkaError
    assert callable(msgsafe.spark.foreach_batch_sink)
    scripts = importlib.metadata.entry_points(group="console_scripts")
    (script,) = [ep for ep in scripts if ep.name == "msgsafe"]
    assert script.value == "msgsafe.cli:main"
    assert callable(script.load())


def test_renamed_spark_names_still_import_with_a_warning() -> None:
    import warnings

    import msgsafe.spark

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_failed = msgsafe.spark.BatchFailed
        old_report = msgsafe.spark.BatchReport
    assert old_failed is msgsafe.spark.SparkBatchFailed
    assert old_report is msgsafe.spark.SparkBatchReport
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert old_failed is not msgsafe.errors.BatchFailed
