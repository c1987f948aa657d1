"""Stored messages follow the destination, not the URL's spelling, on a real RabbitMQ.

Every node of the session cluster sits behind a fault proxy. With all of them refusing,
messages are STORED under one spelling of the URL; then the URL is edited five ways (an
option added, ``localhost`` for ``127.0.0.1``, the hosts in another order, an option
moved from the query string to a keyword argument, the vhost left implicit): every
producer finds the same outbox with everything stored so far, and the last one, with the
brokers back, delivers all of it. Counted: every receipted id is consumed, lost 0.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.adapters import open_receiver
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.retry import RetryPolicy
from msgsafe.testing.faultproxy import FaultProxies
from tests.integration.rabbitmq._ledger import Ledger, consume_until, wait_for

pytestmark = pytest.mark.integration

FIRST = 300  #: stored under the first spelling
EACH = 50  #: stored under each further spelling while the brokers still refuse


def test_stored_messages_survive_five_respellings_of_the_url(
    rabbit_cluster: RabbitCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    queue = f"respell-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    upstreams = [("127.0.0.1", rabbit_cluster.port(i)) for i in range(rabbit_cluster.size)]
    with FaultProxies(upstreams, connect_timeout=2.0) as proxies:
        a, b, c = (proxy.port for proxy in proxies)
        user = "amqp://guest:guest@"
        first = (f"{user}127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}/%2F?declare=quorum", {})
        respelled: list[tuple[str, dict[str, object]]] = [
            (first[0] + "&confirm_timeout=6", {}),
            (f"{user}localhost:{a},localhost:{b},localhost:{c}/%2F?declare=quorum", {}),
            (
                f"{user}127.0.0.1:{c},127.0.0.1:{a},127.0.0.1:{b}/%2F"
                "?confirm_timeout=6&declare=quorum",
                {},
            ),
            (
                f"{user}127.0.0.1:{b},localhost:{c},127.0.0.1:{a}/%2F",
                {"declare": "quorum", "confirm_timeout": 6},
            ),
            # The last one forwards: the brokers are back by then.
            (f"{user}localhost:{c},127.0.0.1:{a},localhost:{b}?heartbeat=5", {"declare": "quorum"}),
        ]
        proxies.refuse()
        paths: set[Path] = set()
        started = time.monotonic()
        for index, (url, options) in enumerate([first, *respelled[:-1]]):
            producer = msgsafe.Producer(url, send_timeout=10, connect_timeout=1.0, **options)  # type: ignore[arg-type]
            try:
                assert producer.pending() == len(ledger.receipted), (
                    f"spelling {index} does not see what was stored before: {url}"
                )
                store = producer.outbox
                assert store is not None
                paths.add(store.path)  # type: ignore[attr-defined]
                for i in range(FIRST if index == 0 else EACH):
                    receipt = producer.send(queue, f"s{index}-{i}".encode(), key=f"k{i % 5}")
                    ledger.sent.add(receipt.message_id)
                    assert receipt.status is msgsafe.Status.STORED, receipt
                    ledger.receipted.add(receipt.message_id)
            finally:
                producer.close(10)
        stored_s = time.monotonic() - started
        assert paths and len(paths) == 1, f"one outbox for one destination, not {paths}"
        proxies.heal()
        url, options = respelled[-1]
        healed = time.monotonic()
        producer = msgsafe.Producer(
            url,
            send_timeout=10,
            connect_timeout=1.0,
            retry=RetryPolicy(initial=0.1, maximum=1.0),
            **options,  # type: ignore[arg-type]
        )
        try:
            assert producer.outbox is not None and producer.outbox.path in paths  # type: ignore[attr-defined]
            assert producer.pending() == len(ledger.receipted)
            wait_for(lambda: producer.pending() == 0, 120, "the outbox to drain")
            drained_s = time.monotonic() - healed
        finally:
            producer.close(10)
    receiver = open_receiver(parse_url(rabbit_cluster.cluster_url()), {"prefetch": 500})
    try:
        receiver.subscribe(queue)
        consume_until(receiver, ledger, expected=ledger.receipted, deadline_s=120)
    finally:
        receiver.close()
    print(f"{ledger.report('five respellings')} stored_s={stored_s:.1f} drained_s={drained_s:.1f}")
    assert len(ledger.receipted) == FIRST + 4 * EACH
    assert not ledger.lost
    assert not ledger.unknown
