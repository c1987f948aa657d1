"""confluent-kafka-python's producer tests (Apache-2.0), against
:mod:`msgsafe.compat.confluent_kafka`: ``Producer`` (``test_Producer.py``, the producer
tests of ``test_log.py`` and ``test_misc.py``) and ``AIOProducer``
(``test_AIOProducer.py``)."""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

#: pytest-asyncio is not a msgsafe dependency: the harness runs the ``asyncio``-marked
#: coroutine tests in a fresh event loop each, as its ``asyncio_mode = "auto"`` does.
_CONFTEST = '''\
"""Harness: coroutine tests run in a fresh event loop (pytest-asyncio's auto mode)."""

import asyncio
import inspect

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "asyncio: a coroutine test run in an event loop")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    args = {name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True
'''

#: ``test_AIOProducer.py`` tests that drive the real AIOProducer's private machinery
#: (its batch buffer, its timeout task, its executor helpers) or replace the
#: ``confluent_kafka.Producer`` it wraps with a Mock: the wrapper has none of them.
_AIO_PRIVATE = {
    "TestAIOProducer::test_constructor_behavior": "asserts _buffer_timeout_manager, _batch_size",
    "TestAIOProducer::test_call_method_executor_usage": "calls the private _call helper",
    "TestAIOProducer::test_produce_success": "patches _flush_buffer / _batch_processor",
    "TestAIOProducer::test_produce_error": "patches _flush_buffer / _batch_processor",
    "TestAIOProducer::test_produce_with_delayed_callback": "drives a Mock confluent_kafka.Producer",
    "TestAIOProducer::test_buffer_timeout_background_task": "asserts _buffer_timeout_manager",
    "TestAIOProducer::test_multiple_concurrent_produce": "drives a Mock confluent_kafka.Producer",
    "TestAIOProducer::test_constructor_new_implementation": "asserts _batch_processor, _loop",
    "TestAIOProducer::test_lifecycle_management_new_implementation": "patches _flush_buffer",
    "TestAIOProducer::test_buffer_timeout_task_management": "asserts _buffer_timeout_manager",
    "TestAIOProducer::test_buffer_timeout_behavior": "asserts _buffer_timeout_manager",
    "TestAIOProducer::test_poll_method_new_implementation": "patches the private _call helper",
    "TestAIOProducer::test_produce_method_batching": "patches _flush_buffer / _batch_processor",
    "TestAIOProducer::test_flush_and_purge_methods_new_implementation": "patches _call",
    "TestAIOProducer::test_group_messages_by_topic": "drives _batch_processor",
    "TestAIOProducer::test_error_handling_new_implementation": "drives _batch_processor",
    "TestAIOProducer::test_future_based_usage_pattern": "patches _flush_buffer",
    "TestAIOProducer::test_future_based_error_handling": "patches _flush_buffer",
    "TestAIOProducer::test_future_based_concurrent_usage": "patches _flush_buffer",
    "TestAIOProducer::test_edge_cases_batching": "patches _flush_buffer",
    "TestAIOProducer::test_aio_producer_len_with_buffered_messages": "patches _flush_buffer",
    "TestAIOProducer::test_aio_producer_len_after_flush": "patches _flush_buffer",
    "TestAIOProducer::test_aio_producer_len_closed_producer": "patches _flush_buffer",
    "TestAIOProducer::test_aio_producer_len_mixed_state": "patches _flush_buffer",
}

SUITE = Suite(
    name="confluent-kafka",
    broker="kafka",
    repo="confluentinc/confluent-kafka-python",
    # v2.15.0; the tests run against the installed confluent-kafka 2.16.1.
    commit="8b1c7a613434eee3d0e1287d624d7af04932f410",
    test_files=(
        "tests/test_Producer.py",
        "tests/test_log.py",
        "tests/test_misc.py",
        "tests/test_AIOProducer.py",
    ),
    support=("tests/common/__init__.py", "tests/common/schema_registry/__init__.py"),
    edits=(
        ("localhost:9092", "{address}"),
        # The avro extra (avro, requests) is not a msgsafe dependency: without it the
        # one test that makes an AvroProducer gets the ImportError it skips on, and the
        # avro logging tests of test_log.py fail alike on both sides.
        (
            "from confluent_kafka.avro import AvroProducer\n",
            "try:\n    from confluent_kafka.avro import AvroProducer\n"
            "except ImportError as _no_avro:\n"
            "    def AvroProducer(*args, _exc=_no_avro, **kwargs):\n"
            "        raise ImportError(str(_exc))\n",
        ),
        (
            "import confluent_kafka.avro\n",
            "try:\n    import confluent_kafka.avro\nexcept ImportError:\n    pass\n",
        ),
        (
            "from tests.common.schema_registry import TestAvroConsumer\n",
            "try:\n    from tests.common.schema_registry import TestAvroConsumer\n"
            "except ImportError:\n    TestAvroConsumer = None\n",
        ),
    ),
    swap=(
        (
            "from confluent_kafka import Consumer, KafkaError, KafkaException, Producer,"
            " SerializingProducer, TopicPartition\n",
            "from confluent_kafka import Consumer, KafkaError, KafkaException,"
            " SerializingProducer, TopicPartition\n"
            "from msgsafe.compat.confluent_kafka import Producer\n",
        ),
        (
            "from confluent_kafka import Consumer, Producer\n",
            "from confluent_kafka import Consumer\n"
            "from msgsafe.compat.confluent_kafka import Producer\n",
        ),
        # test_log.py / test_misc.py name the producer as confluent_kafka.Producer.
        (
            "import confluent_kafka\n",
            "import confluent_kafka\nimport msgsafe.compat.confluent_kafka as _msgsafe_ck\n",
        ),
        ("confluent_kafka.Producer(", "_msgsafe_ck.Producer("),
        (
            "from confluent_kafka.aio.producer._AIOProducer import AIOProducer\n",
            "from msgsafe.compat.confluent_kafka import AIOProducer\n",
        ),
    ),
    set_aside=_AIO_PRIVATE,
    intended={
        "test_Producer::test_transaction_api": "transactional.id is refused: msgsafe's "
        "transactional outbox replaces Kafka transactions",
    },
    conftest=_CONFTEST,
)
