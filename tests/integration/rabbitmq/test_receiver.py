"""Consuming on the real cluster: manual ack, redelivery, requeue, dead-lettering,
exchange bindings, re-subscribe after the consumer's node dies, paused node skipped."""

from __future__ import annotations

import time
import uuid

import pika
import pytest

from msgsafe.adapters import open_receiver, open_transport
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.message import Delivery, Envelope
from msgsafe.ports import Receiver
from tests.fixtures.rabbitmq import RabbitUrls

pytestmark = pytest.mark.integration


def _receive(receiver: Receiver, n: int, timeout: float = 30.0) -> list[Delivery]:
    out: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += receiver.receive(max_messages=n - len(out), timeout=0.5)
    assert len(out) == n, f"received {len(out)} of {n}"
    return out


def _send(url: str, destination: str, count: int, **options: object) -> list[str]:
    t = open_transport(parse_url(url), dict(options))
    try:
        envs = [Envelope.build(destination, f"m{i}".encode(), key="k") for i in range(count)]
        futures = [t.publish(e) for e in envs]
        for f in futures:
            f.result(20)
        return [e.message_id for e in envs]
    finally:
        t.close(5)


def test_ack_requeue_redelivered(rabbit_urls: RabbitUrls) -> None:
    queue = f"rq-{uuid.uuid4().hex[:8]}"
    ids = _send(rabbit_urls.cluster, queue, 1, declare="quorum")
    r = open_receiver(parse_url(rabbit_urls.cluster), {"prefetch": 10})
    try:
        r.subscribe(queue)
        (first,) = _receive(r, 1)
        assert first.message_id == ids[0]
        assert first.key == b"k"
        assert first.headers["msgsafe-id"] == ids[0]
        assert not first.redelivered
        first.nack(requeue=True)
        (again,) = _receive(r, 1)
        assert again.message_id == ids[0] and again.redelivered
        again.ack()
        assert r.receive(max_messages=1, timeout=1.0) == []
    finally:
        r.close()


def test_reject_dead_letters(rabbit_urls: RabbitUrls) -> None:
    queue, dlq = f"dl-{uuid.uuid4().hex[:8]}", f"dlq-{uuid.uuid4().hex[:8]}"
    params = pika.URLParameters(rabbit_urls.amqp[0])
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare(
        queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    conn.close()
    ids = _send(rabbit_urls.cluster, queue, 1)
    r = open_receiver(parse_url(rabbit_urls.cluster), {})
    try:
        r.subscribe(queue)
        (d,) = _receive(r, 1)
        d.nack(requeue=False)
        r.subscribe(dlq)
        (dead,) = _receive(r, 1)
        assert dead.message_id == ids[0]
        dead.ack()
    finally:
        r.close()


def test_exchange_binding_with_group(rabbit_urls: RabbitUrls) -> None:
    key = f"rk-{uuid.uuid4().hex[:8]}"
    group = f"grp-{uuid.uuid4().hex[:8]}"
    r = open_receiver(parse_url(rabbit_urls.cluster), {"declare": "quorum"}, group=group)
    try:
        r.subscribe(f"amq.direct/{key}")
        # The binding exists once the queue receives; publish until the first arrives.
        ids: list[str] = []
        got: list[Delivery] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            t = open_transport(parse_url(rabbit_urls.cluster), {})
            try:
                env = Envelope.build(f"amq.direct/{key}", b"x")
                try:
                    t.publish(env).result(10)
                    ids.append(env.message_id)
                except Exception:
                    pass  # unroutable until the binding is in place
            finally:
                t.close(2)
            got = r.receive(max_messages=1, timeout=0.5)
        assert got and got[0].message_id in ids
        assert got[0].destination == f"amq.direct/{key}"
        got[0].ack()
    finally:
        r.close()


def test_resubscribe_after_consumer_node_killed(rabbit: RabbitCluster) -> None:
    queue = f"resub-{uuid.uuid4().hex[:8]}"
    victim = 2
    others = [i for i in range(rabbit.size) if i != victim]
    first = _send(rabbit.cluster_url(others), queue, 10, declare="quorum")
    r = open_receiver(parse_url(rabbit.cluster_url([victim, *others])), {"heartbeat": 2})
    try:
        r.subscribe(queue)
        for d in _receive(r, 10):
            d.ack()
        rabbit.kill(victim)
        second = _send(rabbit.cluster_url(others), queue, 10)
        seen: list[Delivery] = []
        deadline = time.monotonic() + 60
        while not set(second) <= {d.message_id for d in seen} and time.monotonic() < deadline:
            for d in r.receive(max_messages=20, timeout=0.5):
                d.ack()
                seen.append(d)
        ids = {d.message_id for d in seen}
        assert set(second) <= ids, "the receiver did not resubscribe after fail-over"
        # Acks in flight when the node died may be lost: those come again, redelivered.
        again = [d for d in seen if d.message_id in set(first)]
        assert all(d.redelivered for d in again)
        assert ids <= set(first) | set(second)
    finally:
        r.close()


def test_stopped_node_is_skipped(rabbit: RabbitCluster) -> None:
    """A node that refuses connections (as a paused minority node does) is skipped."""
    victim = 0
    rabbit.ctl(victim, "stop_app")
    url = parse_url(rabbit.cluster_url())
    t = open_transport(url, {"connect_timeout": 5, "declare": "classic"})
    try:
        started = time.monotonic()
        assert t.publish(Envelope.build(f"skip-{uuid.uuid4().hex[:8]}", b"x")).result(10) is None
        assert time.monotonic() - started < 3, "the refusing node was not skipped at once"
    finally:
        t.close(2)
        rabbit.ctl(victim, "start_app")


#: Text headers of every shape a sender sets (a trace context among them).
_HEADERS: tuple[dict[str, str], ...] = (
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"a": "", "ünï": "çødé ✓", "tracestate": "k=v,x=y"},
    {"n" * 255: "v" * 3000},
    {},
)


