"""kafka-python's producer tests (Apache-2.0), against :mod:`msgsafe.compat.kafka_python`.

The unit tests (``test/producer/test_producer.py``, ``test_kip679_config.py``) and the
integration producer tests (``test/integration/test_producer_integration.py``, which
find their broker through ``KAFKA_VERSION`` / ``KAFKA_URI``: the started one). The
import swap is done by the harness's conftest on the wrapper side (``kafka.KafkaProducer``
becomes the wrapper before any test module or kafka-python's own conftest imports it).
"""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

_PRIVATE = "reads or replaces kafka-python's private internals"

#: Written next to the tests on both sides; swaps the producer on the wrapper side only.
_CONFTEST = """\
import pathlib
import warnings

if pathlib.Path(__file__).parent.name == "wrapper":
    import kafka

    from msgsafe.compat.kafka_python import KafkaProducer

    kafka.KafkaProducer = KafkaProducer

warnings.simplefilter("ignore", DeprecationWarning)
"""

SUITE = Suite(
    name="kafka-python",
    broker="kafka",
    repo="dpkp/kafka-python",
    # Tag 3.0.11 (the installed 3.0.12 differs in consumer, admin and SASL code only).
    commit="46b2c48ce456b918445c40ef2373ba2239c62ba6",
    test_files=(
        "test/producer/test_producer.py",
        "test/producer/test_kip679_config.py",
        "test/integration/test_producer_integration.py",
    ),
    support=(
        "test/__init__.py",
        "test/conftest.py",
        "test/testutil.py",
        "test/mock_broker.py",
        "test/service.py",
        "test/producer/__init__.py",
        "test/integration/__init__.py",
        "test/integration/conftest.py",
        "test/integration/fixtures.py",
    ),
    edits=(
        # The integration fixtures use an external broker named by KAFKA_URI.
        (
            "import platform\nimport time\n",
            "import os\nos.environ.setdefault('KAFKA_URI', 'kafka://{address}')\n"
            "import platform\nimport time\n",
        ),
    ),
    swap=(),
    set_aside={
        "test_kafka_producer_thread_close": "counts the sender threads of kafka-python",
        "test_kafka_producer_context_manager_closes_on_exit": "reads producer._closed",
        "test_partition_calls_partitioner_partition_with_cluster": _PRIVATE,
        "test_partition_explicit_partition_skips_partitioner": _PRIVATE,
        "test_partition_explicit_partition_rejects_unknown_partition": _PRIVATE,
        "test_send_null_key_triggers_on_new_batch_via_abort_retry": _PRIVATE,
        "test_send_keyed_skips_on_new_batch": _PRIVATE,
        "test_send_with_explicit_partition_skips_on_new_batch": _PRIVATE,
        "test_idempotent_producer_reset_producer_id": "tests kafka-python's TransactionManager",
        "TestDefaultsAreIdempotent": "reads producer._transaction_manager",
        "TestDefaultIdempotenceSilentDisable": "reads producer._transaction_manager",
        "TestOldBrokerFallback": "reads producer._transaction_manager",
        "TestExplicitIdempotenceConflicts::test_acks_all_string_accepted": (
            "reads producer._transaction_manager"
        ),
    },
    intended={
        "test_producer_integration::test_kafka_producer_proper_record_metadata[None]": (
            "partition= and timestamp_ms= are ignored (placed by key, stamped at send)"
        ),
        "test_producer_integration::test_kafka_producer_proper_record_metadata[gzip]": (
            "partition= and timestamp_ms= are ignored (placed by key, stamped at send)"
        ),
        "test_producer_integration::test_kafka_producer_proper_record_metadata[snappy]": (
            "partition= and timestamp_ms= are ignored (placed by key, stamped at send)"
        ),
        "test_producer_integration::test_kafka_producer_proper_record_metadata[lz4]": (
            "partition= and timestamp_ms= are ignored (placed by key, stamped at send)"
        ),
        "test_producer_integration::test_kafka_producer_proper_record_metadata[zstd]": (
            "partition= and timestamp_ms= are ignored (placed by key, stamped at send)"
        ),
        "test_producer_integration::test_idempotent_producer_high_throughput": (
            "partition=0 is ignored: 500 keyless messages spread over the partitions"
        ),
        "test_producer_integration::test_transactional_producer_messages": (
            "transactional_id is refused: msgsafe's transactional outbox replaces it"
        ),
        "test_producer_integration::test_transactional_producer_offsets": (
            "transactional_id is refused: msgsafe's transactional outbox replaces it"
        ),
    },
    conftest=_CONFTEST,
    # KAFKA_VERSION turns the integration tests on; their fixture class insists on a
    # KAFKA_ROOT directory even for an external broker (it starts none).
    env={"KAFKA_VERSION": "4.1.2", "KAFKA_ROOT": "/"},
)
