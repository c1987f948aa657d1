"""aiokafka's producer tests (Apache-2.0), against :mod:`msgsafe.compat.aiokafka`."""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

#: aiokafka's tests/conftest.py starts a docker image (not available here, and needing the
#: ``docker`` package): this one gives its test classes the same attributes, pointed at
#: the broker the harness started. The image creates topics with two partitions
#: (``NUM_PARTITIONS=2``), which the tests count on; the harness broker has one by
#: default, so each test's topic (and the fixed names the tests use) is created with two.
_CONFTEST = '''\
"""Harness: aiokafka's test fixtures on the broker the harness started (see the suite)."""

import asyncio
import gc

import pytest

from msgsafe.cluster import kafka_admin
from msgsafe.cluster.kafka import VERSION

_FIXED_TOPICS = ("some_topic_name", "producer_flush_test", "XXXX")


def _two_partitions(bootstrap, name):
    kafka_admin.create_topic(bootstrap, name, 2, 1, timeout=60)


@pytest.fixture(scope="class")
def loop(request):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    if not loop.is_closed():
        loop.call_soon(loop.stop)
        loop.run_forever()
        loop.close()
    gc.collect()
    asyncio.set_event_loop(None)


@pytest.fixture(autouse=True)
def collect_garbage():
    yield
    gc.collect()


@pytest.fixture(scope="class")
def setup_test_class(request, loop):
    bootstrap = request.module.KAFKA_BOOTSTRAP
    host, port = bootstrap.rsplit(":", 1)
    for name in _FIXED_TOPICS:
        _two_partitions(bootstrap, name)
    cls = request.cls
    cls.loop = loop
    cls.kafka_host = host
    cls.kafka_port = int(port)
    cls.hosts = [bootstrap]
    cls.kafka_version = VERSION
    original = cls.setUp

    def set_up(self):
        original(self)
        _two_partitions(bootstrap, self.topic)

    cls.setUp = set_up
'''

#: Tests that drive the real client's private machinery (its sender, its metadata, its
#: network client, patched or read) or need the docker image's TLS listener.
_PRIVATE = {
    "TestKafkaProducerIntegration::test_producer_notopic": "patches AIOKafkaClient."
    "_metadata_update",
    "TestKafkaProducerIntegration::test_producer_context_manager": "asserts "
    "producer._sender._sender_task",
    "TestKafkaProducerIntegration::test_producer_send_leader_notfound": "patches "
    "ClusterMetadata.leader_for_partition",
    "TestKafkaProducerIntegration::test_producer_send_timeout": "patches producer.client.send",
    "TestKafkaProducerIntegration::test_producer_send_error": "patches producer.client.send",
    "TestKafkaProducerIntegration::test_producer_ssl": "needs the docker image's SSL "
    "listener and certificates",
    "TestKafkaProducerIntegration::test_producer_correct_time_returned": "patches "
    "producer.client.send",
    "TestKafkaProducerIntegration::test_producer_send_empty_batch": "replaces "
    "producer._sender._send_produce_req",
    "TestKafkaProducerIntegration::test_producer_send_reenque_resets_waiters": "patches "
    "producer.client.send",
    "TestKafkaProducerIntegration::test_producer_idempotence_configuration": "asserts "
    "producer._sender._acks and _txn_manager",
    "TestKafkaProducerIntegration::test_producer_indempotence_no_duplicates": "patches "
    "producer.client.send",
    "TestKafkaProducerIntegration::test_producer_invalid_leader_retry_metadata": "edits "
    "producer._metadata._partitions",
    "TestKafkaProducerIntegration::test_producer_leader_change_preserves_order": "edits "
    "producer._metadata and producer.client.send",
    "TestKafkaProducerIntegration::test_producer_sender_errors_propagate_to_producer": "patches "
    "producer._sender._send_produce_req",
}

#: An explicit partition is ignored (msgsafe places by key); acks are always "all".
_PARTITION = "send(partition=N) is ignored: msgsafe places a message by its key"

SUITE = Suite(
    name="aiokafka",
    broker="kafka",
    repo="aio-libs/aiokafka",
    commit="672947afe85c91b7d953f0259e69837a711d3246",  # v0.14.0, as installed
    test_files=("tests/test_producer.py",),
    support=("tests/_testutil.py",),
    edits=(
        (
            "LOG_APPEND_TIME = 1\n",
            "LOG_APPEND_TIME = 1\n\n# harness: the broker the suite runs on\n"
            'KAFKA_BOOTSTRAP = "{address}"\n',
        ),
    ),
    swap=(
        (
            "from aiokafka.producer import AIOKafkaProducer\n",
            "from msgsafe.compat.aiokafka import AIOKafkaProducer\n",
        ),
    ),
    set_aside=_PRIVATE,
    intended={
        "TestKafkaProducerIntegration::test_producer_send": _PARTITION,
        "TestKafkaProducerIntegration::test_producer_send_batch": _PARTITION,
        "TestKafkaProducerIntegration::test_producer_send_batch_with_serializer": _PARTITION
        + " (the two keys may land on two partitions, read in either order)",
        "TestKafkaProducerIntegration::test_producer_send_with_headers": _PARTITION,
        "TestKafkaProducerIntegration::test_producer_send_and_wait_with_headers": _PARTITION,
        "TestKafkaProducerIntegration::test_producer_send_noack": "acks=0 is overridden to "
        "acks='all': the future resolves to RecordMetadata, not None",
    },
    conftest=_CONFTEST,
)
