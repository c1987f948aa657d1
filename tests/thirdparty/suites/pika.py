"""pika's acceptance tests of ``BlockingConnection`` (BSD-3-Clause), against
:mod:`msgsafe.compat.pika`."""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

_PIKA_CONFTEST = '''\
"""Harness: BlockingTestCaseBase without pika's private instrumentation.

Upstream _connect_params passes _impl_class and arms a test timer and an exception-leak
probe on connection._impl (pika's private SelectConnection); neither exists behind
another BlockingConnection, so both sides run without them.
"""


def pytest_collection_modifyitems(session, config, items):
    for module in {item.module for item in items}:
        base = getattr(module, "BlockingTestCaseBase", None)
        if base is None:
            continue

        def _connect_params(self, parameters, connection_class=None, impl_class=None):
            connection = (connection_class or module.pika.BlockingConnection)(parameters)
            self.addCleanup(lambda: connection.close() if connection.is_open else None)
            return connection

        base._connect_params = _connect_params
        base._instrument_io_loop_exception_leak_detection = lambda self, connection: None
'''

#: pika's acceptance tests: what each set-aside test reads of pika's private state.
_PIKA_PRIVATE = {
    "TestCreateAndCloseConnection": "asserts connection._impl.is_closing",
    "TestCreateConnectionFromTwoConfigsFirstUnreachable": "reads connection._impl.params",
    "TestMultiCloseConnectionRaisesWrongState": "asserts connection._impl.is_closing",
    "TestLostConnectionResultsInIsClosedConnectionAndChannel": "shuts _impl._transport._sock",
    "TestCreateAndCloseConnectionWithChannelAndConsumer": "asserts _impl._channels",
    "TestSuddenBrokerDisconnectBeforeChannel": "asserts connection._impl._transport",
    "TestNoAccessToConnectionAfterConnectionLost": "asserts connection._impl._transport",
    "TestDisconnectDuringConnectionStart": "passes _impl_class (a SelectConnection subclass)",
    "TestDisconnectDuringConnectionTune": "passes _impl_class (a SelectConnection subclass)",
    "TestDisconnectDuringConnectionProtocol": "passes _impl_class (a SelectConnection subclass)",
    "TestConnectionRegisterForBlockAndUnblock": "calls _impl._process_frame",
    "TestBlockedConnectionTimeout": "calls connection._impl._on_connection_blocked",
    "TestAddTimeoutRemoveTimeout": "builds blocking_connection._TimerEvt",
    "TestRemoveTimeoutFromTimeoutCallback": "asserts connection._ready_events",
    "TestConnectionProperties": "asserts connection._impl.is_closing",
    "TestCreateAndCloseChannel": "asserts channel._impl.is_closing",
    "TestConfirmDeliveryAfterUnroutableMessage": "asserts channel._pending_events",
    "TestUnroutableMessagesReturnedInNonPubackMode": "asserts channel._pending_events",
    "TestUnroutableMessageReturnedInPubackMode": "asserts channel._pending_events",
    "TestBasicPublishDeliveredWhenPendingUnroutable": "asserts channel._pending_events",
    "TestPublishAndConsumeWithPubacksAndQosOfOne": "asserts channel._pending_events",
    "TestTwoBasicConsumersOnSameChannel": "asserts channel._pending_events",
    "TestBasicCancelPurgesPendingConsumerCancellationEvt": "polls channel._pending_events",
    "TestBasicPublishWithoutPubacks": "asserts channel._pending_events",
    "TestStartConsumingReturnsAfterCancelFromBroker": "asserts channel._consumer_infos",
    "TestNonPubAckPublishAndConsumeHugeMessage": "asserts channel._queue_consumer_generator",
    "TestNonPubAckPublishAndConsumeManyMessages": "asserts channel._queue_consumer_generator",
    "TestConsumeGeneratorInterruptedByCancelFromBroker": "asserts _queue_consumer_generator",
    "TestConsumeGeneratorCancelEncountersCancelFromBroker": "polls _queue_consumer_generator",
}


SUITE = Suite(
    name="pika",
    broker="rabbitmq",
    repo="pika/pika",
    commit="09682a233db3b2db02c93d9187f35eea885433b1",
    test_files=("tests/acceptance/blocking_adapter_test.py",),
    support=("tests/misc/test_utils.py", "tests/misc/forward_server.py"),
    edits=(
        ("{'port': 5672}", "{{'port': {port}}}"),
        # pika 1.4 (installed) names the module pika.compat; later pika pika._utils.
        ("from pika._utils import", "from pika.compat import"),
        ("import pika._utils\n", "import pika.compat\n"),
        ("pika._utils.", "pika.compat."),
    ),
    swap=(("import pika\nimport pika.exceptions\n", "import msgsafe.compat.pika as pika\n"),),
    set_aside=_PIKA_PRIVATE,
    intended={
        "TestTxCommit::test": "publishes to an exclusive queue, which is refused "
        "(UnsafeDestination behind NackError): it empties when its connection closes",
    },
    conftest=_PIKA_CONFTEST,
)