def _pika_seen(url: str, queue: str, count: int) -> dict[str, tuple[object, ...]]:
    """What pika's consumer reads of ``count`` messages, by message id."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    seen: dict[str, tuple[object, ...]] = {}
    try:
        ch = conn.channel()
        deadline = time.monotonic() + 30
        while len(seen) < count and time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                conn.sleep(0.05)
                continue
            headers = dict(props.headers)
            headers.pop("x-delivery-count", None)  # what a quorum queue adds
            seen[props.message_id] = (body, headers, props.delivery_mode, props.timestamp)
        ch.queue_delete(queue)
    finally:
        conn.close()
    return seen


@pytest.mark.parametrize("writes", ["frames", "basic_publish"])
def test_headers_read_back_by_pika_and_msgsafe(
    writes: str, rabbit_urls: RabbitUrls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single messages with text headers: pika and msgsafe consumers read back exactly
    what was sent, whether the frame writer or pika's ``basic_publish`` wrote them (the
    two must be indistinguishable on the wire)."""
    from msgsafe.adapters.rabbitmq import _confirms as rabbit_confirms

    if writes == "basic_publish":
        monkeypatch.setattr(rabbit_confirms, "pika_emit", lambda conn: None)
    url = rabbit_urls.amqp[0]
    queues = [f"rh-{writes}-{i}-{uuid.uuid4().hex[:8]}" for i in range(2)]
    sent: dict[str, Envelope] = {}
    transport = open_transport(parse_url(url), {"declare": "quorum"})
    try:
        for queue in queues:
            envs = [
                Envelope.build(queue, f"b{i}".encode(), key=key, headers=headers)
                for i, (headers, key) in enumerate((h, k) for h in _HEADERS for k in (None, "clé"))
            ]
            for future in [transport.publish(e) for e in envs]:
                future.result(20)
            sent.update((e.message_id, e) for e in envs)
    finally:
        transport.close(5)

    by_pika = _pika_seen(url, queues[0], len(sent) // 2)
    receiver = open_receiver(parse_url(url), {"prefetch": 50})
    try:
        receiver.subscribe(queues[1])
        by_msgsafe = {d.message_id: d for d in _receive(receiver, len(sent) // 2)}
        for delivery in by_msgsafe.values():
            delivery.ack()
    finally:
        receiver.close()
    assert set(by_pika) | set(by_msgsafe) == set(sent)  # none lost, none unknown
    for mid, (body, headers, mode, stamp) in by_pika.items():
        env = sent[mid]
        expected: dict[str, object] = {**env.headers, "msgsafe-id": mid}
        if env.key is not None:
            expected["msgsafe-key"] = env.key
        assert (body, headers, mode, stamp) == (env.body, expected, 2, int(env.created_at))
    for mid, delivery in by_msgsafe.items():
        env = sent[mid]
        assert (delivery.body, delivery.key) == (env.body, env.key)
        got = {k: v for k, v in delivery.headers.items() if k != "x-delivery-count"}
        assert got == {**env.headers, "msgsafe-id": mid}
