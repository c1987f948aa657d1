"""kombu's integration tests on py-amqp (BSD-3-Clause): publishing through the publisher
:func:`msgsafe.compat.celery.install` gives a Celery app.

``install(app)`` routes the one ``producer.publish`` of Celery's task message; here the
swap routes every ``kombu.Producer.publish`` of the test module (``SimpleQueue``'s
included) to that publisher, with the arguments kombu got, so kombu's own publish /
consume tests check the message the wrapper builds: body, serializer, headers,
priority, TTL, exchange types, the failover host list. Consuming is kombu's. One
publisher per broker URL, ``require="any"``: kombu's tests publish to auto-delete
queues, which msgsafe refuses by default.
"""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

_ROUTE = '''import kombu


def _msgsafe_route_publish():
    """The harness: kombu.Producer.publish through msgsafe.compat.celery's publisher."""
    import tempfile

    import celery
    import kombu.messaging

    from msgsafe.compat import celery as msgsafe_celery

    publishers = dict()  # no braces: the harness formats this text

    def publish(self, body, routing_key=None, delivery_mode=None, mandatory=False,
                immediate=False, priority=0, content_type=None, content_encoding=None,
                serializer=None, headers=None, compression=None, exchange=None,
                retry=False, retry_policy=None, declare=None, expiration=None,
                timeout=None, confirm_timeout=None, **properties):
        uri = self.connection.as_uri(include_password=True)
        if self.connection.alt:
            uri = ";".join(self.connection.alt)
        publisher = publishers.get(uri)
        if publisher is None:
            app = celery.Celery("kombu-suite", broker=uri, set_as_current=False)
            outbox = tempfile.mkdtemp(prefix="kombu-suite-") + "/outbox.sqlite3"
            publisher = publishers[uri] = msgsafe_celery.install(
                app, outbox=outbox, require="any"
            )
        declare = list(declare or [])
        if self.auto_declare and self.exchange.name and self.exchange not in declare:
            declare.append(self.exchange)
        publisher.publish(
            body,
            exchange=exchange or self.exchange,
            routing_key=self.routing_key if routing_key is None else routing_key,
            headers=headers,
            declare=declare,
            delivery_mode=delivery_mode,
            priority=priority,
            content_type=content_type,
            content_encoding=content_encoding,
            serializer=serializer or self.serializer,
            compression=compression or self.compression,
            expiration=expiration,
            **properties,
        )

    kombu.messaging.Producer.publish = publish


_msgsafe_route_publish()
'''

#: NOTE: ``test_publish_requeue_consume`` leaves its messages unacknowledged in a durable
#: queue, and the second side runs on the same broker: it would find the first side's.
_FRESH_QUEUE = '''@pytest.fixture(scope="session", autouse=True)
def _harness_fresh_requeue_queue():
    """The harness: the queue a test of the other side left messages in, deleted."""
    with get_connection("127.0.0.1", "{port}", None) as conn:
        kombu.Queue("priority_requeue_test")(conn.default_channel).delete()
    yield


@pytest.fixture()
def invalid_connection():'''

SUITE = Suite(
    name="kombu",
    broker="rabbitmq",
    repo="celery/kombu",
    commit="9ee8595b835c77b4f04cfb54b40b5d446f985a35",
    test_files=("t/integration/test_py_amqp.py",),
    support=("t/__init__.py", "t/integration/__init__.py", "t/integration/common.py"),
    edits=(
        ("os.environ.get('RABBITMQ_HOST', 'localhost')", "'127.0.0.1'"),
        ("os.environ.get('RABBITMQ_5672_TCP', '5672')", "'{port}'"),
        ('os.environ.get("RABBITMQ_HOST", "localhost")', "'127.0.0.1'"),
        ('os.environ.get("RABBITMQ_5672_TCP", "5672")', "'{port}'"),
        ("@pytest.fixture()\ndef invalid_connection():", _FRESH_QUEUE),
    ),
    swap=(("import kombu\n", _ROUTE),),
    set_aside={},
    intended={},
    pytest_args=(
        "-o",
        "python_classes=test_*",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
    ),
)
